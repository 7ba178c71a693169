"""Auxiliary (public or non-sensitive) data for subspace methods.

GEP computes its gradient subspace from the per-example gradients of m auxiliary
samples ("anchor" gradients); PDP-SGD from the gradients of a small public set.
:func:`build_aux` turns the ``aux`` config group into an :class:`AuxData` of m
examples in the private data's shape and normalization.

The sources (``natural``, ``cifar100``, ``heldout_test``, ``public_train``,
``gaussian``; ``none`` for no auxiliary data) are declared in
:data:`dpsub.data.aux_options.AUX_SOURCES` with their options, defaults, labels and
a one-line summary each; this module holds their loaders, registered with
``@source(name)`` in :data:`AUX_LOADERS` (only declared names are accepted).

Sources that take their samples from the private dataset's splits remove them
from the private set or from the evaluation set, so an auxiliary example is never
trained on privately nor evaluated on.

Image conversion (natural, cifar100): RGB -> grayscale with the ITU-R 601 luma
weights (0.299, 0.587, 0.114) when the private data has one channel (grayscale is
repeated to three channels when it has three), bilinear resize (antialiased) to the
private H x W, scaling to [0, 1] and normalization with the private data's
per-channel ``mean`` / ``std``.

Labels (``aux.labels``, see :data:`LABEL_MODES`): ``random_per_step`` redraws random
labels in [0, num_classes) at every use (GEP paper), ``random_once`` draws them once,
deterministically from the seed (GEP's official code), ``true`` uses the source's own
labels (heldout_test, public_train, and cifar100 when the private data has 100 classes).

Selection of the m examples is random without replacement and deterministic in
``aux.seed`` (default: the run seed); heldout_test and public_train select
class-balanced subsets with :func:`dpsub.data.subsets.balanced_pick` (the picker
of ``dataset.train_size``; a class with too few examples gives all it has and the
rest is drawn from the other classes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpsub.data.aux_options import (
    AUX_SOURCES,
    LABEL_MODES,
    NATURAL_DEFAULT_FILE,
    aux_options,
    check_aux_config,
    label_mode,
)
from dpsub.data.datasets import DatasetBundle, downloading
from dpsub.data.readers import bad_file, read_cifar_batch, read_npz
from dpsub.data.subsets import balanced_pick, random_pick
from dpsub.errors import ConfigError, DataError, DatasetNotFoundError

__all__ = [
    "AUX_LOADERS",
    "AUX_SOURCES",
    "LABEL_MODES",
    "AuxData",
    "build_aux",
    "check_aux_config",
    "convert_images",
    "source",
]

# torchvision.datasets.CIFAR100's layout (not imported unless downloading: it is slow)
CIFAR100_FOLDER = "cifar-100-python"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R BT.601


@dataclass
class AuxData:
    """m auxiliary examples in the private data's shape and normalization."""

    x: torch.Tensor  # (m, C, H, W) float32, normalized like the private data
    y: torch.Tensor | None  # true labels where the source has them (int64, (m,))
    num_classes: int
    source: str
    labels: str = "random_per_step"  # see LABEL_MODES
    fixed_labels: torch.Tensor | None = None  # drawn once (labels == "random_once")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def to(self, device) -> AuxData:
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return AuxData(
            mv(self.x),
            mv(self.y),
            self.num_classes,
            self.source,
            self.labels,
            mv(self.fixed_labels),
        )

    def batch_labels(self, generator: torch.Generator) -> torch.Tensor:
        """Labels for one use of the anchor set: fresh random (paper), fixed random
        (authors' code) or true."""
        if self.labels == "true":
            if self.y is None:
                raise ValueError(f"aux.labels=true but aux source {self.source!r} has no labels")
            return self.y
        if self.labels == "random_once":
            return self.fixed_labels
        return torch.randint(
            0, self.num_classes, (len(self),), generator=generator, device=self.x.device
        )

    def describe(self) -> str:
        c, h, w = self.x.shape[1:]
        return f"aux {self.source}: {len(self)} examples, shape {c}x{h}x{w}, labels {self.labels}"


# ------------------------------------------------------------ conversion


