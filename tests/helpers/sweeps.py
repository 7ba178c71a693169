"""Sweep helpers shared by the integration and e2e suites."""

from __future__ import annotations

from pathlib import Path

SMALL = ("train.max_steps=2", "train.eval_every=0")


def job_dirs(sweep: Path) -> dict[str, Path]:
    return {p.name.split("_")[0]: p for p in sweep.iterdir() if p.is_dir()}
