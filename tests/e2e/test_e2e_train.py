"""Whole training runs through the CLI: kill and resume, sweeps in one folder (slow)."""

from __future__ import annotations

import json
import signal

import pytest

from conftest import run_cli
from helpers.runs import (
    check_kill_and_resume,
)


@pytest.mark.parametrize("mech,sig", [("gep", signal.SIGKILL)])  # the hardest case; the others: e2e
def test_kill_and_resume_reaches_the_same_run(tmp_path, references, mech, sig):
    check_kill_and_resume(tmp_path, references(mech), mech, sig)


# --------------------------------------------------------------- multirun
def test_multirun_is_one_sweep_in_one_folder(tmp_path):
    """(Sweeping experiments themselves is run by tests/integration/test_readme.py.)"""
    run_cli(
        "-m",
        "experiment=demo",
        "privacy.epsilon=1,4",
        "train.max_steps=3",
        "train.eval_every=0",
        f"hydra.sweep.dir={tmp_path}",
    )
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(jobs) == 2 and all((p / "summary.json").exists() for p in jobs)
    assert (tmp_path / "multirun.yaml").exists()
    eps = sorted(json.loads((p / "summary.json").read_text())["epsilon"] for p in jobs)
    assert eps[0] <= 1.0 < eps[1] <= 4.0
