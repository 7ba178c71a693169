"""A joblib sweep with a failing job (slow: two workers each import torch)."""

from __future__ import annotations

from conftest import run_cli
from helpers.sweeps import SMALL, job_dirs


def test_with_joblib_a_failing_job_leaves_its_sibling_running(tmp_path):
    """Issue 19.4: with joblib the sibling job was lost and only multirun.yaml remained."""
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "hydra/launcher=local", "train.batch_size=5000,64", *SMALL,
        f"hydra.sweep.dir={sweep}", check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (job_dirs(sweep)["1"] / "summary.json").is_file()
    assert "job 0" in (sweep / "failed_jobs.jsonl").read_text()
