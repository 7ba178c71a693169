"""The teachers' partition of the private data and their vote histograms (torch-free).

Sensitivity. Example ``i`` of the private training set goes to teacher
``teacher_of[i]``, a function of the seed and the example's position only (a seeded
balanced permutation of the positions): it does not look at any example's content.
Changing (or removing) the example at one position therefore changes the training set of
exactly one teacher, so at most one teacher's vote changes on every query: the vote
histogram moves by -1 in one class and +1 in another (L1 distance 2, L2 distance
sqrt(2), and its maximum moves by at most 1). The aggregators' noise is calibrated to
exactly that.
"""

from __future__ import annotations

import numpy as np


def partition(n_examples: int, n_teachers: int, seed: int) -> np.ndarray:
    """``teacher_of``: (N,) teacher index of each example; disjoint, sizes differ by <= 1."""
    if not 0 < n_teachers <= n_examples:
        raise ValueError(f"need 0 < teachers <= examples, got {n_teachers} and {n_examples}")
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0x9A7E])).permutation(n_examples)
    teacher_of = np.empty(n_examples, dtype=np.int64)
    teacher_of[perm] = np.arange(n_examples) % n_teachers
    return teacher_of


def members(teacher_of: np.ndarray, n_teachers: int) -> list[np.ndarray]:
    """The example indices of each teacher, in increasing order."""
    order = np.argsort(teacher_of, kind="stable")
    bounds = np.searchsorted(teacher_of[order], np.arange(n_teachers + 1))
    return [order[bounds[t] : bounds[t + 1]] for t in range(n_teachers)]


def histograms(predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """Vote counts (Q, K) from the teachers' predicted labels (T, Q)."""
    preds = np.asarray(predictions, dtype=np.int64)
    if preds.ndim != 2 or preds.size and (preds.min() < 0 or preds.max() >= num_classes):
        raise ValueError(f"predictions must be (teachers, queries) labels in [0, {num_classes})")
    n_queries = preds.shape[1]
    flat = preds + num_classes * np.arange(n_queries)[None, :]
    counts = np.bincount(flat.ravel(), minlength=n_queries * num_classes)
    return counts.reshape(n_queries, num_classes)
