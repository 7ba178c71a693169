"""Your own data: ``dataset=npz`` (arrays in one file) and ``dataset=imagefolder`` (image files).

Both give the same :class:`~dpsub.data.raw._Raw` as the built-in datasets, so everything
downstream (validation carve-out, subsets, features, augmentation, every mechanism) works
unchanged. What dpsub does not do with your data, by design:

* **No statistics of it reach the model.** The normalization is ``dataset.mean`` /
  ``dataset.std``, constants you choose (default 0.5 per channel, mapping pixels in [0, 1]
  to [-1, 1]), never the data's own mean or std, which would leave the process unnoised.
* **The number of classes is not read from the labels** (their maximum is a statistic of
  the private data): ``dataset.num_classes``, else an npz's ``classes`` array, else (image
  folders) the class folders of ``train/``. A label outside ``[0, num_classes)`` is an error.

Layouts: an npz holds ``x_train``, ``y_train``, ``x_test``, ``y_test``; images are
``(n, H, W)``, ``(n, H, W, C)`` or ``(n, C, H, W)`` with C = 1 or 3, uint8 in [0, 255] or
floats in [0, 1]. An image folder holds ``train/<class>/<image>`` and ``test/<class>/<image>``
(PNG, JPEG, BMP, GIF, WebP; classes are the sorted folder names of ``train/``); every image
must have one size unless ``dataset.image_size`` resizes them, and the images have one
channel when every test image is gray (colour training images then become gray), else
three: the private images never decide it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dpsub.data.raw import _Raw
from dpsub.data.readers import bad_file, read_npz, reading
from dpsub.errors import DataError

DEFAULT_MEAN, DEFAULT_STD = 0.5, 0.5
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
HINT = "fix the file (docs/usage.md 'Your own data')"


def _channels_first(x: np.ndarray, path: Path, key: str) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[1] in (1, 3):
        return x
    if x.ndim == 4 and x.shape[3] in (1, 3):
        return x.transpose(0, 3, 1, 2)
    problem = f"'{key}' must be images (n, H, W), (n, H, W, C) or (n, C, H, W), got {x.shape}"
    raise bad_file(path, None, problem, HINT)


def _images(x: np.ndarray, path: Path, key: str) -> torch.Tensor:
    x = _channels_first(x, path, key)
    if x.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(x))
    if x.dtype.kind != "f" or not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise bad_file(path, None, f"'{key}' must be uint8 or finite floats in [0, 1]", HINT)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def _labels(y: np.ndarray, n: int, k: int, path: Path, key: str) -> torch.Tensor:
    if y.shape != (n,) or y.dtype.kind not in "iu":
        raise bad_file(
            path, None, f"'{key}' must be {n} integer labels, got {y.dtype} {y.shape}", HINT
        )
    if n and (y.min() < 0 or y.max() >= k):
        raise bad_file(path, None, f"'{key}' has labels outside [0, {k}) (num_classes {k})", HINT)
    return torch.from_numpy(y.astype(np.int64))


def _norm(mean, std, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    mean = tuple(mean) if mean is not None else (DEFAULT_MEAN,) * channels
    std = tuple(std) if std is not None else (DEFAULT_STD,) * channels
    if len(mean) != channels or len(std) != channels:
        raise DataError(f"dataset.mean / dataset.std: give {channels} values each (one a channel)")
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _npz_arrays(path: Path, validation: bool) -> dict[str, np.ndarray]:
    """x_train, y_train (or x, y), x_test, y_test and ``classes`` when there; without test
    arrays, empty test ones when dataset.validation_size holds examples out (evaluation
    runs on those)."""
    with reading(path, None, HINT, what=".npz file"):
        npz = np.load(path, allow_pickle=False)
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise bad_file(path, None, "a single .npy array, not an .npz archive", HINT)
    with npz:
        names = set(npz.files)
    train = ("x_train", "y_train") if "x_train" in names or "x" not in names else ("x", "y")
    has_test = "x_test" in names or "y_test" in names
    if not has_test and not validation:
        raise DataError(
            f"{path}: no x_test / y_test arrays (it has {sorted(names)}); add them, or set "
            "dataset.validation_size=N to evaluate on N training examples held out"
        )
    extra = (("x_test", "y_test") if has_test else ()) + (
        ("classes",) if "classes" in names else ()
    )
    a = read_npz(path, None, (*train, *extra), HINT)
    out = {"x_train": a[train[0]], "y_train": a[train[1]], **{k: a[k] for k in extra}}
    if not has_test:
        out.update(x_test=out["x_train"][:0], y_test=out["y_train"][:0])
    return out


def _load_npz(root: Path, download: bool, user: dict | None = None, **_: object) -> _Raw:
    """``dataset=npz``: the arrays of ``dataset.path``."""
    user = user or {}
    path = Path(str(user["path"])).expanduser()
    a = _npz_arrays(path, bool(user.get("validation_size")))
    classes = None
    k = user.get("num_classes")
    if k is None:
        if "classes" not in a:
            raise DataError(
                f"dataset.num_classes: {path} has no 'classes' array; set "
                "dataset.num_classes (not read from the labels: a statistic of your data)"
            )
        classes = [str(c) for c in a["classes"]]
        k = len(classes)
    tr_x, te_x = _images(a["x_train"], path, "x_train"), _images(a["x_test"], path, "x_test")
    if tr_x.shape[1:] != te_x.shape[1:]:
        raise bad_file(path, None, f"x_train {tuple(tr_x.shape[1:])} and x_test "
                       f"{tuple(te_x.shape[1:])} differ in shape", HINT)  # fmt: skip
    tr_y = _labels(a["y_train"], len(tr_x), int(k), path, "y_train")
    te_y = _labels(a["y_test"], len(te_x), int(k), path, "y_test")
    mean, std = _norm(user.get("mean"), user.get("std"), tr_x.shape[1])
    return _Raw(tr_x, tr_y, te_x, te_y, classes, int(k), mean, std)


def _read_image(file: Path, size: int | None):
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as im:
            im = im.convert("L" if im.mode in ("1", "L", "I;16", "I", "F") else "RGB")
            if size is not None and im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as e:
        raise DataError(f"{file}: not a readable image ({type(e).__name__}); {HINT}") from None


def _read_split(folder: Path, classes: list[str], size: int | None):
    images, labels = [], []
    for label, cls in enumerate(classes):
        d = folder / cls
        files = (
            sorted(f for f in d.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            if d.is_dir()
            else []
        )
        images += [(f, _read_image(f, size)) for f in files]
        labels += [label] * len(files)
    if not images:
        raise DataError(
            f"{folder}: no images under {folder}/<class>/ ({', '.join(IMAGE_SUFFIXES)})"
        )
    return images, labels


def _stack(images: list, gray: bool) -> np.ndarray:
    shape = images[0][1].shape[:2]
    out = []
    for f, im in images:
        if im.shape[:2] != shape:
            raise DataError(
                f"{f}: size {im.shape[1]}x{im.shape[0]}, the first image's is "
                f"{shape[1]}x{shape[0]}; set dataset.image_size to resize them all"
            )
        if im.ndim == 2:  # gray: one channel if the test images are, else repeated to RGB
            im = im[..., None] if gray else np.repeat(im[..., None], 3, axis=-1)
        elif gray:  # a colour image where the test images are gray: its luminance
            lum = im[..., :3].astype(np.float64) @ np.array([0.299, 0.587, 0.114])
            im = np.clip(np.round(lum), 0, 255).astype(im.dtype)[..., None]
        out.append(im)
    return np.stack(out).transpose(0, 3, 1, 2)


def _load_imagefolder(
    root: Path, download: bool, user: dict | None = None, image_size: int | None = None,
    **_: object,
) -> _Raw:  # fmt: skip
    """``dataset=imagefolder``: ``dataset.path/{train,test}/<class>/<image>``."""
    user = user or {}
    base = Path(str(user["path"])).expanduser()
    classes = sorted(d.name for d in (base / "train").iterdir() if d.is_dir())
    if user.get("num_classes") not in (None, len(classes)):
        raise DataError(f"dataset.num_classes={user['num_classes']}, but {base / 'train'} "
                        f"has {len(classes)} class folders")  # fmt: skip
    if not (base / "test").is_dir():
        raise DataError(f"{base}: no test/ folder (test/<class>/<image>, the classes of train/)")
    extra = sorted(
        d.name for d in (base / "test").iterdir() if d.is_dir() and d.name not in classes
    )
    if extra:
        raise DataError(f"{base / 'test'}: class folder {extra[0]!r} is not in train/")
    tr, tr_y = _read_split(base / "train", classes, image_size)
    te, te_y = _read_split(base / "test", classes, image_size)
    # one channel when every *test* image is gray: never decided by the private images (one
    # colour image among them would change the model's input, a membership test)
    gray = all(im.ndim == 2 for _, im in te)
    tr_x, te_x = _stack(tr, gray), _stack(te, gray)
    if tr_x.shape[1:] != te_x.shape[1:]:
        raise DataError(f"{base}: train and test images differ in size; set dataset.image_size")
    mean, std = _norm(user.get("mean"), user.get("std"), tr_x.shape[1])
    return _Raw(
        torch.from_numpy(tr_x), torch.tensor(tr_y), torch.from_numpy(te_x), torch.tensor(te_y),
        classes, len(classes), mean, std,
    )  # fmt: skip
