"""Clipping: the functions that bound one example's contribution, and say by how much.

``clipped_sum`` returns a :class:`~dpsub.privacy.noise.Sensitive` whose sensitivity is
the clip bound: the guarantee travels with the function that makes it. Rows with a
non-finite entry (an example whose loss overflowed) are zeroed before clipping, so
one bad example can neither poison the release with NaN nor stall training; they
are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dpsub.privacy.noise import Sensitive


def finite_rows(g: Tensor) -> Tensor:
    """Boolean mask of the rows of ``g`` whose entries are all finite."""
    return torch.isfinite(g).all(dim=1)


def clip_factors(norms: Tensor, bound: float) -> Tensor:
    """``min(1, C / ||g_i||)`` per row, 0 for a non-finite norm (the row is dropped)."""
    factor = (bound / (norms + 1e-12)).clamp(max=1.0)
    return torch.where(torch.isfinite(norms), factor, torch.zeros_like(factor))


def clip_rows(g: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    """Scale every row of ``g`` to L2 norm at most ``bound`` (non-finite rows -> 0).

    Returns the clipped rows and the boolean mask of rows that were scaled down.
    """
    ok = finite_rows(g)
    g = torch.where(ok[:, None], g, torch.zeros_like(g))
    norms = g.norm(dim=1)
    return g * clip_factors(norms, bound)[:, None], norms > bound


@dataclass
class ClipStats:
    """Private counts of one clipped sum (diagnostics only: never released by default)."""

    n: int = 0
    clipped: int = 0
    nonfinite: int = 0

    def add(self, other: ClipStats) -> ClipStats:
        return ClipStats(
            self.n + other.n, self.clipped + other.clipped, self.nonfinite + other.nonfinite
        )


def clipped_sum(g: Tensor, bound: float) -> tuple[Sensitive, ClipStats]:
    """``sum_i min(1, C / ||g_i||) g_i`` over the finite rows, with sensitivity C."""
    ok = finite_rows(g)
    g = torch.where(ok[:, None], g, torch.zeros_like(g))
    norms = g.norm(dim=1)
    total = clip_factors(norms, bound) @ g
    stats = ClipStats(int(g.shape[0]), int((norms > bound).sum()), int((~ok).sum()))
    return Sensitive(total, float(bound)), stats


def sensitive_sum(parts: list[Sensitive]) -> Sensitive:
    """Sum of partial clipped sums of the same bound (micro-batches of one batch)."""
    bounds = {p.sensitivity for p in parts}
    if len(bounds) != 1:
        raise ValueError(f"partial sums with different bounds {sorted(bounds)}")
    total = parts[0].value
    for p in parts[1:]:
        total = total + p.value
    return Sensitive(total, bounds.pop())


class ClippedAccumulator:
    """Running clipped sums of named per-example quantities, over the micro-batches of a batch.

    ``add(name, rows, C)`` clips the rows of one micro-batch to C and adds their sum;
    ``sum(name, dim, device)`` is the batch's :class:`Sensitive` sum (zero for an empty
    batch); ``stats[name]`` counts rows, clipped rows and dropped non-finite rows.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Sensitive] = {}
        self.stats: dict[str, ClipStats] = {}

    def add(self, name: str, rows: Tensor, bound: float) -> None:
        s, st = clipped_sum(rows, bound)
        if name in self._sums:
            s = sensitive_sum([self._sums[name], s])
        self._sums[name] = s
        self.stats[name] = self.stats.get(name, ClipStats()).add(st)

    def sum(self, name: str, bound: float, dim: int, device) -> Sensitive:
        if name not in self._sums:  # an empty Poisson batch: the sum is zero
            return Sensitive(torch.zeros(dim, device=device), float(bound))
        return self._sums[name]
