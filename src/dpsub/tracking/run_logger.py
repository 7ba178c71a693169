"""Metrics sinks: ``metrics.jsonl`` in the run dir (always) and Weights & Biases.

W&B runs offline by default (no account, no network); ``logger.mode=auto``
goes online when an API key is configured. Offline runs live under
``<run_dir>/wandb/`` and can be uploaded later with ``wandb sync``.
"""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import time
import uuid
from pathlib import Path
from typing import Any

from dpsub.rundir import METRICS, SUMMARY

METRICS_FILE = METRICS
#: How long :meth:`RunLogger.close` waits for W&B to write an offline run's file.
OFFLINE_FLUSH_TIMEOUT_S = 120.0

log = logging.getLogger(__name__)


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_mode(mode: str) -> str:
    if mode == "auto":
        return "online" if has_wandb_key() else "offline"
    return mode


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "inf" / "nan": JSON has no infinity
    return v


class RunLogger:
    """Writes one JSON line per ``log`` call and mirrors it to W&B."""

    def __init__(self, run_dir: Path, cfg: dict, logger_cfg, run_name: str, resume_step: int = 0):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        if self.path.exists():  # a resume (a new run never starts in a dir that holds one)
            self._truncate_after(resume_step)
        self.wandb_run = None
        self.mode = resolve_mode(logger_cfg.mode)
        if self.mode != "disabled":
            import wandb

            id_file = self.run_dir / "wandb_id.txt"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
            id_file.write_text(run_id)
            self.wandb_run = wandb.init(
                project=logger_cfg.project,
                entity=logger_cfg.entity,
                group=logger_cfg.group,
                tags=list(logger_cfg.tags),
                name=run_name,
                config=cfg,
                dir=str(self.run_dir),
                mode=self.mode,
                id=run_id,
                resume="allow",
                settings=wandb.Settings(console="off", silent=True),
            )

    def describe(self) -> str:
        """One line: where the metrics go, and W&B's mode and files (or that it is off)."""
        where = f"{self.path}"
        if self.wandb_run is None:
            return f"{where}; W&B {self.mode} (logger.mode)"
        if self.mode == "offline":
            sync_dir = self.wandb_run.settings.sync_dir
            return f"{where}; W&B offline in {sync_dir} (upload later: wandb sync {sync_dir})"
        return f"{where}; W&B {self.mode}: {self.wandb_run.url}"

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines from steps the crashed run did after its checkpoint (all
        of them when it stopped before its first checkpoint: it continues from step 0)."""
        keep = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        (self.run_dir / SUMMARY).write_text(
            json.dumps({k: _jsonable(v) for k, v in values.items()}, indent=2) + "\n"
        )
        if self.wandb_run is not None:
            for k, v in values.items():
                self.wandb_run.summary[k] = v

    def close(self, timeout: float = OFFLINE_FLUSH_TIMEOUT_S) -> None:
        """Finish the W&B run; offline, return only once its ``.wandb`` file is complete.

        ``wandb.finish()`` returns when the wandb service *process* has handled the
        run's exit record, but that process buffers the transaction log (the
        ``.wandb`` file) and writes it out only when it closes the run's stream, which
        ``finish()`` requests without waiting for it. So wait until the file holds
        the exit record (all earlier records are then on disk too), for at most
        ``timeout`` seconds; past that, warn and go on (metrics.jsonl is complete).
        """
        if self.wandb_run is None:
            return
        run, self.wandb_run = self.wandb_run, None
        sync_file = Path(run.settings.sync_file) if self.mode == "offline" else None
        run.finish()
        if sync_file is not None and not _wait_for_exit_record(sync_file, timeout):
            log.warning(
                "W&B offline run file %s is still incomplete after %.0f s; "
                "`wandb sync` may miss its last records",
                sync_file,
                timeout,
            )


# The .wandb transaction log is a LevelDB log: a 7-byte file header (":W&B", magic,
# version) at the start of the first 32 KiB block, then chunks that never cross a
# block boundary, each with a 7-byte header (crc32, little-endian length, type).
_BLOCK, _HEADER = 32 * 1024, 7
_FULL, _LAST = 1, 4


def _complete_records(data: bytes, pos: int = _HEADER):
    """Yield the payload of each complete record of ``data`` from ``pos`` (a record
    start); stop at a record that is not fully written yet."""
    parts: list[bytes] = []
    while True:
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # zero padding up to the next block
            pos += left
            continue
        if pos + _HEADER > len(data):
            return
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        end = pos + _HEADER + length
        if kind == 0 or end > len(data):  # not written yet
            return
        parts.append(data[pos + _HEADER : end])
        pos = end
        if kind in (_FULL, _LAST):
            yield b"".join(parts)
            parts = []


def _has_exit_record(path: Path) -> bool:
    """Whether W&B's transaction log at ``path`` holds the run's exit record
    (False for a file that is missing, incomplete or unreadable)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes() if path.is_file() else b""
    for payload in _complete_records(data):
        record = pb.Record()
        try:
            record.ParseFromString(payload)
        except DecodeError:
            return False
        if record.WhichOneof("record_type") == "exit":
            return True
    return False


def _wait_for_exit_record(path: Path, timeout: float, poll: float = 0.05) -> bool:
    """Poll until ``path`` holds the exit record (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not _has_exit_record(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
