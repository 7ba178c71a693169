"""Sweeps with a failing job (slow: each invocation imports torch): the sequential launcher's
record and resume, and joblib's sibling job."""

from __future__ import annotations

import json

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


def test_a_failing_job_is_recorded_the_others_finish_and_the_sweep_continues(tmp_path):
    """Issue 19.4: job 0 fails after it started (batch larger than the data), job 1 still
    runs; ``resume=<sweep dir>`` skips the finished job and resumes a checkpointed one."""
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "train.batch_size=5000,64", *SMALL, f"hydra.sweep.dir={sweep}", check=False
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "sweep: 2 jobs -> " in proc.stdout  # the plan comes first
    failed = [json.loads(ln) for ln in (sweep / "failed_jobs.jsonl").read_text().splitlines()]
    assert [f["job"].split(" (")[0] for f in failed] == ["job 0"] and failed[0]["exit"] == 2
    assert "train.batch_size" in failed[0]["error"]
    assert f"resume={sweep}" in proc.stderr.strip().splitlines()[-1]
    jobs = job_dirs(sweep)
    assert set(jobs) == {"1"} and (jobs["1"] / "summary.json").is_file()

    # continue, with a setting a resume may change (issue 36.3: it re-ran every job in new
    # dirs): the finished job is skipped (untouched), the failing one runs (and fails) again
    before = (jobs["1"] / "summary.json").stat().st_mtime_ns
    again = run_cli(f"resume={sweep}", "train.log_every=5", check=False)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "finished earlier" in again.stdout + again.stderr
    assert (jobs["1"] / "summary.json").stat().st_mtime_ns == before
    assert job_dirs(sweep) == jobs

    # a job with a checkpoint but no summary (interrupted) resumes from it, in its own dir
    (jobs["1"] / "summary.json").unlink()
    run_cli(f"resume={sweep}", "train.log_every=1", check=False)
    assert (jobs["1"] / "summary.json").is_file() and job_dirs(sweep) == jobs
    assert f"resumed {jobs['1']} at step 2" in (jobs["1"] / "train.log").read_text()
