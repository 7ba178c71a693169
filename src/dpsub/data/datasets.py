"""Dataset loading: whole datasets as normalized in-memory tensors.

Every dataset used in the experiments is small enough to live in memory as one
tensor, so instead of ``Dataset``/``DataLoader`` objects ``load_dataset`` returns a
:class:`DatasetBundle` of float32 ``(N, C, H, W)`` tensors, already normalized.

Design notes

* One small loader per dataset, registered in :data:`LOADERS`. A loader returns the
  raw split (uint8 images, or floats already in their final range) plus the
  per-channel mean/std to normalize with: fixed constants, never statistics computed
  from the (private) training data at run time, which would reach the model without
  noise. :func:`load_dataset` does the shared work: optional ``train_size`` subset,
  optional resize, normalization.
* Files are read directly (IDX ``.gz`` files for MNIST-like data, the CIFAR-10
  python pickles, the SVHN ``.mat`` files) rather than through torchvision's
  dataset classes. This is fast (no per-item PIL loop), never writes to ``root``
  (a shared, read-only data folder stays untouched: torchvision's MNIST would extract
  the ``.gz`` files next to themselves), and avoids torchvision's md5 checks, so small
  hand-made copies in the same format load too. The expected files are checked
  *before* anything is read, and a missing file raises :class:`DatasetNotFoundError`.
  A file that is there but truncated or malformed raises :class:`~dpsub.errors.DataError`,
  one line naming it (the readers in :mod:`dpsub.data.readers` check each format).
* ``download=True`` uses torchvision's own downloaders (``MNIST(root, download=True)``
  etc., which verify md5s) only when files are missing; any failure is re-raised as
  :class:`DatasetNotFoundError` explaining where to put the files by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpsub.data.files import FIX_HINT
from dpsub.data.raw import _Raw
from dpsub.data.readers import (
    REDOWNLOAD,
    bad_file,
    read_cifar_batch,
    read_idx,
    read_npz,
    read_svhn_mat,
    unpickle,
)
from dpsub.data.registry import REGISTRY, spec
from dpsub.data.subsets import NotEnoughExamples, balanced_pick, random_pick
from dpsub.data.user import _load_imagefolder, _load_npz  # noqa: F401 (LOADERS, by name)
from dpsub.errors import DatasetNotFoundError

__all__ = [
    "DatasetBundle",
    "DatasetNotFoundError",
    "LOADERS",
    "load_dataset",
]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
]  # fmt: skip
DIGIT_CLASSES = [str(i) for i in range(10)]


# --------------------------------------------------------------------------- types


@dataclass
class DatasetBundle:
    """A whole dataset as normalized tensors (CPU unless moved with :meth:`to`)."""

    name: str
    train_x: torch.Tensor  # float32 (N, C, H, W), normalized
    train_y: torch.Tensor  # int64 (N,)
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    classes: list[str] | None
    mean: tuple[float, ...]  # per-channel normalization that was applied
    std: tuple[float, ...]
    eval_split: str = "test"  # what test_x / test_y hold: "test", or "validation" (tuning)
    features: str | None = None  # the frozen extractor the tensors come from (features/)

    @property
    def in_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))

    def to(self, device: torch.device | str) -> DatasetBundle:
        """A copy with all four tensors on ``device``."""
        return dataclasses.replace(
            self,
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            test_x=self.test_x.to(device),
            test_y=self.test_y.to(device),
        )

    def describe(self) -> str:
        c, h, w = self.in_shape
        return (
            f"{self.name}: train {len(self.train_y)}, {self.eval_split} {len(self.test_y)}, "
            f"shape {c}x{h}x{w}, {self.num_classes} classes"
        )


@contextlib.contextmanager
def downloading(what: str, root: Path, fix: str) -> Iterator[None]:
    """Any failure of a download (network, checksum, disk) as one DatasetNotFoundError:
    ``Downloading <what> into <root> failed (<error>). <fix>``."""
    try:
        yield
    except Exception as e:  # any failure means "no data"
        raise DatasetNotFoundError(
            f"Downloading {what} into {root} failed ({type(e).__name__}: {e}). {fix}"
        ) from e


def _require_files(
    name: str,
    directory: Path,
    files: list[str],
    source: str,
    *,
    root: Path,
    download: Callable[[], object] | None = None,
    present: Callable[[Path, str], bool] | None = None,
    downloadable: bool = True,
) -> None:
    """Raise DatasetNotFoundError unless every file exists in ``directory``.

    With a ``download`` callable, missing files are downloaded first and any error
    from it (network, checksum, ...) is converted into DatasetNotFoundError.
    """
    present = present or (lambda d, f: (d / f).is_file())

    def missing() -> list[str]:
        return [f for f in files if not present(directory, f)]

    if missing() and download is not None:
        fix = (f"Download it manually from {source} and place {', '.join(files)} under "
               f"{directory}, then set data.root={root} and data.download=false.")  # fmt: skip
        with downloading(f"dataset '{name}'", root, fix):
            download()
    lost = missing()
    if lost:
        raise DatasetNotFoundError(
            f"Dataset '{name}' not found: missing {', '.join(lost)} under {directory} "
            f"(searched data root {root}). These files come from {source}. "
            + (FIX_HINT if downloadable else FIX_HINT.split(", or set")[0] + ".")
        )


# ------------------------------------------------------------------------ loaders


#: Normalization of the digits: the pixel range [0, 1] mapped to [-1, 1]. A constant
#: of the value range, chosen without looking at any data, so no statistic of the
#: (private) training images reaches the model (their own mean/std would, unnoised).
DIGITS_MEAN, DIGITS_STD = (0.5,), (0.5,)


def _load_digits(root: Path, download: bool, **_: object) -> _Raw:
    """scikit-learn's bundled 8x8 digits, [0, 1], fixed stratified 80/20 split,
    normalized with the data-independent :data:`DIGITS_MEAN` / :data:`DIGITS_STD`."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]  # (1797, 1, 8, 8)
    y = d.target.astype(np.int64)
    idx_tr, idx_te = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    idx_tr, idx_te = np.sort(idx_tr), np.sort(idx_te)
    return _Raw(
        torch.from_numpy(x[idx_tr]), torch.from_numpy(y[idx_tr]),
        torch.from_numpy(x[idx_te]), torch.from_numpy(y[idx_te]),
        classes=DIGIT_CLASSES, num_classes=10, mean=DIGITS_MEAN, std=DIGITS_STD,
        default_size=28,
    )  # fmt: skip


