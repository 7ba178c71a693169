"""The public CIFAR-100 images the features group reads: ``features.norm_path`` (the
``public`` normalization's statistics) and ``features.pretrain_path`` (``cifar100_resnet``).

Null means the first of :data:`dpsub.data.files.FEATURES_DEFAULT_FILES` under data.root:
torchvision's CIFAR-100 training set (fetched when ``data.download=true``) or an npz of its
first 10,000 images in their order. Either gives the same first ``n`` images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpsub.data.files import features_file, no_public_images

#: images of torchvision's CIFAR-100 training set a pretraining reads (the npz default's count)
PRETRAIN_IMAGES = 10_000


def public_file(opts: dict, key: str, root: Path, download: bool = False) -> Path:
    """The file ``features.<key>`` reads (downloading CIFAR-100 when asked and missing)."""
    file = features_file(opts, key, root)
    if file is None and download:
        from dpsub.data.aux import download_cifar100
        from dpsub.data.files import CIFAR100_TRAIN

        download_cifar100(root, f"data.download=true, for features.{key}", "data.download=false")
        file = root / CIFAR100_TRAIN
    if file is None:
        raise no_public_images(opts, key, root)
    return file


def read_public(file: Path, root: Path, n: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The first ``n`` (None: all) images ``(n, H, W, 3)`` uint8 of ``file`` and their labels
    (None where an npz has none): an npz with ``images`` (and ``labels``), or a CIFAR-100
    python pickle (``fine_labels``)."""
    if file.suffix == ".npz":
        with np.load(file) as f:
            labels = f["labels"][:n] if "labels" in f.files else None
            return f["images"][:n], labels
    from dpsub.data.readers import read_cifar_batch

    images, labels = read_cifar_batch(file, root, "fine_labels", "re-download it or fix data.root")
    return images[:n].transpose(0, 2, 3, 1), labels[:n]
