"""The student: a non-private model trained on the public queries the aggregator answered.

Everything it sees is public (the queries) or already privatized (the noisy answers), so
its training is post-processing of the aggregator's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class StudentOptions:
    epochs: int = 20
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9


def train_student(model: torch.nn.Module, x, y, opts: StudentOptions, seed: int):
    """Plain SGD with momentum on (x, y); returns the model."""
    gen = torch.Generator().manual_seed(seed)
    optim = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=opts.momentum)
    model.train()
    for _ in range(opts.epochs):
        order = torch.randperm(x.shape[0], generator=gen).to(x.device)
        for i in range(0, x.shape[0], opts.batch_size):
            idx = order[i : i + opts.batch_size]
            optim.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optim.step()
    return model
