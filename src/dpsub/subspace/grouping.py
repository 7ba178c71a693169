"""Parameter grouping and the split of a basis-vector quota across groups.

GEP (Yu et al., ICLR 2021, Section 3.1 "parameter grouping" and Section 4; see
``docs/methods.md``, "GEP and B-GEP") computes one orthonormal anchor basis per
*group* of parameters instead of one basis for the whole flat vector: with groups of
sizes p_1, ..., p_g and k_j basis vectors each, a power iteration costs
2 m (k_1 p_1 + ... + k_g p_g) instead of 2 m k p (Algorithm 1, line 5).  The k basis
vectors are split across groups "according to the square root of the number of
parameters in each group" (Section 4), i.e. k_j proportional to sqrt(p_j).

A :class:`Group` is a contiguous range ``[start, end)`` of the flat parameter vector laid
out by :class:`dpsub.grads.engine.ParamLayout` (trainable parameters in
``named_parameters`` order, each flattened).  Schemes (config key ``mechanism.grouping``):

* ``"stages"`` -- the paper's grouping: one group per top-level module (first component
  of the parameter name).  For ResNet-20 this is exactly 5 groups: ``conv1`` (input
  layer), ``layer1``, ``layer2``, ``layer3`` (the three stages) and ``fc`` (output layer).
* ``"chunks"`` -- the official GEP code: ``num_groups`` (3) equal contiguous chunks of the
  flat vector (sizes differ by at most 1), not aligned to layers.
* ``"tensors"`` -- one group per parameter tensor.
* ``"flat"`` -- a single group covering the whole vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsub.grads.layout import ParamLayout

__all__ = ["GROUPING_SCHEMES", "Group", "group_parameters", "split_quota"]

GROUPING_SCHEMES = ("stages", "chunks", "tensors", "flat")


@dataclass(frozen=True)
class Group:
    """A contiguous range ``[start, end)`` of the flat parameter vector."""

    name: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"invalid group range [{self.start}, {self.end}) for {self.name!r}")

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def slice(self) -> slice:
        return slice(self.start, self.end)


def group_parameters(layout: ParamLayout, scheme: str, num_groups: int = 3) -> list[Group]:
    """Split the flat parameter vector of ``layout`` into contiguous groups.

    Args:
        layout: the flat layout of the trainable parameters.
        scheme: one of :data:`GROUPING_SCHEMES` (``"stages"``, ``"chunks"``,
            ``"tensors"``, ``"flat"``), see the module docstring.
        num_groups: number of chunks for ``"chunks"`` (ignored otherwise).

    Returns:
        Groups in flat-vector order, covering ``[0, layout.dim)`` without overlap.

    Raises:
        ValueError: unknown scheme (the message names ``mechanism.grouping`` and the valid
            schemes), an empty layout, ``num_groups`` outside ``[1, dim]`` for
            ``"chunks"``, or (``"stages"``) a top-level module whose parameters are not
            contiguous in ``named_parameters`` order.
    """
    if scheme not in GROUPING_SCHEMES:
        raise ValueError(
            f"mechanism.grouping must be one of {', '.join(GROUPING_SCHEMES)}; got {scheme!r}"
        )
    if layout.dim == 0:
        raise ValueError("cannot group parameters: the layout has no trainable parameters")
    if scheme == "flat":
        return [Group("all", 0, layout.dim)]
    if scheme == "tensors":
        return [
            Group(n, o, o + k)
            for n, o, k in zip(layout.names, layout.offsets, layout.numels, strict=True)
        ]
    if scheme == "chunks":
        return _chunks(layout.dim, int(num_groups))
    return _stages(layout)


def _chunks(p: int, num_groups: int) -> list[Group]:
    """``num_groups`` contiguous chunks of near-equal size (the first ones one larger)."""
    if not 1 <= num_groups <= p:
        raise ValueError(
            f"mechanism.num_groups must be in [1, {p}] for grouping 'chunks', got {num_groups}"
        )
    base, extra = divmod(p, num_groups)
    groups, start = [], 0
    for j in range(num_groups):
        size = base + (1 if j < extra else 0)
        groups.append(Group(f"chunk{j}", start, start + size))
        start += size
    return groups


def _stages(layout: ParamLayout) -> list[Group]:
    """One group per top-level module, i.e. per first component of the parameter name."""
    groups: list[Group] = []
    seen: set[str] = set()
    for name, off, k in zip(layout.names, layout.offsets, layout.numels, strict=True):
        top = name.split(".", 1)[0]
        if groups and groups[-1].name == top:
            last = groups[-1]
            if last.end != off:  # offsets are consecutive by construction; be safe
                raise ValueError(f"parameters of module {top!r} are not contiguous")
            groups[-1] = Group(top, last.start, off + k)
            continue
        if top in seen:
            raise ValueError(
                f"parameters of top-level module {top!r} are not contiguous in "
                "named_parameters order; grouping 'stages' needs them to be"
            )
        seen.add(top)
        groups.append(Group(top, off, off + k))
    return groups


def split_quota(sizes: list[int], k: int, cap: list[int] | None = None) -> list[int]:
    """Split ``k`` basis vectors across groups in proportion to sqrt(group size).

    GEP, Section 4: "we allocate [the quota] to each group according to the square root
    of the number of parameters in each group", k_j ~ k sqrt(p_j) / sum_i sqrt(p_i).

    The ideal real shares are rounded by the largest-remainder method, so the integers
    sum to exactly ``k``.  Each group gets at most ``cap[j]`` (default: its size; GEP
    uses ``min(size_j, m)``: a group cannot hold more orthonormal directions than its
    dimension, nor than the m anchor gradients span).  Whatever a cap cuts off is
    redistributed to the uncapped groups in the same sqrt proportion (water-filling).
    When ``k >= len(sizes)`` every group with a positive cap gets at least 1.

    Example: ``split_quota([100, 400, 900], 60) == [10, 20, 30]``.

    Raises:
        ValueError: ``k < 0``, a non-positive size, a negative cap, ``len(cap) !=
            len(sizes)``, or ``k`` larger than the sum of the caps.
    """
    sizes, k = [int(s) for s in sizes], int(k)
    caps = _checked_caps(sizes, k, cap)
    weights = [math.sqrt(s) for s in sizes]
    alloc, active, shares = _water_fill(weights, caps, k)
    if active:
        _round_largest_remainder(alloc, active, shares, weights, caps, k - sum(alloc))
    if k >= len(sizes):  # at least one vector per group when there are enough to go around
        for j in range(len(sizes)):
            if alloc[j] == 0 and caps[j] > 0:
                donor = max((i for i in range(len(sizes)) if alloc[i] > 1),
                            key=lambda i: (alloc[i], -i))  # fmt: skip
                alloc[donor] -= 1
                alloc[j] = 1
    assert sum(alloc) == k and all(0 <= a <= c for a, c in zip(alloc, caps, strict=True))
    return alloc


def _checked_caps(sizes: list[int], k: int, cap: list[int] | None) -> list[int]:
    """The per-group caps (default: the sizes), after split_quota's argument checks."""
    n = len(sizes)
    if k < 0:
        raise ValueError(f"number of basis vectors k must be >= 0, got {k}")
    if any(s <= 0 for s in sizes):
        raise ValueError(f"group sizes must be positive, got {sizes}")
    caps = list(sizes) if cap is None else [int(c) for c in cap]
    if len(caps) != n:
        raise ValueError(f"cap has {len(caps)} entries for {n} groups")
    if any(c < 0 for c in caps):
        raise ValueError(f"caps must be >= 0, got {caps}")
    if k > sum(caps):
        raise ValueError(
            f"k = {k} basis vectors exceed the sum of the per-group caps {sum(caps)} "
            f"(caps {caps}: a group cannot have more orthonormal directions than its size "
            "or than the number of anchor gradients); lower k or use more anchors"
        )
    return caps


