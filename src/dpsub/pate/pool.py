"""The student's public pool and the evaluation examples, both from the test split.

As in the PATE papers, the first ``public_size`` test examples are the student's
unlabeled public pool (the teachers vote on them; the student sees only the answered
labels); the rest are the evaluation examples. The two never overlap.
"""

from __future__ import annotations

import numpy as np


def public_split(n_test: int, public_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(public pool indices, evaluation indices) of a test split of ``n_test`` examples."""
    if not 0 < public_size < n_test:
        raise ValueError(f"pate.public_size: must be in (0, {n_test}), got {public_size}")
    return np.arange(public_size), np.arange(public_size, n_test)
