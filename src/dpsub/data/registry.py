"""The dataset registry: every fact about a dataset in one entry, readable without torch.

One :class:`DatasetSpec` per ``dataset.name``: the folder and files it reads under
``data.root`` (checked before torch is imported, :mod:`dpsub.data.files`), the sizes of the
official release (the cost model's N where the data is absent), whether a horizontal flip
keeps its labels (augmentation multiplicity), whether it reads the user's own data from
``dataset.path``, which ``dataset.*`` options it has, and the name of its loader in :mod:`dpsub.data.datasets` (imported with
torch). The config validator's choices (``dataset.name``), the file check, the
readers, the augmentation and the cost model all read this table, so a dataset is added here
once (and its loader written) and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REGISTRY", "DatasetSpec", "published_train_size", "spec"]

_IDX = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
_CIFAR10 = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
_SUBSET = ("train_size", "balanced")  # a class-balanced subset of the training split
_USER = ("path", "num_classes", "mean", "std", "image_size")  # your own data


@dataclass(frozen=True)
class DatasetSpec:
    """What dpsub knows of one dataset before reading it."""

    loader: str  #: the function in dpsub.data.datasets that reads it
    folder: str | None = None  #: its folder under data.root (None: no fixed files)
    files: tuple[str, ...] = ()  #: the files it reads there
    extra_files: tuple[str, ...] = ()  #: read too with dataset.use_extra (SVHN's 'extra')
    published: tuple[int, int] | None = None  #: (train, test) sizes of the official release
    extra_size: int = 0  #: examples dataset.use_extra adds
    flip: bool = False  #: a horizontal flip keeps the label (natural images, not digits)
    user_path: str | None = None  #: "file" / "folder": dataset.path names the user's data
    #: its ``dataset.*`` keys beside ``name`` and ``validation_size`` (defaults: config.DatasetSchema)
    options: tuple[str, ...] = ()
    doc: str = ""


REGISTRY: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(
        "_load_digits", options=("image_size",), doc="scikit-learn's bundled 8x8 digits (offline)"
    ),
    "mnist": DatasetSpec(
        "_load_mnist", "MNIST/raw", _IDX, published=(60_000, 10_000), options=_SUBSET
    ),
    "fashion_mnist": DatasetSpec(
        "_load_fashion_mnist", "FashionMNIST/raw", _IDX, published=(60_000, 10_000), options=_SUBSET
    ),
    "cifar10": DatasetSpec(
        "_load_cifar10", "cifar-10-batches-py", _CIFAR10, published=(50_000, 10_000), flip=True
    ),
    "cifar10_subset": DatasetSpec(
        "_load_cifar10_subset", "cifar10_subset", ("cifar10_prefix_subset.npz",), flip=True
    ),
    "svhn": DatasetSpec(
        "_load_svhn",
        "svhn",
        ("train_32x32.mat", "test_32x32.mat"),
        ("extra_32x32.mat",),
        published=(73_257, 26_032),
        extra_size=531_131,
        options=("use_extra",),
    ),  # fmt: skip
    "synthetic": DatasetSpec(
        "_load_synthetic", options=("synthetic",), doc="class patterns plus noise (no files)"
    ),
    "npz": DatasetSpec(
        "_load_npz",
        user_path="file",
        options=_USER,
        doc="your own arrays: x_train, y_train, x_test, y_test in dataset.path",
    ),  # fmt: skip
    "imagefolder": DatasetSpec(
        "_load_imagefolder",
        user_path="folder",
        options=_USER,
        doc="your own images: dataset.path/{train,test}/<class>/<image>",
    ),  # fmt: skip
}


def spec(name: str) -> DatasetSpec:
    if name not in REGISTRY:
        raise ValueError(f"Unknown dataset.name={name!r}; valid names: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def published_train_size(dataset: dict, aux: dict) -> int | None:
    """N of a run from the official release's size, for cost estimates where the data is
    absent: the train split (SVHN with ``use_extra``: plus 'extra'), less the validation
    and ``public_train`` auxiliary carve-outs; None for a dataset without a published size."""
    s = REGISTRY.get(dataset.get("name"))
    if s is None or s.published is None:
        return None
    n = s.published[0] + (s.extra_size if dataset.get("use_extra") else 0)
    n -= int(dataset.get("validation_size") or 0)
    if aux.get("name") == "public_train":
        n -= int(aux.get("num_samples") or 0)
    return n
