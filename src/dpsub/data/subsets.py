"""Deterministic subsets of a labelled split: the one class-balanced picker.

Used for ``dataset.train_size`` (a smaller private training set) and for the aux
sources that take their examples from the private data (``heldout_test``,
``public_train``). The indices depend only on the labels, the size and the
generator's seed, so a run with the same seed trains on the same examples.
"""

from __future__ import annotations

import torch

__all__ = ["NotEnoughExamples", "balanced_pick", "random_pick"]


class NotEnoughExamples(ValueError):
    """A class has fewer examples than its share of a balanced subset."""

    def __init__(self, cls: int, want: int, have: int):
        super().__init__(f"class {cls} needs {want} examples but has only {have}")
        self.cls, self.want, self.have = cls, want, have


def random_pick(n: int, m: int, generator: torch.Generator) -> torch.Tensor:
    """``m`` of the indices ``0..n-1`` uniformly without replacement, sorted."""
    return torch.randperm(n, generator=generator)[:m].sort().values


def balanced_pick(
    y: torch.Tensor,
    m: int,
    num_classes: int,
    generator: torch.Generator,
    *,
    fill: bool = False,
) -> torch.Tensor:
    """``m`` indices into ``y``, ``m // num_classes`` per class, sorted.

    The remainder ``m % num_classes`` goes one each to the first classes. Within a
    class the examples are a uniformly random subset (one ``randperm`` per class, in
    class order: the draws, and so the subsets of recorded runs, must not change).

    A class with fewer examples than its share raises :class:`NotEnoughExamples`,
    or with ``fill`` gives all it has, and the shortfall is drawn uniformly from the
    examples not yet picked (labels outside ``[0, num_classes)`` included).
    """
    base, extra = divmod(m, num_classes)
    picked, rest = [], []
    for cls in range(num_classes):
        want = base + (1 if cls < extra else 0)
        members = (y == cls).nonzero().flatten()
        if want > len(members) and not fill:
            raise NotEnoughExamples(cls, want, len(members))
        members = members[torch.randperm(len(members), generator=generator)]
        picked.append(members[:want])
        rest.append(members[want:])
    short = m - sum(len(p) for p in picked)
    if short > 0:
        rest.append(((y < 0) | (y >= num_classes)).nonzero().flatten())
        pool = torch.cat(rest)
        picked.append(pool[torch.randperm(len(pool), generator=generator)[:short]])
    return torch.cat(picked).sort().values