def convert_images(
    images: torch.Tensor,
    in_shape: tuple[int, int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> torch.Tensor:
    """Images (n, C, H, W), uint8 in [0, 255] or float in [0, 1], to the private
    data's ``in_shape`` and normalization: float32 (n, *in_shape)."""
    c, h, w = in_shape
    x = images.float().div(255.0) if images.dtype == torch.uint8 else images.float()
    if x.ndim != 4:
        raise ValueError(f"expected images of shape (n, C, H, W), got {tuple(x.shape)}")
    src_c = x.shape[1]
    if src_c != c:
        if src_c == 3 and c == 1:
            wts = torch.tensor(LUMA_WEIGHTS, dtype=x.dtype).view(1, 3, 1, 1)
            x = (x * wts).sum(dim=1, keepdim=True)
        elif src_c == 1:
            x = x.expand(-1, c, -1, -1)
        else:
            raise ValueError(f"cannot convert {src_c}-channel images to {c} channels")
    if tuple(x.shape[-2:]) != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    shape = (1, len(mean), 1, 1)
    mean_t = torch.tensor(mean, dtype=x.dtype).view(shape)
    std_t = torch.tensor(std, dtype=x.dtype).view(shape)
    return ((x - mean_t) / std_t).contiguous()


# ------------------------------------------------------------- selection


def _generator(seed: int, stream: int) -> torch.Generator:
    """Independent, deterministic generators per (seed, stream)."""
    state = np.random.SeedSequence([int(seed) % 2**64, stream]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


_SELECT, _LABELS = 0, 1  # streams: selection (and gaussian noise), random_once labels
_PUBLIC_KEY = 104729  # public_train's hash pick: seed-free (every run the same public part)


def _check_count(m: int, available: int, what: str) -> None:
    if m > available:
        raise ConfigError(
            f"aux.num_samples: {m} exceeds the {available} examples available in {what}; "
            "lower aux.num_samples"
        )


def _complement(n: int, idx: torch.Tensor) -> torch.Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[idx] = False
    return keep


# --------------------------------------------------------------- sources
# Each loader returns (x, y, data): the aux images in the private shape and
# normalization, their true labels (or None) and the (possibly reduced) data.

_Sample = tuple[torch.Tensor, "torch.Tensor | None", DatasetBundle]
_Loader = Callable[..., _Sample]

#: The loader of each declared auxiliary data source (``none`` aside), called as
#: ``loader(data, num_samples, generator, root, **source_options)``.
AUX_LOADERS: dict[str, _Loader] = {}


def source(name: str) -> Callable[[_Loader], _Loader]:
    """Register the decorated function as the loader of the aux source ``name``,
    which must be declared in :data:`~dpsub.data.aux_options.AUX_SOURCES`."""
    if name not in AUX_SOURCES:
        raise ValueError(
            f"aux source {name!r} is not declared in dpsub.data.aux_options.AUX_SOURCES "
            f"(declared: {list(AUX_SOURCES)})"
        )
    if name in AUX_LOADERS:
        raise ValueError(f"aux source {name!r} already has a loader")

    def register(loader: _Loader) -> _Loader:
        AUX_LOADERS[name] = loader
        return loader

    return register


def _resolve_path(path: str | Path | None, root: Path, default: str) -> Path:
    if path is None:
        return root / default
    text = str(path)
    if "${data.root}" in text:  # an unresolved interpolation from a plain dict
        text = text.replace("${data.root}", str(root))
    return Path(text).expanduser()


def _read_image_npz(
    file: Path, root: Path, hint: str, num_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``images`` (n, H, W, C) uint8 of an .npz and, with ``num_classes``, its ``labels``
    (n,) in [0, num_classes) when the file has them (else None)."""
    images = read_npz(file, root, ("images",), hint)["images"]
    if images.ndim == 3:
        images = images[..., None]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        problem = (
            "'images' must be uint8 of shape (n, H, W, 3) or (n, H, W), "
            f"got {images.dtype} {images.shape}"
        )
        raise bad_file(file, root, problem, hint)
    if num_classes is None or "labels" not in _npz_keys(file):
        return images, None
    labels = read_npz(file, root, ("labels",), hint)["labels"]
    ok = labels.shape == (len(images),) and np.issubdtype(labels.dtype, np.integer)
    if not ok or (len(labels) and not 0 <= labels.min() <= labels.max() < num_classes):
        problem = (
            f"'labels' must be {len(images)} integers in [0, {num_classes}), "
            f"got {labels.dtype} {labels.shape}"
        )
        raise bad_file(file, root, problem, hint)
    return images, labels.astype(np.int64)


def _npz_keys(file: Path) -> list[str]:
    with np.load(file, allow_pickle=False) as npz:
        return list(npz.files)


def _pick_images(images: np.ndarray, idx: np.ndarray, data: DatasetBundle) -> torch.Tensor:
    """Images ``idx`` of an (n, H, W, C) uint8 array, converted to the private data's form."""
    x = torch.from_numpy(np.ascontiguousarray(images[idx])).permute(0, 3, 1, 2)
    return convert_images(x, data.in_shape, data.mean, data.std)


@source("natural")
def _load_natural(
    data: DatasetBundle, num_samples: int, generator: torch.Generator, root: Path,
    path: str | Path | None = None,
) -> _Sample:  # fmt: skip
    file = _resolve_path(path, root, NATURAL_DEFAULT_FILE)
    if not file.is_file():
        raise DatasetNotFoundError(
            f"Auxiliary natural images not found: {file} (set by aux.path; default "
            f"<data.root>/{NATURAL_DEFAULT_FILE}). Expected an .npz with key 'images': "
            "uint8 RGB images of shape (n, H, W, 3), e.g. downsampled ImageNet (ImageNet32) "
            "images; point aux.path at such a file, or set data.root to the folder that holds "
            f"{NATURAL_DEFAULT_FILE}."
        )
    images, _ = _read_image_npz(file, root, "fix the file, or point aux.path at another one")
    _check_count(num_samples, len(images), str(file))
    idx = random_pick(len(images), num_samples, generator).numpy()
    return _pick_images(images, idx, data), None, data


def _load_cifar100_npz(
    data: DatasetBundle, num_samples: int, generator: torch.Generator, root: Path, path
) -> _Sample:
    """aux.name=cifar100 with aux.path: CIFAR-100 images (and fine labels) from an .npz."""
    file = _resolve_path(path, root, "")
    if not file.is_file():
        raise DatasetNotFoundError(
            f"Auxiliary dataset CIFAR-100 (aux.name=cifar100) not found: aux.path={file} is "
            "not a file; point aux.path at an .npz with 'images' (n, 32, 32, 3) uint8 and "
            "'labels' (0-99), or set aux.path=null for torchvision's layout under data.root"
        )
    hint = "fix the file, or point aux.path at another one"
    images, labels = _read_image_npz(file, root, hint, num_classes=100)
    _check_count(num_samples, len(images), f"CIFAR-100 ({file})")
    idx = random_pick(len(images), num_samples, generator).numpy()
    y = None if labels is None else torch.from_numpy(labels[idx])
    return _pick_images(images, idx, data), y, data


@source("cifar100")
def _load_cifar100(
    data: DatasetBundle, num_samples: int, generator: torch.Generator, root: Path,
    path: str | Path | None = None, download: bool = False,
) -> _Sample:  # fmt: skip
    if path is not None:
        return _load_cifar100_npz(data, num_samples, generator, root, path)
    directory = root / CIFAR100_FOLDER
    train_file = "train"
    file = directory / train_file
    if not file.is_file() and download:
        download_cifar100(root, "aux.name=cifar100, aux.download=true", "aux.download=false")
    if not file.is_file():
        raise DatasetNotFoundError(
            f"Auxiliary dataset CIFAR-100 (aux.name=cifar100) not found: missing {file} "
            f"(torchvision's layout {CIFAR100_FOLDER}/{train_file} under data.root={root}). "
            f"It comes from torchvision.datasets.CIFAR100 ({CIFAR100_URL}, extracted). Set "
            "data.root to the folder that holds it, or aux.download=true on a machine with "
            "internet access."
        )
    hint = "re-download it (aux.download=true) or fix data.root"
    images, labels = read_cifar_batch(file, root, "fine_labels", hint)
    _check_count(num_samples, len(images), f"CIFAR-100 train ({directory / train_file})")
    idx = random_pick(len(images), num_samples, generator).numpy()
    x = convert_images(torch.from_numpy(images[idx]), data.in_shape, data.mean, data.std)
    return x, torch.from_numpy(labels[idx]), data


def download_cifar100(root: Path, why: str, then: str) -> None:
    """torchvision's CIFAR-100 into ``root`` (``cifar-100-python/``); DatasetNotFoundError
    naming ``why`` (the option that asked) and ``then`` (what to set afterwards) on failure."""
    fix = (f"Download {CIFAR100_URL} by hand and extract it so that "
           f"{root / CIFAR100_FOLDER / 'train'} exists, then set {then}.")  # fmt: skip
    with downloading(f"CIFAR-100 ({why})", root, fix):
        import torchvision  # only to download (verifies the archive's md5)

        torchvision.datasets.CIFAR100(str(root), train=True, download=True)


def _split_off(
    data: DatasetBundle, split: str, num_samples: int, generator: torch.Generator, what: str
) -> _Sample:
    """Take a class-balanced slice of ``split`` ("train" / "test") and remove it from ``data``."""
    xs, ys = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
    _check_count(num_samples, len(ys) - 1, f"the {split} split of {data.name} ({what})")
    idx = balanced_pick(ys, num_samples, data.num_classes, generator, fill=True)
    keep = _complement(len(ys), idx)
    rest = dataclasses.replace(data, **{f"{split}_x": xs[keep], f"{split}_y": ys[keep]})
    return xs[idx].clone(), ys[idx].clone(), rest


@source("heldout_test")
def _load_heldout_test(
    data: DatasetBundle, num_samples: int, generator: torch.Generator, root: Path
) -> _Sample:
    return _split_off(data, "test", num_samples, generator, "leaving >= 1 to evaluate on")


@source("public_train")
def _load_public_train(
    data: DatasetBundle, num_samples: int, generator: torch.Generator, root: Path, pick: str
) -> _Sample:
    """``pick=hash``: each training example is public when a hash of its own bytes falls
    below m / N, so one added or removed private example moves no other between the public
    and private parts (about m, the same for every seed). ``balanced``: exactly m,
    class-balanced, chosen with every private label (a membership test on the released
    model; the run is marked not covered)."""
    if pick == "balanced":
        return _split_off(data, "train", num_samples, generator, "leaving >= 1 private example")
    from dpsub.data.validation import hashed_pick

    n = len(data.train_y)
    _check_count(
        num_samples, n - 1, f"the train split of {data.name} (leaving >= 1 private example)"
    )
    idx = hashed_pick(data.train_x, data.train_y, num_samples / n, _PUBLIC_KEY)
    if not 1 <= len(idx) < n:
        raise ConfigError(f"aux.num_samples: the hash pick made {len(idx)} of {n} training "
                          "examples public; give a larger num_samples")  # fmt: skip
    keep = _complement(n, idx)
    rest = dataclasses.replace(data, train_x=data.train_x[keep], train_y=data.train_y[keep])
    return data.train_x[idx].clone(), data.train_y[idx].clone(), rest


@source("gaussian")
def _load_gaussian(
    data: DatasetBundle, num_samples: int, generator: torch.Generator, root: Path
) -> _Sample:
    x = torch.randn((num_samples, *data.in_shape), generator=generator)
    return x, None, data


# ------------------------------------------------------------------ entry


def build_aux(cfg, data: DatasetBundle, root: str, seed: int):
    """Return ``(aux, data)``: the auxiliary set (or None) and the possibly reduced data.

    ``cfg`` is the ``aux`` config group (an OmegaConf node or a dict); ``data`` the
    private dataset on the CPU; ``root`` the data root (``data.root``); ``seed`` the
    run seed, used for the selection and for ``random_once`` labels unless
    ``aux.seed`` is set. heldout_test / public_train return ``data`` with the
    auxiliary examples removed from its test / train split.
    """
    opts = aux_options(cfg)
    check_aux_config(opts)
    name = opts.pop("name", "none")
    if name == "none":
        return None, data
    declared = AUX_SOURCES[name]
    o = {**declared.defaults, **opts}
    labels = label_mode(o.pop("labels"))
    m = int(o.pop("num_samples"))
    aux_seed = o.pop("seed")
    aux_seed = int(seed if aux_seed is None else aux_seed)

    src_classes = declared.num_classes or data.num_classes
    if labels == "true" and src_classes != data.num_classes:
        raise ConfigError(
            f"aux.labels: 'true' uses the {src_classes} classes of aux source {name}, but "
            f"{data.name} has {data.num_classes}; use random_per_step or random_once"
        )

    x, y, data = AUX_LOADERS[name](
        data,
        num_samples=m,
        generator=_generator(aux_seed, _SELECT),
        root=Path(root).expanduser(),
        **o,
    )
    assert x.shape[1:] == data.in_shape and (len(x) == m or name == "public_train"), x.shape
    m = len(x)  # (public_train's hash pick: about m)
    if labels == "true" and y is None:  # e.g. a cifar100 aux.path file without 'labels'
        raise DataError(
            f"aux.labels: 'true' but aux source {name} read no labels "
            f"(aux.path={o.get('path')} has no 'labels' array); use random_per_step or "
            "random_once, or a file with 'labels'"
        )
    fixed = None
    if labels == "random_once":
        fixed = torch.randint(0, data.num_classes, (m,), generator=_generator(aux_seed, _LABELS))
    aux = AuxData(
        x=x.float().contiguous(),
        y=None if y is None else y.long().contiguous(),
        num_classes=data.num_classes,
        source=name,
        labels=labels,
        fixed_labels=fixed,
    )
    return aux, data
