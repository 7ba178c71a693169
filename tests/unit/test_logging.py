"""Tests of dpsub.tracking: metrics.jsonl and the offline W&B transaction log."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from dpsub.tracking import RunLogger, read_metrics
from dpsub.tracking.run_logger import _wait_for_exit_record

CONF = Path(__file__).resolve().parents[2] / "conf"


def _logger_cfg(mode: str):
    """The ``logger`` group as conf/logger/wandb.yaml has it, with ``mode`` set."""
    cfg = OmegaConf.load(CONF / "logger" / "wandb.yaml")
    cfg.mode = mode
    return cfg


def test_offline_run_is_on_disk_when_close_returns(tmp_path: Path, monkeypatch) -> None:
    """close() returns only once the ``.wandb`` file holds what was logged.

    wandb writes the transaction log in a separate service process that buffers it
    and closes the file after ``finish()`` has returned, so reading it right after
    ``close()`` saw only the file header on a busy machine.
    """
    monkeypatch.setenv("WANDB_SILENT", "true")
    # A config record longer than a 32 KiB block: the exit record after it is found
    # only if records split over blocks are read correctly.
    cfg = {"seed": 0, "note": "x" * 70_000}
    logger = RunLogger(tmp_path, cfg, _logger_cfg("offline"), run_name="t")
    for step in range(1, 4):
        logger.log({"train/loss": 1.0 / step, "epsilon": 0.1 * step}, step=step)
    logger.log({"test/accuracy": 0.5}, step=3)
    logger.summary({"test_accuracy": 0.5})
    logger.close()

    files = list((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    assert len(files) == 1
    blob = files[0].read_bytes()
    for key in (b"train/loss", b"epsilon", b"test/accuracy"):
        assert key in blob, key
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3, 3]

    # the completeness check itself: the full file passes, cut-off copies do not
    assert len(blob) > 70_000 and _wait_for_exit_record(files[0], timeout=0)
    for size in (7, 40_000, len(blob) - 3):
        cut = tmp_path / f"cut{size}.wandb"
        cut.write_bytes(blob[:size])
        assert not _wait_for_exit_record(cut, timeout=0), size


def test_disabled_writes_only_metrics_jsonl(tmp_path: Path) -> None:
    logger = RunLogger(tmp_path, {}, _logger_cfg("disabled"), run_name="t")
    logger.log({"train/loss": 0.5}, step=1)
    logger.close()
    assert not (tmp_path / "wandb").exists()
    assert read_metrics(tmp_path) == [{"step": 1, "train/loss": 0.5}]


def test_a_sweep_job_s_console_lines_carry_its_prefix_and_one_format(tmp_path: Path) -> None:
    """A joblib sweep interleaved its jobs' lines without saying whose, under two formats
    (Hydra's and dpsub's; issue 36): each job's console lines start with ``job N | ``, its
    train.log stays as it was, and Hydra's own lines use dpsub's format."""
    import logging
    import sys

    from dpsub.training.progress import FORMAT, job_prefix

    logger = logging.getLogger("dpsub.test_prefix")
    console, file = logging.StreamHandler(sys.stdout), logging.FileHandler(tmp_path / "train.log")
    for h in (console, file):
        h.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    root = logging.getLogger()
    root.addHandler(console)
    logger.addHandler(file)
    logger.propagate, logger.level = True, logging.INFO
    lines = []
    console.emit = lambda record: lines.append(console.format(record))  # what it would print
    try:
        with job_prefix("job 3 | "):
            logger.info("step %d/%d", 1, 2)
        logger.info("after")
    finally:
        root.removeHandler(console)
        logger.removeHandler(file)
        file.close()
    assert lines == ["[INFO] job 3 | step 1/2", "[INFO] after"]
    assert (tmp_path / "train.log").read_text() == "[INFO] step 1/2\n[INFO] after\n"
    hydra_own = OmegaConf.load(CONF / "hydra" / "hydra_logging" / "dpsub.yaml")
    jobs = OmegaConf.load(CONF / "hydra" / "job_logging" / "dpsub.yaml")
    assert hydra_own.formatters == jobs.formatters and jobs.formatters.simple.format == FORMAT
    assert "override hydra/hydra_logging: dpsub" in (CONF / "config.yaml").read_text()


def test_train_log_follows_a_file_replaced_under_the_run(tmp_path):
    """``git stash -u`` then ``stash pop`` in a lane's clone recreated a running run's
    train.log (a new file, the old lines in it): later lines must land in it, not in the
    deleted file the old handle still pointed at."""
    import logging

    from dpsub.training.progress import attach_run_log

    path = tmp_path / "train.log"
    detach = attach_run_log(path)
    try:
        logging.getLogger("dpsub").info("step 10")
        kept = path.read_text()
        path.unlink()
        path.write_text(kept)  # what stash pop does: the same bytes in a new file
        logging.getLogger("dpsub").info("step 20")
    finally:
        detach()
    lines = path.read_text().splitlines()
    assert [line.split("] ")[-1] for line in lines] == ["step 10", "step 20"]
