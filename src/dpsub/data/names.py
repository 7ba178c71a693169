"""The dataset names (torch-free, for the config validator); ``datasets.LOADERS`` has one loader each."""

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar10_subset", "svhn", "synthetic")

_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
#: The files each dataset's loader reads under ``data.root`` (torchvision's layout; tests
#: keep them equal to the loaders'): (folder, files). digits and synthetic need none.
DATA_FILES = {
    "mnist": ("MNIST/raw", _MNIST_FILES),
    "fashion_mnist": ("FashionMNIST/raw", _MNIST_FILES),
    "cifar10": (
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta"),
    ),
    "cifar10_subset": ("cifar10_subset", ("cifar10_prefix_subset.npz",)),
    "svhn": ("svhn", ("train_32x32.mat", "test_32x32.mat")),
}


def missing_data(cfg) -> str | None:
    """Why ``cfg``'s dataset cannot load (its files are not under ``data.root``), or None.

    A file check only (no torch, nothing read): the loader still checks the contents.
    With ``data.download=true`` nothing is missing yet.
    """
    from pathlib import Path

    d = cfg.dataset
    if d.name not in DATA_FILES or cfg.data.download:
        return None
    root = Path(str(cfg.data.root))
    folder, files = DATA_FILES[d.name]
    files = files + (("extra_32x32.mat",) if d.name == "svhn" and d.get("use_extra") else ())
    dirs = [root / folder] + ([root] if d.name == "svhn" else [])  # svhn: also root itself

    def present(directory: Path, f: str) -> bool:
        return (directory / f).is_file() or (directory / f.removesuffix(".gz")).is_file()

    if any(all(present(dr, f) for f in files) for dr in dirs):
        return None
    lost = [f for f in files if not present(dirs[0], f)]
    return (
        f"dataset {d.name!r} not found: missing {', '.join(lost)} under {dirs[0]} "
        f"(data.root={root}); set data.root or DPSUB_DATA to the folder that holds it"
    )
