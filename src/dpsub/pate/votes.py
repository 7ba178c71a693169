"""The teachers' partition of the private data and their vote histograms (torch-free).

Sensitivity. Every teacher is a function of its own examples only
(:mod:`dpsub.pate.teachers`), so what matters is how many teachers' example sets change
between neighbouring training sets. Two partitions:

* ``hash`` (the default): example ``i`` goes to teacher ``H_key(bytes of x_i, y_i) mod T``,
  a keyed hash (BLAKE2b, the key derived from the teachers' seed) of the example's own
  content. Adding or removing one example changes no other example's teacher: exactly one
  teacher's example set changes (**add/remove neighbours**, sensitivity one teacher).
  Replacing one example is a removal plus an addition: up to two teachers change, so a
  replacement neighbour costs what two add/remove steps cost (group privacy of size 2).
  Teachers' sizes are multinomial (about ``n/T +- sqrt(n/T)``), not exactly equal: an
  assignment that depends on nothing but the example itself cannot be balanced exactly.
* ``permutation`` (runs made before the hash partition; their configs have no
  ``pate.partition``): a seeded balanced permutation of the *positions*, sizes within one.
  Replacing the example at one position changes one teacher (**replacement neighbours**);
  removing one shifts every later position and moves most examples to other teachers, so
  it makes no add/remove statement.

One changed teacher moves one vote per query: the histogram moves by -1 in one class and
+1 in another (L1 distance 2, L2 distance sqrt(2), and its maximum moves by at most 1).
The aggregators' noise is calibrated to exactly that.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from dpsub.rundir import private_file

PARTITIONS = ("hash", "permutation")
#: the neighbour relation each partition's epsilon is stated for (summary.json "neighbours")
NEIGHBOURS = {
    "hash": "add/remove one training example (one teacher changes)",
    "permutation": "replace the training example at one position (one teacher changes)",
}


def partition(n_examples: int, n_teachers: int, seed: int) -> np.ndarray:
    """The ``permutation`` partition: (N,) teacher of each position; sizes differ by <= 1."""
    _check_sizes(n_examples, n_teachers)
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0x9A7E])).permutation(n_examples)
    teacher_of = np.empty(n_examples, dtype=np.int64)
    teacher_of[perm] = np.arange(n_examples) % n_teachers
    return teacher_of


def hash_partition(rows, labels, n_teachers: int, seed: int) -> np.ndarray:
    """The ``hash`` partition: (N,) teacher of each example from its own bytes (x_i, y_i).

    ``rows`` (N, ...) and ``labels`` (N,) are arrays (numpy, or CPU tensors' ``.numpy()``).
    The teacher of an example depends on the key (``seed``) and that example alone."""
    rows = np.ascontiguousarray(rows).reshape(len(rows), -1)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    _check_sizes(len(rows), n_teachers)
    key = hashlib.blake2b(f"dpsub-pate-partition:{seed}".encode(), digest_size=32).digest()
    digests = [
        hashlib.blake2b(r.tobytes() + lab.tobytes(), key=key, digest_size=8).digest()
        for r, lab in zip(rows, labels, strict=True)
    ]
    h = np.frombuffer(b"".join(digests), dtype="<u8")
    return (h % np.uint64(n_teachers)).astype(np.int64)


def _check_sizes(n_examples: int, n_teachers: int) -> None:
    if not 0 < n_teachers <= n_examples:
        raise ValueError(f"need 0 < teachers <= examples, got {n_teachers} and {n_examples}")


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


def save_private(path: Path, array: np.ndarray) -> None:
    """``array`` to ``path`` (.npy) atomically, readable by its owner only (votes are
    computed from the private data without noise); the temporary name is this process's."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
    with private_file(tmp) as f:
        np.save(f, array)
    tmp.replace(path)
