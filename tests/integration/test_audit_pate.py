"""White-box audit of PATE's aggregators (docs/audit.md, section 3; issue 23, done-when 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpsub.audit import aggregator as audit_agg
from dpsub.audit.aggregator import AggregatorAuditOptions, audit_aggregator, neighbours
from dpsub.pate.aggregators import GNMax

#: one GNMax query at sigma 4 (votes' L2 sensitivity sqrt 2): the ledger charges epsilon 1.48
OPTS = AggregatorAuditOptions(leads=tuple(range(25, 45)), pilot_trials=10_000, trials=200_000)
GNMAX = {"aggregator": "gnmax", "sigma2": 4.0}


class HalfNoiseGNMax(GNMax):
    """Draws half the noise while its records (the ledger's charge) say sigma."""

    def noisy_counts(self, counts, rng):
        return counts + rng.normal(0.0, 0.5 * self.sigma, size=counts.shape)


def test_neighbours_differ_in_one_teachers_vote():
    h, h2 = neighbours(50, 10, 30)
    assert h.sum() == h2.sum() == 50 and np.abs(h - h2).sum() == 2 and h[0] - h2[0] == 1


def test_gnmax_lower_bound_stays_below_the_ledgers_epsilon():
    r = audit_aggregator(GNMAX, OPTS, 1e-5)
    assert r["epsilon_upper"] == pytest.approx(1.478, abs=1e-3)
    assert 0.5 < r["lower_bound"]["epsilon"] < r["epsilon_upper"]
    assert r["lower_bound"]["n_in"] == r["lower_bound"]["n_out"] == OPTS.trials


def test_half_noise_aggregator_is_caught_above_its_claimed_epsilon(monkeypatch):
    monkeypatch.setattr(audit_agg, "build_aggregator", lambda o: HalfNoiseGNMax(o["sigma2"]))
    r = audit_aggregator(GNMAX, OPTS, 1e-5)
    assert r["lower_bound"]["epsilon"] > r["epsilon_upper"]


@pytest.mark.parametrize(
    "agg", [{"aggregator": "lnmax", "laplace_scale": 2.0},
            {"aggregator": "confident", "sigma1": 4.0, "sigma2": 4.0, "threshold": 35.0}],
)  # fmt: skip
def test_lnmax_and_confident_bounds_stay_below(agg):
    opts = AggregatorAuditOptions(leads=tuple(range(25, 51, 2)), pilot_trials=4000, trials=50_000)
    r = audit_aggregator(agg, opts, 1e-5)
    assert 0 < r["lower_bound"]["epsilon"] < r["epsilon_upper"]


def test_dpsub_audit_pate_writes_audit_json_and_bad_option_is_one_line(tmp_path, capsys):
    from dpsub.cli.audit import run_audit
    from dpsub.config import compose

    base = ["audit=pate", "audit.leads=[30,34]", "audit.pilot_trials=500", "audit.trials=2000",
            "logger=disabled"]  # fmt: skip
    report = run_audit(compose(base, config_name="dpsub_audit"), tmp_path / "a")
    saved = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert saved["kind"] == "pate" and saved["lower_bound"] == report["lower_bound"]
    line = (tmp_path / "a" / "train.log").read_text().strip().splitlines()[-1]
    assert "audit: pate gnmax | lower bound" in line
    assert line.endswith(f"| run dir {tmp_path / 'a'}")  # where it wrote (issue 36)
    with pytest.raises(SystemExit) as e:
        run_audit(compose([*base, "audit.sigma2=-1"], config_name="dpsub_audit"), tmp_path / "b")
    assert e.value.code == 2 and "audit.sigma2" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
