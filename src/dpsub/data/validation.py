"""A validation split carved from the private training set, for tuning without the test set.

``dataset.validation_size=N`` holds out N examples of the private training set (after any
auxiliary examples were taken from it), class-balanced (``dataset.validation_pick=balanced``,
the default) or at positions drawn from the seed alone, whatever their labels (``uniform``:
a split fixed before the data are read, which ``dpsub-select`` needs), and evaluates on
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
        idx = (
            random_pick(n, size, g) if pick == "uniform"
            else balanced_pick(data.train_y.cpu(), size, data.num_classes, g)
        )  # fmt: skip
    except NotEnoughExamples as e:
        raise ConfigError(f"dataset.validation_size: {e}") from None
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
