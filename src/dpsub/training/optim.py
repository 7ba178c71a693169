"""Optimizers and step schedules (milestones given as fractions of training)."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(params, cfg) -> torch.optim.Optimizer:
    """``cfg``: the typed ``optim`` group (Settings.optim: every key present)."""
    if cfg.name == "sgd":
        return torch.optim.SGD(
            params,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            nesterov=cfg.nesterov,
        )
    if cfg.name == "adam":
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
    raise ValueError(f"optim.name: unknown optimizer {cfg.name!r}; choose sgd or adam")


def build_schedule(optimizer, schedule_cfg, total_steps: int) -> LambdaLR:
    """lr * gamma^(number of milestones passed); milestones are fractions of total_steps."""
    marks = [round(float(m) * total_steps) for m in schedule_cfg.milestones]
    gamma = float(schedule_cfg.gamma)

    def factor(step: int) -> float:
        return gamma ** sum(step >= m for m in marks)

    return LambdaLR(optimizer, factor)
