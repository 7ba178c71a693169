"""A validation split carved from the private training set, for tuning without the test set.

``dataset.validation_size=N`` holds out N examples of the private training set (after any
auxiliary examples were taken from it), class-balanced (``dataset.validation_pick=balanced``,
the default), at positions drawn from the seed alone (``uniform``), or example by example
(``hash``: each example is held out when a hash of its own bytes falls below N_val / N,
so its part depends on itself and N alone, the same for every seed: every run of a
``dpsub-select`` search trains on the same N - N_val examples, and so the same q), and
evaluates on
them *instead of* the test set, which the run then never sees: the run's reported accuracy is
``validation/accuracy``. Hyper-parameters are picked on it (``scripts/tune.py``), and only
the pick is run against the test set. The held-out examples leave the private set (N, and
so q, shrink accordingly). As in the papers, the privacy cost of tuning runs is not counted.
"""

from __future__ import annotations

import dataclasses

import torch

from dpsub.data.datasets import DatasetBundle
from dpsub.data.subsets import NotEnoughExamples, balanced_pick, random_pick
from dpsub.errors import ConfigError

#: The validation pick's generator is seeded with the run seed plus this.
SEED_OFFSET = 7919


def carve_validation(
    data: DatasetBundle, size: int, seed: int, pick: str = "balanced"
) -> DatasetBundle:
    """``data`` with ``size`` training examples moved to the evaluation set: class-balanced,
    or (``pick="uniform"``) at positions drawn from ``seed`` alone, never the labels."""
    n = len(data.train_y)
    if not 1 <= size < n:
        raise ConfigError(
            f"dataset.validation_size: must be in [1, {n - 1}] (the private set has {n} "
            f"examples), got {size}"
        )
    g = torch.Generator().manual_seed(seed + SEED_OFFSET)
    try:
        if pick == "hash":
            idx = hashed_pick(data.train_x, data.train_y, size / n, SEED_OFFSET)  # (no seed)
        elif pick == "uniform":
            idx = random_pick(n, size, g)
        else:
            idx = balanced_pick(data.train_y.cpu(), size, data.num_classes, g)
    except NotEnoughExamples as e:
        raise ConfigError(f"dataset.validation_size: {e}") from None
    if not 1 <= len(idx) < n:
        raise ConfigError(f"dataset.validation_size: the hash pick held out {len(idx)} of {n} "
                          "examples; give a larger validation_size")  # fmt: skip
    keep = torch.ones(n, dtype=torch.bool)
    keep[idx] = False
    return dataclasses.replace(
        data,
        train_x=data.train_x[keep],
        train_y=data.train_y[keep],
        test_x=data.train_x[idx],
        test_y=data.train_y[idx],
        eval_split="validation",
    )


def hashed_pick(x: torch.Tensor, y: torch.Tensor, rate: float, key: int) -> torch.Tensor:
    """The indices of the examples whose keyed hash (BLAKE2b of the example's own bytes,
    keyed by ``key``), read as a uniform in [0, 1), falls below ``rate``. Adding or removing
    one example moves no other example between the parts (for a given ``rate``: dpsub
    treats N as public, as the sampling rate q = B / N does)."""
    import hashlib

    k = int(key).to_bytes(8, "little", signed=True)
    xs, ys = x.detach().cpu().contiguous().numpy(), y.detach().cpu().contiguous().numpy()
    draw = [
        int.from_bytes(hashlib.blake2b(xs[i].tobytes() + ys[i].tobytes(), key=k,
                                       digest_size=8).digest(), "little") / 2.0**64
        for i in range(len(xs))
    ]  # fmt: skip
    return (torch.tensor(draw, dtype=torch.float64) < rate).nonzero().flatten()
