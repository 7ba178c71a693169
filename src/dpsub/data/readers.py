"""Readers of the dataset file formats that report a bad file as one line.

A truncated download, a file of the wrong format or a file with the wrong contents
raises :class:`~dpsub.errors.DataError` naming the file (relative to the data root
when it is under it) and what is wrong, e.g.
``MNIST/raw/train-images-idx3-ubyte.gz: truncated gzip file (EOFError); re-download
it or fix data.root``, instead of a traceback from gzip, pickle, zipfile or scipy.

Every reader checks the structure the loaders rely on (IDX magic and size, the keys,
shapes and dtypes of CIFAR pickles, SVHN ``.mat`` and ``.npz`` files), so a loader
never indexes into a malformed array.
"""

from __future__ import annotations

import gzip
import pickle
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from dpsub.errors import DataError

REDOWNLOAD = "re-download it or fix data.root"


def _name(path: Path, root: Path | None) -> str:
    """``path`` relative to ``root`` when it lies under it, else in full."""
    if root is not None:
        try:
            return str(path.relative_to(root))
        except ValueError:
            pass
    return str(path)


def bad_file(path: Path, root: Path | None, problem: str, hint: str = REDOWNLOAD) -> DataError:
    """The DataError for a file that is unreadable or malformed (one line)."""
    return DataError(" ".join(f"{_name(path, root)}: {problem}; {hint}".split()))


def _describe(err: Exception, path: Path, what: str) -> str:
    """What a low-level read error means for the file (a ``what``), with its type."""
    kind = type(err).__name__
    if isinstance(err, EOFError):
        return f"truncated {'gzip ' if path.suffix == '.gz' else ''}file ({kind})"
    if isinstance(err, gzip.BadGzipFile):
        return f"not a valid gzip file ({kind}: {err})"
    if isinstance(err, zlib.error):
        return f"corrupt compressed data (zlib.error: {err})"
    if isinstance(err, zipfile.BadZipFile):
        return f"not a valid .npz (zip) file, truncated or corrupt ({kind}: {err})"
    if isinstance(err, pickle.UnpicklingError):
        return f"corrupt pickle ({kind}: {err})"
    return f"not a readable {what} ({kind}: {err})"


@contextmanager
def reading(
    path: Path, root: Path | None, hint: str = REDOWNLOAD, what: str = "file"
) -> Iterator[None]:
    """Turn any error raised while decoding ``path`` into a DataError naming it.

    Wrap only the library calls that open and decode the file: there, every
    exception (EOFError, zlib.error, UnpicklingError, BadZipFile, scipy's
    MatReadError, ...) means the file is not what it should be.
    """
    try:
        yield
    except DataError:
        raise
    except Exception as e:
        raise bad_file(path, root, _describe(e, path, what), hint) from e


# ------------------------------------------------------------------------ IDX


def read_idx(path: Path, root: Path | None) -> np.ndarray:
    """An IDX file of uint8 (the MNIST format), gzipped or not, checked for its
    magic number and for a size that matches the shape in its header."""
    with reading(path, root, what="IDX file"):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            buf = bytearray(f.read())
    if len(buf) < 4 or buf[:3] != b"\x00\x00\x08":
        found = bytes(buf[:4]).hex() or "nothing"
        raise bad_file(path, root, f"not an IDX file of uint8 (magic {found}, expected 000008xx)")
    ndim = buf[3]
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise bad_file(path, root, f"IDX header cut short ({len(buf)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(buf, dtype=">i4", count=ndim, offset=4))
    want = header + int(np.prod(dims, dtype=np.int64))
    if len(buf) != want:
        raise bad_file(
            path,
            root,
            f"IDX header says shape {dims} ({want} bytes), but the file holds {len(buf)}",
        )
    return np.frombuffer(buf, dtype=np.uint8, offset=header).reshape(dims)


# -------------------------------------------------------------- CIFAR pickles


def unpickle(path: Path, root: Path | None, hint: str = REDOWNLOAD) -> dict:
    """A CIFAR python pickle (a dict); keys may be str or bytes."""
    with reading(path, root, hint, what="pickle"):
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="latin1")
    if not isinstance(obj, dict):
        raise bad_file(path, root, f"expected a pickled dict, got {type(obj).__name__}", hint)
    return obj


def _entry(batch: dict, key: str, path: Path, root: Path | None, hint: str):
    for k in (key, key.encode()):
        if k in batch:
            return batch[k]
    keys = sorted(str(k) for k in batch)
    raise bad_file(path, root, f"no '{key}' entry (it has {keys})", hint)


def read_cifar_batch(
    path: Path, root: Path | None, label_key: str = "labels", hint: str = REDOWNLOAD
) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, 32, 32) uint8 and labels (n,) int64 of a CIFAR-10/100 pickle
    (``label_key``: ``labels`` for CIFAR-10, ``fine_labels`` for CIFAR-100)."""
    batch = unpickle(path, root, hint)
    data = np.asarray(_entry(batch, "data", path, root, hint))
    labels = np.asarray(_entry(batch, label_key, path, root, hint))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise bad_file(
            path, root, f"'data' must be uint8 of shape (n, 3072), got {data.dtype} {data.shape}",
            hint,
        )  # fmt: skip
    if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
        raise bad_file(
            path, root, f"'{label_key}' must be {len(data)} integers, got {labels.dtype} "
            f"{labels.shape}", hint,
        )  # fmt: skip
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


# ---------------------------------------------------------------- SVHN .mat


def read_svhn_mat(path: Path, root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN ``*_32x32.mat``: images (n, 3, 32, 32) uint8 and labels (n,) int64 with
    10 mapped to 0 (as torchvision.datasets.SVHN does)."""
    from scipy.io import loadmat

    with reading(path, root, what="MATLAB .mat file"):
        mat = loadmat(str(path))
    for key in ("X", "y"):
        if key not in mat:
            keys = sorted(k for k in mat if not k.startswith("__"))
            raise bad_file(path, root, f"no '{key}' variable (it has {keys})")
    x, y = mat["X"], mat["y"]
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise bad_file(path, root, f"'X' must be uint8 (32, 32, 3, n), got {x.dtype} {x.shape}")
    if y.size != x.shape[3] or y.dtype.kind not in "iuf":
        raise bad_file(path, root, f"'y' must hold {x.shape[3]} labels, got {y.dtype} {y.shape}")
    y = y.astype(np.int64).reshape(-1)
    y[y == 10] = 0
    return np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1))), y


# ----------------------------------------------------------------------- npz


def read_npz(
    path: Path, root: Path | None, keys: tuple[str, ...], hint: str = REDOWNLOAD
) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of an ``.npz`` file (no pickled objects)."""
    with reading(path, root, hint, what=".npz file"):
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise bad_file(path, root, "a single .npy array, not an .npz archive", hint)
        with npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise bad_file(path, root, f"no '{missing[0]}' array (it has {npz.files})", hint)
            return {k: npz[k] for k in keys}
