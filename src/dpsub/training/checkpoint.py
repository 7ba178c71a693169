"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the model, optimizer and schedule, the step, the privacy
ledger's history and every random generator (sampling, noise, torch's global
RNGs). Resuming restores them all, so the steps between the last checkpoint and
a crash are *replayed* with the same batches and the same noise: they release
nothing new, and the ledger counts each step once.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CKPT_NAME = "checkpoint.pt"


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    """Atomic write (tmp file + rename): a kill during saving keeps the last good one."""
    path = Path(run_dir) / CKPT_NAME
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path, map_location="cpu") -> dict | None:
    path = Path(run_dir) / CKPT_NAME
    if not path.exists():
        return None
    return torch.load(path, map_location=map_location, weights_only=False)


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    state = {name: g.get_state() for name, g in generators.items()}
    state["torch_cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(generators: dict[str, torch.Generator], state: dict) -> None:
    for name, g in generators.items():
        g.set_state(state[name])
    torch.set_rng_state(state["torch_cpu"])
    if torch.cuda.is_available() and "torch_cuda" in state:
        torch.cuda.set_rng_state_all(state["torch_cuda"])
