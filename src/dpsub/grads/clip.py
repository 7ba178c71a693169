"""Clipping: the functions that bound one example's contribution, and say by how much.

``clipped_sum`` returns a :class:`~dpsub.privacy.noise.Sensitive` whose sensitivity is
the clip bound: the guarantee travels with the function that makes it. Rows whose norm
is not finite (a non-finite entry, or finite entries whose norm overflows float32) are
zeroed before clipping and anything else is computed from them, so one bad example can
neither poison the release with NaN nor stall training; they are counted.
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


def _rows(t: Tensor) -> Tensor:
    """``t`` (b, ...) as (b, n) rows (a view when ``t`` is contiguous)."""
    return t.reshape(t.shape[0], -1)


def row_norms(parts: list[Tensor]) -> Tensor:
    """L2 norm of each example's row, the row split over ``parts`` ((b, ...) tensors)."""
    norms = [torch.linalg.vector_norm(_rows(t), dim=1) for t in parts]
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms), dim=0)


def finite_norms_parts(parts: list[Tensor]) -> tuple[list[Tensor], Tensor, Tensor]:
    """:func:`finite_norms` of rows split over ``parts`` (e.g. per-parameter per-example
    gradients), without concatenating them."""
    norms = row_norms(parts)
    ok = torch.isfinite(norms)
    if bool(ok.all()):
        return parts, norms, ok
    parts = [torch.where(ok.view(-1, *[1] * (t.dim() - 1)), t, torch.zeros_like(t)) for t in parts]
    return parts, torch.where(ok, norms, torch.zeros_like(norms)), ok


def finite_norms(g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(g, norms, ok)``: row norms, with every row whose norm is not finite zeroed.

    An example is *dropped* (``ok`` False, its row and norm 0) when its norm is not
    finite: a non-finite entry, or finite entries whose float norm overflows (an input
    scaled by 1e38). A dropped example contributes exactly zero to every quantity derived
    from its row (an embedding ``B g``, a residual, a clipped sum), so no product
    ``0 * inf`` can turn a release into NaN. One pass over ``g`` when every norm is
    finite (the usual case); only then is ``g`` copied.
    """
    (g,), norms, ok = finite_norms_parts([g])
    return g, norms, ok


def clip_rows(g: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    """Scale every row of ``g`` to L2 norm at most ``bound`` (non-finite rows -> 0).

    Returns the clipped rows and the boolean mask of rows that were scaled down.
    """
    g, norms, _ = finite_norms(g)
    return g * clip_factors(norms, bound)[:, None], norms > bound


@dataclass
class ClipStats:
    """Private counts of one clipped sum (diagnostics only: never released by default).

    ``clipped`` and ``nonfinite`` may be 0-d tensors on the device (no host sync in the
    step); they are read (``int()``/``float()``) only where they are logged.
    """

    n: int = 0
    clipped: int | Tensor = 0
    nonfinite: int | Tensor = 0

    def add(self, other: ClipStats) -> ClipStats:
        return ClipStats(
            self.n + other.n, self.clipped + other.clipped, self.nonfinite + other.nonfinite
        )


def clipped_sum(g: Tensor | list[Tensor], bound: float) -> tuple[Sensitive, ClipStats]:
    """``sum_i min(1, C / ||g_i||) g_i`` over the finite rows, with sensitivity C.

    ``g``: the (b, p) rows, or a list of (b, ...) parts of them (per-parameter per-example
    gradients; the sum is their flat concatenation, never formed for the rows). Two passes
    over ``g`` (norms, then one vector-matrix product per part) and no (b, p) temporary.
    """
    parts, norms, ok = finite_norms_parts(g if isinstance(g, list) else [g])
    c = clip_factors(norms, bound)
    total = torch.cat([c @ _rows(t) for t in parts])
    stats = ClipStats(int(norms.shape[0]), (norms > bound).sum(), (~ok).sum())  # no sync
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

    def add(self, name: str, rows: Tensor | list[Tensor], bound: float) -> None:
        s, st = clipped_sum(rows, bound)
        if name in self._sums:
            s = sensitive_sum([self._sums[name], s])
        self._sums[name] = s
        self.stats[name] = self.stats.get(name, ClipStats()).add(st)

    def sum(self, name: str, bound: float, dim: int, device) -> Sensitive:
        if name not in self._sums:  # an empty Poisson batch: the sum is zero
            return Sensitive(torch.zeros(dim, device=device), float(bound))
        return self._sums[name]


class ClippedResidualSum:
    """``sum_i min(1, C / ||r_i||) r_i`` for ``r_i = g_i - lift(w_i)``, without forming r_i.

    Book-keeping (GEP's residual, ``lift`` linear): the clipped sum equals
    ``c^T G - lift(c^T W)`` with ``c_i = min(1, C / ||r_i||)``, so a batch costs one
    vector-matrix product over G instead of the (b, k) x (k, p) product and the (b, p)
    copy that forming the residual rows costs.

    The sensitivity C rests on ``norms``: they must be *upper bounds* of ``||r_i||``
    (``GroupedBasis.residual_norms`` gives them, with a margin for rounding); a norm that
    is too small would let an example contribute more than C. Rows of ``G`` and ``W``
    should be finite (zero the dropped examples first, see :func:`finite_norms`); a row
    whose bound or embedding is not finite anyway is dropped by :meth:`add`.
    """

    def __init__(self, bound: float) -> None:
        self.bound = float(bound)
        self.stats = ClipStats()
        self._g: Tensor | None = None
        self._w: Tensor | None = None

    def add(self, G: Tensor, W: Tensor, norms: Tensor, nonfinite: int | Tensor = 0) -> None:
        """One micro-batch: rows ``G`` (b, p), their embeddings ``W`` (b, k), bounds (b,).

        A row whose bound or embedding is not finite is dropped here too (counted in
        ``nonfinite``): it contributes exactly zero, never ``0 * inf``.
        """
        n = int(G.shape[0])
        keep = torch.isfinite(norms) & torch.isfinite(W).all(dim=1)
        if not bool(keep.all()):
            G, W, norms = G[keep], W[keep], norms[keep]
            nonfinite = nonfinite + (~keep).sum()
        c = clip_factors(norms, self.bound).to(G.dtype)
        g, w = c @ G, c.to(W.dtype) @ W
        self._g = g if self._g is None else self._g + g
        self._w = w if self._w is None else self._w + w
        st = ClipStats(n, (norms > self.bound).sum(), nonfinite)  # no sync
        self.stats = self.stats.add(st)

    def sum(self, lift, dim: int, device) -> Sensitive:
        """The batch's clipped sum ``c^T G - lift(c^T W)`` (zero for an empty batch)."""
        if self._g is None:
            return Sensitive(torch.zeros(dim, device=device), self.bound)
        return Sensitive(self._g - lift(self._w), self.bound)
