"""Sweeps (``dpsub-train -m``): bad jobs found up front, a failing job does not stop the
others, and an interrupted sweep continues (docs/sweeps.md)."""

from __future__ import annotations

from conftest import cli_in_process
from helpers.sweeps import SMALL


def test_a_job_without_its_data_fails_the_sweep_before_any_job_starts(tmp_path):
    """Issue 19.4: the CIFAR-10 job stopped the sweep and the digits job never ran."""
    sweep = tmp_path / "sweep"
    proc = cli_in_process(
        "-m", "dataset=cifar10,digits,fashion_mnist", *SMALL, f"data.root={tmp_path / 'none'}",
        f"hydra.sweep.dir={sweep}", check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, lines  # one per failing job, then the count
    assert (
        lines[0].startswith("dpsub: sweep job 0 (dataset=cifar10): ") and "data_batch_1" in lines[0]
    )
    assert (
        lines[1].startswith("dpsub: sweep job 2 (dataset=fashion_mnist): ")
        and "FashionMNIST" in lines[1]
    )
    assert "2 of 3 sweep jobs are invalid; no job was started" in lines[2]
    assert "Traceback" not in proc.stderr and not sweep.exists()


def test_continuing_a_sweep_refuses_overrides_that_change_its_runs(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra.mode=MULTIRUN]\n    task: ['seed=0,1']\n"
    )
    proc = cli_in_process(f"resume={sweep}", "privacy.epsilon=9", check=False, timeout=120)
    assert proc.returncode == 2 and "privacy.epsilon=9" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_job_another_process_is_training_is_skipped_not_recorded_failed(tmp_path, caplog):
    """Two sweeps over one table (two lanes): the job the other holds is left to it, with a
    warning; it is not a failure (no failed-jobs record, no ERROR line)."""
    from dpsub.cli import sweeps
    from dpsub.training.checkpoint import lock_run_dir

    run_dir = tmp_path / "job"
    run_dir.mkdir()
    release = lock_run_dir(run_dir, "out_dir")  # the other lane's training process
    try:
        with caplog.at_level("INFO", logger=sweeps.log.name):
            got = sweeps.run_job(None, run_dir, lambda c, d, r: lock_run_dir(d, "out_dir"), "j")
    finally:
        release()
    assert got != got  # nan: no accuracy
    assert not list(tmp_path.rglob(sweeps.FAILED))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "in use by another process" in caplog.records[0].getMessage()


def test_a_job_that_began_resumes_even_without_a_checkpoint(tmp_path):
    """Issue 36.2: a secure job killed before its first checkpoint ran again as a new run,
    its ledger forgetting the releases the killed attempt made."""
    from dpsub.cli import sweeps

    resumed = []
    job = tmp_path / "job"
    sweeps.run_job(None, job, lambda c, d, r: resumed.append(r) or 1.0, "j")  # new: fresh
    job.mkdir()
    (job / "ledger.json").write_text("{}")  # began, stopped before its first checkpoint
    sweeps.run_job(None, job, lambda c, d, r: resumed.append(r) or 1.0, "j")
    assert resumed == [False, True]