def _idx_path(raw_dir: Path, gz_name: str) -> Path | None:
    """The extracted file if present, else the .gz, else None."""
    for p in (raw_dir / gz_name.removesuffix(".gz"), raw_dir / gz_name):
        if p.is_file():
            return p
    return None


def _mnist_like(tv_name: str, name: str, root: Path, download: bool, mean, std, classes) -> _Raw:
    import torchvision

    tv_cls = getattr(torchvision.datasets, tv_name)
    raw_dir = root / tv_name / "raw"
    files = [f for f, _md5 in tv_cls.resources]
    _require_files(
        name, raw_dir, files,
        f"torchvision.datasets.{tv_name} ({tv_cls.mirrors[0]})",
        root=root,
        download=(lambda: tv_cls(str(root), train=True, download=True)) if download else None,
        present=lambda d, f: _idx_path(d, f) is not None,
    )  # fmt: skip
    paths = [_idx_path(raw_dir, f) for f in files]  # train images, labels, test images, labels
    tr_x, tr_y, te_x, te_y = (torch.from_numpy(read_idx(p, root)) for p in paths)
    _check_image_label_pair(tr_x, tr_y, paths[0], paths[1], root)
    _check_image_label_pair(te_x, te_y, paths[2], paths[3], root)
    return _Raw(
        tr_x[:, None], tr_y.long(), te_x[:, None], te_y.long(),
        classes=classes, num_classes=10, mean=mean, std=std,
    )  # fmt: skip


def _load_mnist(root: Path, download: bool, **_: object) -> _Raw:
    return _mnist_like("MNIST", "mnist", root, download, (0.1307,), (0.3081,), DIGIT_CLASSES)


def _load_fashion_mnist(root: Path, download: bool, **_: object) -> _Raw:
    import torchvision

    classes = list(torchvision.datasets.FashionMNIST.classes)
    return _mnist_like(
        "FashionMNIST", "fashion_mnist", root, download, (0.2860,), (0.3530,), classes
    )


def _check_image_label_pair(x, y, x_path: Path, y_path: Path, root: Path) -> None:
    """IDX images (n, H, W) and labels (n,) that belong together."""
    if x.ndim != 3:
        raise bad_file(x_path, root, f"expected images of shape (n, H, W), got {tuple(x.shape)}")
    if tuple(y.shape) != (len(x),):
        problem = f"expected {len(x)} labels (one per image of {x_path.name}), got {len(y)}"
        raise bad_file(y_path, root, problem)


