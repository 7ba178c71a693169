"""The student's public pool and the evaluation examples.

As in the PATE papers, the first ``public_size`` test examples are the student's
unlabeled public pool (the teachers vote on them; the student sees only the answered
labels); the rest are the evaluation examples. The two never overlap.

Tuning (``dataset.validation_size=N``): N class-balanced examples are held out of the
private training set (:func:`dpsub.data.validation.carve_validation`); the teachers train
on the rest, the public pool is unchanged, and the student is evaluated on the N held-out
examples instead of the test set, which the run then never evaluates on (its summary has
``validation_accuracy``, no ``test_accuracy``). ``pate.holdout=N`` keeps the same N
examples from the teachers without evaluating on them: the final runs' teachers are then
those of the tuning runs. docs/pate.md, "Tuning".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def public_split(n_test: int, public_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(public pool indices, evaluation indices) of a test split of ``n_test`` examples."""
    if not 0 < public_size < n_test:
        raise ValueError(f"pate.public_size: must be in (0, {n_test}), got {public_size}")
    return np.arange(public_size), np.arange(public_size, n_test)


@dataclass(frozen=True)
class Pools:
    """The teachers' private data, the public pool, and what the student is evaluated on."""

    train_x: object
    train_y: object
    public_x: object
    public_y: object  # the pool's own labels: never shown to the student (a diagnostic)
    eval_x: object
    eval_y: object
    eval_split: str  # "test" or "validation"
    num_classes: int
    in_shape: tuple
    describe: str


def make_pools(data, public_size: int, held_out: int | None, evaluate_held_out: bool, seed: int):
    """Split ``data`` (a DatasetBundle) for PATE; ConfigError on a bad size. ``held_out``
    training examples are kept from the teachers, and the student is evaluated on them
    when ``evaluate_held_out`` (a tuning run), else on the test split's evaluation part."""
    import torch

    from dpsub.errors import ConfigError

    try:
        public, evaluation = public_split(len(data.test_y), public_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    public = torch.as_tensor(public)
    pub_x, pub_y = data.test_x[public], data.test_y[public]
    ev_x, ev_y = data.test_x[torch.as_tensor(evaluation)], data.test_y[torch.as_tensor(evaluation)]
    split = "test"
    if held_out:
        from dpsub.data.validation import carve_validation

        data = carve_validation(data, int(held_out), seed)  # test_* := held out
        if evaluate_held_out:
            ev_x, ev_y, split = data.test_x, data.test_y, "validation"
    return Pools(
        data.train_x, data.train_y, pub_x, pub_y, ev_x, ev_y, split,
        data.num_classes, tuple(data.in_shape), data.describe(),
    )  # fmt: skip
