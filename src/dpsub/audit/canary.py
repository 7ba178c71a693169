"""The gradient canary: one extra per-example gradient, put into a mechanism's real step.

:class:`CanaryEngine` stands in for a mechanism's :class:`~dpsub.grads.GradEngine`
during an audited step. Everything is delegated to the real engine (its backend
computes every real example's gradient and clipping); when the canary is on, the
private batch gets one more example whose per-example gradient *is* the canary
(Nasr et al. 2023's "Dirac" gradient canary):

* ``clipped_sum``: the canary, clipped by the library's own :func:`~dpsub.grads.clip_rows`
  to the same bound, is added to the sum the backend returns (any backend);
* ``per_example``: one more chunk holding the canary row (GEP embeds and clips it
  like every other row).

Only the private batch gets it (identified by object identity: the ``x`` the audit
handed to ``mechanism.step``); auxiliary and public gradients never do. The canary
lives in the space of the target being differentiated (the model's parameters, or
RGP's carriers), so it is made per dimension by ``make(dim)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from dpsub.grads import clip_rows
from dpsub.grads.engine import Chunk, ClippedSum
from dpsub.privacy import Sensitive

__all__ = ["CanaryEngine", "canary_vector", "split_canary"]


def canary_vector(dim: int, kind: str, norm: float, generator: torch.Generator, index: int = 0):
    """A canary of L2 norm ``norm``: a random direction (uniform on the sphere) or a coordinate."""
    if kind == "coordinate":
        v = torch.zeros(dim)
        v[index % dim] = 1.0
    else:
        v = torch.randn(dim, generator=generator)
    return v * (norm / v.norm())


def split_canary(basis, s1: float, s2: float, generator: torch.Generator) -> Tensor:
    """A GEP canary that uses the whole sensitivity: ``s1 e + s2 r``.

    ``e`` is a random unit vector of the anchor subspace (``basis``, a
    :class:`~dpsub.subspace.GroupedBasis`), ``r`` a random unit vector orthogonal to it, so
    the canary's embedding has norm ``s1`` and its residual norm ``s2``: both of GEP's
    releases (clipped to S1 and S2) get the largest contribution one example can make.
    Built in float64 (the residual orthogonalized twice), returned in float32.
    """
    b = basis.to(dtype=torch.float64)
    w = torch.randn(b.k, generator=generator, dtype=torch.float64)
    e = b.reconstruct(w)
    r = torch.randn(b.dim, generator=generator, dtype=torch.float64)
    r = b.residual(b.residual(r))
    return (s1 * e / e.norm() + s2 * r / r.norm()).float()


class CanaryEngine:
    """A GradEngine whose private batch holds one more example with gradient ``make(dim)``."""

    def __init__(self, engine, make: Callable[[int], Tensor], holder: bool = True):
        self._engine = engine
        self._make = make
        self.holder = holder  # several ranks: only rank 0's shard holds the canary
        self.private_x: Tensor | None = None  # the batch the canary joins
        self.on = False
        self.applied = 0  # how many sums / row streams got the canary (checked by the audit)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _canary(self, dim: int, device) -> Tensor:
        return self._make(dim).to(device)

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float, target=None) -> ClippedSum:
        out = self._engine.clipped_sum(x, y, clip, target=target)
        if not (self.on and x is self.private_x):
            return out
        value = out.sum.value
        clipped, _ = clip_rows(self._canary(value.numel(), value.device)[None], clip)
        self.applied += 1
        if not self.holder:
            return out
        return ClippedSum(Sensitive(value + clipped[0], out.sum.sensitivity), out.stats)

    def per_example(self, x: Tensor, y: Tensor, target=None) -> Iterator[Chunk]:
        chunks = self._engine.per_example(x, y, target)
        if not (self.on and x is self.private_x):
            yield from chunks
            return
        dim = None
        for chunk in chunks:
            dim = chunk.grads.shape[1]
            yield chunk
        if dim is None:
            dim = (target or self._engine.target).layout.dim
        self.applied += 1
        row = self._canary(dim, x.device)[None]
        if self.holder:
            yield Chunk(row, torch.zeros(1, device=x.device), torch.zeros(1, dtype=torch.bool))
