"""Fake datasets in the layouts the loaders read (random pixels, real file formats)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def write_fake_cifar10(root: Path, per_batch: int = 20, n_test: int = 10) -> None:
    """CIFAR-10 in torchvision's python layout under ``root``: random pixels and labels."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        batch = {
            "batch_label": name,
            "labels": [int(v) for v in rng.integers(0, 10, n)],
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "filenames": [f"img{i}.png" for i in range(n)],
        }
        with open(d / name, "wb") as f:
            pickle.dump(batch, f)
    meta = {"num_cases_per_batch": per_batch, "num_vis": 3072, "label_names": [
        "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
    ]}  # fmt: skip
    with open(d / "batches.meta", "wb") as f:
        pickle.dump(meta, f)


def write_fake_cifar100(root: Path, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-100's training set in torchvision's python layout (``cifar-100-python/train``)
    under ``root``: random pixels ``(n, 3072)`` and fine labels, both returned."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    fine = rng.integers(0, 100, n).tolist()
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    with open(d / "train", "wb") as f:
        pickle.dump({b"data": data, b"fine_labels": fine, b"coarse_labels": [0] * n}, f)
    return data, np.asarray(fine)
