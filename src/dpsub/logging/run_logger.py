"""Metrics sinks: ``metrics.jsonl`` in the run dir (always) and Weights & Biases.

W&B runs offline by default (no account, no network); ``logger.mode=auto``
goes online when an API key is configured. Offline runs live under
``<run_dir>/wandb/`` and can be uploaded later with ``wandb sync``.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import uuid
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


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
        if resume_step and self.path.exists():
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

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines from steps the crashed run did after its checkpoint."""
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
        (self.run_dir / "summary.json").write_text(
            json.dumps({k: _jsonable(v) for k, v in values.items()}, indent=2) + "\n"
        )
        if self.wandb_run is not None:
            for k, v in values.items():
                self.wandb_run.summary[k] = v

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
