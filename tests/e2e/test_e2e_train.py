"""Whole training runs through the CLI: kill and resume, sweeps in one folder (slow)."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from conftest import run_cli
from helpers.runs import (
    RESUME_RUNS,
    check_kill_and_resume,
    kill_mid_run,
    logged_steps,
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


def test_secure_mode_resume_charges_the_lost_steps_again(tmp_path, references):
    """os.urandom noise cannot be replayed: the steps after the checkpoint are new releases."""
    overrides = (*RESUME_RUNS["dpsgd"], "privacy.rng=secure")
    run_dir = tmp_path / "secure"
    killed_at = kill_mid_run(run_dir, overrides, signal.SIGKILL)
    journal = json.loads((run_dir / "ledger.json").read_text())
    charged = sum(n for _, _, n in journal["history"])
    assert charged >= max(logged_steps(run_dir))  # persisted before each release left
    assert charged > killed_at
    run_cli(f"resume={run_dir}", check=True)
    final = json.loads((run_dir / "summary.json").read_text())
    ledger = torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"]["ledger"]
    assert sum(n for _, _, n in ledger["history"]) > final["steps"]  # over-counted, never under
    assert final["epsilon"] > references("dpsgd").epsilon or final["stopped_by_budget"]
