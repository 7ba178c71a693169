"""An audit of a nonlinear release by real replays (slow)."""

from __future__ import annotations

from dpsub.audit.whitebox import WhiteboxOptions, whitebox_audit
from dpsub.training.build import build_run

from conftest import compose_cfg
from helpers.audit import TINY


def test_nonlinear_release_is_audited_by_real_replays() -> None:
    run = tiny_run("privacy.noise_multiplier=1.0", "mechanism=dppowersgd", "mechanism.rank=2")
    report = whitebox_audit(run, WhiteboxOptions(direct_trials=40))
    assert report["trials"] == {"in": 40, "out": 40, "mode": "sampled"}
    assert report["lower_bound"]["epsilon"] <= report["epsilon_upper"]


def tiny_run(*overrides: str):
    return build_run(compose_cfg(*TINY, *overrides))
