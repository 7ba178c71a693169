"""The student: a non-private model trained on the public pool and the aggregator's answers.

Everything it sees is public (the pool's images: the answered queries and, when
semi-supervised, the unanswered ones) or already privatized (the noisy answers), so its
training is post-processing of the aggregator's output. It is never given the private
training set: :func:`student_data` builds its inputs from the public pool and the
answered labels alone (docs/pate.md, "The student").

Semi-supervised (``pate.student.semi_supervised=true``): FixMatch (Sohn et al., 2020).
Each step adds, to the cross-entropy on a batch of answered queries, the cross-entropy on
``unlabeled_ratio`` times as many unanswered pool images: the model's own prediction on a
weakly augmented view (a shift of up to 2 pixels) is the target of a strongly augmented
view (rotation, scale, shift and a cut-out square), kept only where the prediction's
probability reaches ``confidence``; the term is weighted by ``unlabeled_weight``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SGDOptions:
    epochs: int = 20
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9


@dataclass(frozen=True)
class StudentOptions(SGDOptions):
    """``pate.student.*``: SGD, and FixMatch's three settings (used when semi-supervised;
    an epoch is then one pass over the unanswered images)."""

    semi_supervised: bool = False
    unlabeled_ratio: int = 3
    confidence: float = 0.95
    unlabeled_weight: float = 1.0


def student_data(pools, labels: torch.Tensor):
    """(answered images, their noisy labels, unanswered images): all from the public pool
    of ``pools`` (:class:`dpsub.pate.pool.Pools`) and the (query index, answer) list the
    aggregator released; nothing of its private training set."""
    public_x = pools.public_x
    answered = torch.zeros(public_x.shape[0], dtype=torch.bool)
    answered[labels[:, 0]] = True
    return public_x[labels[:, 0]], labels[:, 1], public_x[~answered]


def train_student(model: torch.nn.Module, x, y, opts: StudentOptions, seed: int, unlabeled=None):
    """SGD with momentum on (x, y), plus FixMatch on ``unlabeled`` when
    ``opts.semi_supervised``; returns the model."""
    gen = torch.Generator().manual_seed(seed)
    optim = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=opts.momentum)
    model.train()
    if opts.semi_supervised and unlabeled is not None and len(unlabeled) > 0:
        return _fixmatch(model, optim, x, y, unlabeled, opts, gen)
    for _ in range(opts.epochs):
        order = torch.randperm(x.shape[0], generator=gen).to(x.device)
        for i in range(0, x.shape[0], opts.batch_size):
            idx = order[i : i + opts.batch_size]
            optim.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optim.step()
    return model


def _fixmatch(model, optim, x, y, unlabeled, opts: StudentOptions, gen):
    b, ub = opts.batch_size, opts.batch_size * opts.unlabeled_ratio
    steps = opts.epochs * math.ceil(len(unlabeled) / ub)
    lab, unl = _cycle(len(x), b, gen), _cycle(len(unlabeled), ub, gen)
    for _ in range(steps):
        li, ui = next(lab).to(x.device), next(unl).to(x.device)
        u = unlabeled[ui]
        with torch.no_grad():
            probs = F.softmax(model(augment(u, gen, strong=False)), dim=-1)
            conf, pseudo = probs.max(dim=-1)
            keep = (conf >= opts.confidence).float()
        optim.zero_grad(set_to_none=True)
        sup = F.cross_entropy(model(augment(x[li], gen, strong=False)), y[li])
        per = F.cross_entropy(model(augment(u, gen, strong=True)), pseudo, reduction="none")
        (sup + opts.unlabeled_weight * (per * keep).mean()).backward()
        optim.step()
    return model


def _cycle(n: int, size: int, gen):
    """Batches of ``size`` indices of ``n``, reshuffled at every pass (forever)."""
    while True:
        order = torch.randperm(n, generator=gen)
        order = order.repeat(math.ceil(size / n)) if n < size else order
        for i in range(0, len(order) - size + 1, size):
            yield order[i : i + size]


def augment(x: torch.Tensor, gen, strong: bool) -> torch.Tensor:
    """A random affine view of each image (weak: a shift of up to 2 / 28 of the side;
    strong: rotation up to 25 degrees, scale 0.85 to 1.15, shift up to 4 / 28, then a
    square of a third of the side set to the image's smallest value)."""
    n = x.shape[0]

    def uniform(lo, hi):
        return (lo + (hi - lo) * torch.rand(n, generator=gen)).to(x.device, x.dtype)

    shift = 8 / 28 if strong else 4 / 28  # in grid units ([-1, 1] is the side)
    angle = uniform(-0.436, 0.436) if strong else uniform(0, 0)
    scale = uniform(0.85, 1.15) if strong else uniform(1, 1)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, uniform(-shift, shift)], -1),
                         torch.stack([sin, cos, uniform(-shift, shift)], -1)], 1)  # fmt: skip
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    low = x.amin(dim=(1, 2, 3), keepdim=True)
    out = F.grid_sample(x - low, grid, align_corners=False, padding_mode="zeros") + low
    if strong:
        side = max(1, x.shape[-1] // 3)
        rows = torch.arange(x.shape[-2], device=x.device).view(1, -1, 1)
        cols = torch.arange(x.shape[-1], device=x.device).view(1, 1, -1)
        r0 = torch.randint(0, x.shape[-2] - side + 1, (n, 1, 1), generator=gen).to(x.device)
        c0 = torch.randint(0, x.shape[-1] - side + 1, (n, 1, 1), generator=gen).to(x.device)
        hole = (rows >= r0) & (rows < r0 + side) & (cols >= c0) & (cols < c0 + side)
        out = torch.where(hole.unsqueeze(1), low, out)
    return out