def _water_fill(weights: list[float], caps: list[int], k: int):
    """Groups whose ideal share of what remains reaches their cap are fixed at the cap and
    the rest is re-split among the others: (alloc, the uncapped groups, their real shares)."""
    alloc = [0] * len(weights)
    active = [j for j in range(len(weights)) if caps[j] > 0]
    remaining, shares = k, {}
    while active:
        total_w = sum(weights[j] for j in active)
        shares = {j: remaining * weights[j] / total_w for j in active}
        capped = [j for j in active if shares[j] >= caps[j]]
        if not capped:
            break
        for j in capped:
            alloc[j] = caps[j]
            remaining -= caps[j]
        active = [j for j in active if j not in capped]
    return alloc, active, shares


def _round_largest_remainder(alloc, active, shares, weights, caps, remaining: int) -> None:
    """Integer shares of ``remaining`` over ``active`` (in place): floors, then one more each
    by largest remainder (ties: larger group, then earlier group)."""
    floors = {j: min(int(math.floor(round(shares[j], 9))), caps[j]) for j in active}
    for j in active:
        alloc[j] = floors[j]
    leftover = remaining - sum(floors.values())
    order = sorted(active, key=lambda j: (-(shares[j] - floors[j]), -weights[j], j))
    for j in order:
        if leftover <= 0:
            break
        if alloc[j] < caps[j]:
            alloc[j] += 1
            leftover -= 1
    if leftover:  # cannot happen (shares < caps), kept as a guard
        raise AssertionError("largest-remainder rounding failed to place the quota")