def _load_cifar10(root: Path, download: bool, **_: object) -> _Raw:
    """The CIFAR-10 python batches in root/cifar-10-batches-py, read directly."""
    import torchvision

    tv = torchvision.datasets.CIFAR10
    directory = root / tv.base_folder
    train_files = [f for f, _md5 in tv.train_list]
    test_files = [f for f, _md5 in tv.test_list]
    _require_files(
        "cifar10", directory, train_files + test_files + [tv.meta["filename"]],
        f"torchvision.datasets.CIFAR10 ({tv.url}, extracted)",
        root=root,
        download=(lambda: tv(str(root), train=True, download=True)) if download else None,
    )  # fmt: skip

    def read(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        batches = [read_cifar_batch(directory / n, root) for n in names]
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
        return torch.from_numpy(x), torch.from_numpy(y)

    tr_x, tr_y = read(train_files)
    te_x, te_y = read(test_files)
    classes = _class_names(directory / tv.meta["filename"], tv.meta["key"], root)
    return _Raw(
        tr_x, tr_y, te_x, te_y, classes=classes, num_classes=10,
        mean=CIFAR10_MEAN, std=CIFAR10_STD,
    )  # fmt: skip


def _class_names(path: Path, key: str, root: Path, hint: str = REDOWNLOAD) -> list[str]:
    """The class names in a CIFAR ``batches.meta`` pickle."""
    names = unpickle(path, root, hint).get(key)
    if not isinstance(names, list) or len(names) != 10:
        raise bad_file(path, root, f"'{key}' must be a list of 10 class names", hint)
    return [str(n) for n in names]


def _read_cifar10_subset(path: Path, root: Path, hint: str):
    """Images (n, 3, 32, 32) uint8, labels (n,) int64 and a test-split mask (n,)."""
    arrays = read_npz(path, root, ("data", "labels", "batch"), hint)
    data, labels, batch = arrays["data"], arrays["labels"], arrays["batch"]
    if data.dtype != np.uint8 or data.ndim != 4 or data.shape[1:] != (3, 32, 32):
        problem = f"'data' must be uint8 (n, 3, 32, 32), got {data.dtype} {data.shape}"
        raise bad_file(path, root, problem, hint)
    n = len(data)
    if labels.shape != (n,) or batch.shape != (n,) or labels.dtype.kind not in "iu":
        problem = f"'labels' and 'batch' must hold {n} entries each: {labels.shape}, {batch.shape}"
        raise bad_file(path, root, problem, hint)
    if batch.dtype.kind in "US":
        is_test = np.char.find(batch.astype(str), "test") >= 0
    else:
        is_test = batch.astype(np.int64) == 6
    return data, labels.astype(np.int64), is_test


def _load_cifar10_subset(root: Path, download: bool, **_: object) -> _Raw:
    """The partial CIFAR-10 npz: the first images of each python batch.

    ``batch`` holds the batch names (``data_batch_1`` .. ``data_batch_5``,
    ``test_batch``); the numbers 1-5 / 6 are accepted as well.
    """
    directory = root / "cifar10_subset"
    fname = "cifar10_prefix_subset.npz"
    _require_files(
        "cifar10_subset", directory, [fname],
        "the project's shared data folder (shared/data/cifar10_subset; it cannot be "
        "downloaded, use dataset.name=cifar10 for the full dataset)",
        root=root, downloadable=False,
    )  # fmt: skip
    hint = "copy it again or fix data.root"
    data, labels, is_test = _read_cifar10_subset(directory / fname, root, hint)
    meta = directory / "batches.meta"
    classes = _class_names(meta, "label_names", root, hint) if meta.is_file() else CIFAR10_CLASSES
    return _Raw(
        torch.from_numpy(data[~is_test]), torch.from_numpy(labels[~is_test]),
        torch.from_numpy(data[is_test]), torch.from_numpy(labels[is_test]),
        classes=classes, num_classes=10, mean=CIFAR10_MEAN, std=CIFAR10_STD,
    )  # fmt: skip


def _read_svhn(path: Path, root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = read_svhn_mat(path, root)
    return torch.from_numpy(x), torch.from_numpy(y)


def _load_svhn(root: Path, download: bool, use_extra: bool = False, **_: object) -> _Raw:
    """SVHN cropped digits from root/svhn (or root itself), .mat files read directly.

    ``use_extra`` appends the 531,131 'extra' images to the training set (as GEP does).
    """
    import torchvision

    tv = torchvision.datasets.SVHN
    splits = ["train", "test"] + (["extra"] if use_extra else [])
    files = {s: tv.split_list[s][1] for s in splits}
    # Prefer root/svhn; accept files placed directly in root (torchvision's own layout).
    directory = root / "svhn"
    if not (directory / files["train"]).is_file() and (root / files["train"]).is_file():
        directory = root

    def fetch() -> None:
        for s in splits:
            if not (directory / files[s]).is_file():
                tv(str(directory), split=s, download=True)

    _require_files(
        "svhn", directory, list(files.values()),
        f"torchvision.datasets.SVHN ({tv.split_list['train'][0].rsplit('/', 1)[0]}/); "
        f"put them in {root / 'svhn'} or directly in {root}",
        root=root, download=fetch if download else None,
    )  # fmt: skip
    tr_x, tr_y = _read_svhn(directory / files["train"], root)
    te_x, te_y = _read_svhn(directory / files["test"], root)
    if use_extra:
        ex_x, ex_y = _read_svhn(directory / files["extra"], root)
        tr_x, tr_y = torch.cat([tr_x, ex_x]), torch.cat([tr_y, ex_y])
    return _Raw(
        tr_x, tr_y, te_x, te_y, classes=DIGIT_CLASSES, num_classes=10,
        mean=(0.4377, 0.4438, 0.4728), std=(0.1980, 0.2010, 0.1970),
    )  # fmt: skip


SYNTHETIC_DEFAULTS = {
    "n_train": 2000,
    "n_test": 500,
    "channels": 1,
    "size": 28,
    "num_classes": 10,
    "seed": 0,
    "noise": 1.0,  # std of the per-pixel Gaussian noise; the class patterns have std ~1
}


def _load_synthetic(root: Path, download: bool, synthetic: dict | None = None, **_: object) -> _Raw:
    """Class-dependent smooth mean patterns plus Gaussian noise (no files).

    Each class has a random 4x4 pattern per channel, upsampled to ``size``; an image
    is its class pattern plus i.i.d. noise. Deterministic in ``synthetic.seed``.
    Normalized with the generator's own distribution (:func:`_mixture_stats`), not
    with statistics of the drawn samples.
    """
    cfg = dict(SYNTHETIC_DEFAULTS)
    unknown = set(synthetic or {}) - set(cfg)
    if unknown:
        raise ValueError(f"Unknown dataset.synthetic keys {sorted(unknown)}; valid: {sorted(cfg)}")
    cfg.update(synthetic or {})
    k, c, s = int(cfg["num_classes"]), int(cfg["channels"]), int(cfg["size"])
    g = torch.Generator().manual_seed(int(cfg["seed"]))
    coarse = torch.randn(k, c, 4, 4, generator=g)
    patterns = F.interpolate(coarse, size=(s, s), mode="bilinear", align_corners=False)
    patterns = patterns / patterns.flatten(1).std(dim=1).view(k, 1, 1, 1)

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % k
        y = y[torch.randperm(n, generator=g)]
        x = patterns[y] + float(cfg["noise"]) * torch.randn(n, c, s, s, generator=g)
        return x, y

    tr_x, tr_y = sample(int(cfg["n_train"]))
    te_x, te_y = sample(int(cfg["n_test"]))
    mean, std = _mixture_stats(patterns, float(cfg["noise"]))
    return _Raw(tr_x, tr_y, te_x, te_y, classes=None, num_classes=k, mean=mean, std=std)


def _mixture_stats(patterns: torch.Tensor, noise: float) -> tuple[tuple[float, ...], ...]:
    """Per-channel mean and std of the synthetic distribution: an equal mixture of
    the class patterns ``(k, C, H, W)`` (pixel position uniform) plus N(0, noise^2)
    pixel noise. Exact, from the generator's parameters alone."""
    per_channel = patterns.transpose(0, 1).flatten(1).double()  # (C, k * H * W)
    var = per_channel.var(dim=1, unbiased=False) + noise**2
    return tuple(per_channel.mean(dim=1).tolist()), tuple(var.sqrt().tolist())


#: one loader per entry of the dataset registry, by the name the entry gives
LOADERS: dict[str, Callable[..., _Raw]] = {n: globals()[s.loader] for n, s in REGISTRY.items()}


# ------------------------------------------------------------------ shared steps


def _subset_indices(
    y: torch.Tensor, train_size: int, num_classes: int, balanced: bool, seed: int
) -> torch.Tensor:
    """Deterministic (in ``seed``) subset of ``train_size`` indices, sorted.

    Balanced: ``train_size // num_classes`` per class, the remainder spread one
    each over the first classes (:func:`~dpsub.data.subsets.balanced_pick`).
    """
    n = len(y)
    if train_size > n:
        raise ValueError(f"dataset.train_size={train_size} exceeds the training set size {n}")
    if train_size <= 0:
        raise ValueError(f"dataset.train_size must be positive, got {train_size}")
    g = torch.Generator().manual_seed(seed)
    if not balanced:
        return random_pick(n, train_size, g)
    try:
        return balanced_pick(y, train_size, num_classes, g)
    except NotEnoughExamples as e:
        raise ValueError(
            f"dataset.train_size={train_size} with dataset.balanced=true needs {e.want} examples "
            f"of class {e.cls}, but the training set has only {e.have}; lower "
            "dataset.train_size or set dataset.balanced=false"
        ) from None


def _to_float(x: torch.Tensor, size: int | None) -> torch.Tensor:
    """uint8 -> float32 in [0, 1] (floats pass through), then resize to size x size."""
    x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        shrink = size < max(x.shape[-2:])
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink
        )
    return x.contiguous()


def _normalize_(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    shape = (1, len(mean), 1, 1)
    x.sub_(torch.tensor(mean, dtype=x.dtype).view(shape))
    x.div_(torch.tensor(std, dtype=x.dtype).view(shape))


def load_dataset(
    name: str,
    root: str | Path,
    download: bool = False,
    train_size: int | None = None,
    balanced: bool = True,
    seed: int = 0,
    image_size: int | None = None,
    use_extra: bool = False,
    synthetic: dict | None = None,
    user: dict | None = None,
) -> DatasetBundle:
    """Load dataset ``name`` from ``root`` as a normalized, CPU :class:`DatasetBundle`.

    Args:
        name: one of :data:`LOADERS` (digits, mnist, fashion_mnist, cifar10,
            cifar10_subset, svhn, synthetic).
        root: data folder (torchvision layout); unused by digits and synthetic.
        download: download missing files with torchvision (needs internet).
        train_size: keep only this many training examples (test set untouched).
        balanced: with ``train_size``, take ``train_size / num_classes`` per class.
        seed: seed of the ``train_size`` subset.
        image_size: resize images to ``image_size`` x ``image_size`` (bilinear).
        use_extra: svhn only, append the 'extra' split to the training set.
        synthetic: options of the synthetic dataset (n_train, n_test, channels,
            size, num_classes, seed, noise).
        user: npz / imagefolder (your own data): path, num_classes, mean, std
            (:mod:`dpsub.data.user`).
    """
    spec(name)  # an unknown name: ValueError naming the valid ones
    if use_extra and name != "svhn":
        raise ValueError(f"dataset.use_extra=true is only supported for svhn, not {name!r}")
    root = Path(root).expanduser()
    raw = LOADERS[name](
        root, download, use_extra=use_extra, synthetic=synthetic, user=user, image_size=image_size
    )
    size = image_size if image_size is not None else raw.default_size

    train_x, train_y, mean, std = raw.train_x, raw.train_y.long(), raw.mean, raw.std
    if len(mean) != train_x.shape[1] or len(std) != train_x.shape[1]:
        raise ValueError(f"{name}: mean/std {mean}/{std} do not match {train_x.shape[1]} channels")
    if train_size is not None:
        idx = _subset_indices(train_y, int(train_size), raw.num_classes, balanced, seed)
        train_x, train_y = train_x[idx], train_y[idx]
    train_x = _to_float(train_x, size)
    test_x = _to_float(raw.test_x, size)
    _normalize_(train_x, mean, std)
    _normalize_(test_x, mean, std)
    return DatasetBundle(
        name=name,
        train_x=train_x,
        train_y=train_y.contiguous(),
        test_x=test_x,
        test_y=raw.test_y.long().contiguous(),
        num_classes=raw.num_classes,
        classes=raw.classes,
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
    )
