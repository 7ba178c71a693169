"""Tests of dpsub.data: real MNIST/Fashion-MNIST/CIFAR-10-subset from the shared data
folder (skipped when absent), offline digits/synthetic, and tiny fake CIFAR-10/SVHN
copies written in the real torchvision file formats."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from dpsub.data import LOADERS, DatasetBundle, DatasetNotFoundError, load_dataset
from dpsub.data.datasets import _subset_indices
from dpsub.data.registry import REGISTRY, published_train_size
from dpsub.data.subsets import NotEnoughExamples, balanced_pick
from dpsub.errors import DataError

from conftest import SHARED_ROOT
from helpers.data import write_fake_cifar10

SHARED = SHARED_ROOT


def _require(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found (set DPSUB_DATA to the shared data folder)")
    return SHARED


# ------------------------------------------------------------------ offline data


@pytest.fixture(scope="module")
def digits() -> DatasetBundle:
    return load_dataset("digits", root="unused")


def test_digits_shapes_split_and_normalization(digits: DatasetBundle) -> None:
    assert digits.train_x.shape == (1437, 1, 28, 28)
    assert digits.test_x.shape == (360, 1, 28, 28)
    assert digits.in_shape == (1, 28, 28)
    assert digits.train_x.dtype == torch.float32 and digits.train_y.dtype == torch.int64
    assert digits.num_classes == 10 and digits.classes == [str(i) for i in range(10)]
    # pixels in [0, 1] normalized with the data-independent 0.5 / 0.5: [-1, 1]
    assert digits.mean == (0.5,) and digits.std == (0.5,)
    assert digits.train_x.min().item() == -1.0 and digits.train_x.max().item() == 1.0
    # stratified split: every class in both splits, in roughly 80/20 proportion
    tr, te = torch.bincount(digits.train_y), torch.bincount(digits.test_y)
    assert (te > 0).all() and ((tr.float() / (tr + te).float() - 0.8).abs() < 0.02).all()
    assert digits.train_x.device.type == "cpu"
    assert "digits" in digits.describe() and "1437" in digits.describe()


def test_digits_split_independent_of_seed_and_resizable(digits: DatasetBundle) -> None:
    other = load_dataset("digits", root="unused", seed=123, image_size=16)
    assert torch.equal(other.train_y, digits.train_y)
    assert other.in_shape == (1, 16, 16)


def test_balanced_train_size(digits: DatasetBundle) -> None:
    sub = load_dataset("digits", root="unused", train_size=500, seed=1)
    assert len(sub.train_y) == 500
    assert torch.bincount(sub.train_y).tolist() == [50] * 10
    # test set and normalization are untouched by subsetting
    assert torch.equal(sub.test_x, digits.test_x) and sub.mean == digits.mean
    again = load_dataset("digits", root="unused", train_size=500, seed=1)
    assert torch.equal(again.train_x, sub.train_x)
    other = load_dataset("digits", root="unused", train_size=500, seed=2)
    assert not torch.equal(other.train_x, sub.train_x)
    odd = load_dataset("digits", root="unused", train_size=103)
    assert sorted(torch.bincount(odd.train_y).tolist()) == [10] * 7 + [11] * 3


def test_unbalanced_train_size() -> None:
    sub = load_dataset("digits", root="unused", train_size=77, balanced=False, seed=3)
    assert len(sub.train_y) == 77 and len(torch.unique(sub.train_y)) > 1


def test_train_size_too_large() -> None:
    with pytest.raises(ValueError, match="dataset.train_size"):
        load_dataset("digits", root="unused", train_size=100_000)


def test_unknown_dataset_name() -> None:
    with pytest.raises(ValueError, match="dataset.name") as err:
        load_dataset("imagenet", root="unused")
    for name in LOADERS:
        assert name in str(err.value)


def test_synthetic_deterministic_and_configurable() -> None:
    cfg = {"n_train": 200, "n_test": 50, "channels": 3, "size": 16, "num_classes": 4}
    a = load_dataset("synthetic", root="unused", synthetic=cfg)
    b = load_dataset("synthetic", root="unused", synthetic=cfg)
    c = load_dataset("synthetic", root="unused", synthetic={**cfg, "seed": 1})
    assert a.train_x.shape == (200, 3, 16, 16) and a.test_x.shape == (50, 3, 16, 16)
    assert a.num_classes == 4 and set(a.train_y.tolist()) == {0, 1, 2, 3}
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)
    with pytest.raises(ValueError, match="synthetic"):
        load_dataset("synthetic", root="unused", synthetic={"n_trian": 10})


def test_synthetic_is_learnable() -> None:
    """Nearest class mean (from train) classifies the test set well above chance."""
    d = load_dataset("synthetic", root="unused")
    means = torch.stack([d.train_x[d.train_y == k].mean(0) for k in range(d.num_classes)])
    dist = torch.cdist(d.test_x.flatten(1), means.flatten(1))
    acc = (dist.argmin(1) == d.test_y).float().mean().item()
    assert acc > 0.5


def test_bundle_to_device(digits: DatasetBundle) -> None:
    moved = digits.to("cpu")
    assert moved.name == digits.name and torch.equal(moved.test_y, digits.test_y)
    if torch.cuda.is_available():
        assert digits.to("cuda").train_x.is_cuda


def test_use_extra_only_for_svhn() -> None:
    with pytest.raises(ValueError, match="use_extra"):
        load_dataset("digits", root="unused", use_extra=True)


def test_published_train_size_takes_out_the_carve_outs() -> None:
    """Cost estimates without the data (reproduce.py --dry-run): N from the release's size."""
    none = {"name": "none"}
    assert published_train_size({"name": "cifar10"}, none) == 50_000
    assert published_train_size({"name": "cifar10", "validation_size": 5000}, none) == 45_000
    aux = {"name": "public_train", "num_samples": 2000}
    assert published_train_size({"name": "mnist", "validation_size": 1000}, aux) == 57_000
    held_out = {"name": "heldout_test", "num_samples": 2000}  # taken from the test split
    assert published_train_size({"name": "cifar10"}, held_out) == 50_000
    assert published_train_size({"name": "svhn", "use_extra": True}, none) == 604_388
    assert published_train_size({"name": "cifar10_subset"}, none) is None


# ------------------------------------------------------------- shared real data


def test_mnist() -> None:
    root = _require("MNIST", "raw")
    d = load_dataset("mnist", root=root)
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert REGISTRY["mnist"].published == (len(d.train_y), len(d.test_y))
    assert torch.bincount(d.train_y)[0].item() == 5923
    assert torch.bincount(d.test_y)[1].item() == 1135
    assert d.mean == (0.1307,) and d.std == (0.3081,)
    assert abs(d.train_x.mean().item()) < 0.01 and abs(d.train_x.std().item() - 1) < 0.01
    resized = load_dataset("mnist", root=root, image_size=32, train_size=1000)
    assert resized.in_shape == (1, 32, 32) and len(resized.train_y) == 1000
    assert torch.bincount(resized.train_y).tolist() == [100] * 10


def test_fashion_mnist() -> None:
    root = _require("FashionMNIST", "raw")
    d = load_dataset("fashion_mnist", root=root)
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert REGISTRY["fashion_mnist"].published == (len(d.train_y), len(d.test_y))
    assert torch.bincount(d.train_y).tolist() == [6000] * 10
    assert torch.bincount(d.test_y).tolist() == [1000] * 10
    assert d.classes is not None and d.classes[0] == "T-shirt/top"
    assert d.mean == (0.2860,) and d.std == (0.3530,)


def test_mnist_does_not_write_to_root() -> None:
    root = _require("MNIST", "raw")
    before = sorted(p.name for p in (root / "MNIST" / "raw").iterdir())
    load_dataset("mnist", root=root, train_size=10)
    assert sorted(p.name for p in (root / "MNIST" / "raw").iterdir()) == before


def test_cifar10_subset() -> None:
    root = _require("cifar10_subset", "cifar10_prefix_subset.npz")
    d = load_dataset("cifar10_subset", root=root)
    assert d.train_x.shape == (5085, 3, 32, 32) and d.test_x.shape == (1017, 3, 32, 32)
    assert d.num_classes == 10 and d.classes is not None and d.classes[0] == "airplane"
    assert d.mean == (0.4914, 0.4822, 0.4465)
    assert set(d.test_y.tolist()) == set(range(10))


# ------------------------------------------------------------ missing / download


@pytest.mark.parametrize(
    ("name", "filename"),
    [
        ("cifar10", "data_batch_1"),
        ("svhn", "train_32x32.mat"),
        ("mnist", "train-images-idx3-ubyte.gz"),
        ("fashion_mnist", "t10k-labels-idx1-ubyte.gz"),
        ("cifar10_subset", "cifar10_prefix_subset.npz"),
    ],
)
def test_missing_files_raise(tmp_path: Path, name: str, filename: str) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, root=tmp_path)
    msg = str(err.value)
    assert filename in msg and str(tmp_path) in msg and "data.root" in msg
    assert isinstance(err.value, FileNotFoundError)


def test_svhn_missing_extra_only(tmp_path: Path) -> None:
    _write_fake_svhn(tmp_path / "svhn", {"train": 6, "test": 4})
    load_dataset("svhn", root=tmp_path)  # fine without extra
    with pytest.raises(DatasetNotFoundError, match="extra_32x32.mat") as err:
        load_dataset("svhn", root=tmp_path, use_extra=True)
    assert "train_32x32.mat" not in str(err.value).split("(searched")[0]


def test_download_failure_becomes_dataset_not_found(tmp_path, monkeypatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(
        torchvision.datasets, "CIFAR10", _patched(torchvision.datasets.CIFAR10, offline)
    )
    with pytest.raises(DatasetNotFoundError, match="failed") as err:
        load_dataset("cifar10", root=tmp_path, download=True)
    assert "cifar-10-batches-py" in str(err.value)
    assert isinstance(err.value.__cause__, urllib.error.URLError)


def _patched(cls, init):
    """A subclass of a torchvision dataset whose constructor is ``init``."""
    return type(cls.__name__, (cls,), {"__init__": init})


# ------------------------------------------------------ fake CIFAR-10 and SVHN


def test_cifar10_fake_matches_torchvision(tmp_path: Path, monkeypatch) -> None:
    write_fake_cifar10(tmp_path)
    d = load_dataset("cifar10", root=tmp_path)
    assert d.train_x.shape == (100, 3, 32, 32) and d.test_x.shape == (10, 3, 32, 32)
    assert d.classes is not None and d.classes[-1] == "truck"
    # Same images/labels as torchvision's CIFAR10 (its md5 check bypassed for fakes).
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    tv = torchvision.datasets.CIFAR10(str(tmp_path), train=True)
    ref = torch.from_numpy(tv.data).permute(0, 3, 1, 2).float() / 255  # NHWC -> NCHW
    mean = torch.tensor(d.mean).view(1, 3, 1, 1)
    std = torch.tensor(d.std).view(1, 3, 1, 1)
    torch.testing.assert_close(d.train_x, (ref - mean) / std)
    assert d.train_y.tolist() == list(tv.targets)
    sub = load_dataset("cifar10", root=tmp_path, image_size=16, train_size=10, balanced=False)
    assert sub.in_shape == (3, 16, 16) and len(sub.train_y) == 10


def _write_fake_svhn(directory: Path, sizes: dict[str, int]) -> None:
    from scipy.io import savemat

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for split, n in sizes.items():
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)  # labels 1..10, 10 = "0"
        savemat(str(directory / f"{split}_32x32.mat"), {"X": x, "y": y})


@pytest.mark.parametrize("subdir", ["svhn", ""])
def test_svhn_fake_matches_torchvision(tmp_path: Path, monkeypatch, subdir: str) -> None:
    directory = tmp_path / subdir if subdir else tmp_path
    _write_fake_svhn(directory, {"train": 20, "test": 10, "extra": 30})
    d = load_dataset("svhn", root=tmp_path)
    assert d.train_x.shape == (20, 3, 32, 32) and d.test_x.shape == (10, 3, 32, 32)
    assert d.train_y.min().item() == 0 and d.train_y.max().item() == 9  # 10 -> 0
    assert d.train_y[9].item() == 0 and d.train_y[0].item() == 1
    monkeypatch.setattr(torchvision.datasets.SVHN, "_check_integrity", lambda self: True)
    tv = torchvision.datasets.SVHN(str(directory), split="train")
    ref = torch.from_numpy(tv.data).float() / 255  # torchvision: (N, 3, 32, 32)
    mean = torch.tensor(d.mean).view(1, 3, 1, 1)
    std = torch.tensor(d.std).view(1, 3, 1, 1)
    torch.testing.assert_close(d.train_x, (ref - mean) / std)
    assert d.train_y.tolist() == tv.labels.tolist()
    extra = load_dataset("svhn", root=tmp_path, use_extra=True)
    assert len(extra.train_y) == 50 and len(extra.test_y) == 10


# ------------------------------------------------- corrupt files: one-line DataError


def _one_line_error(err: pytest.ExceptionInfo, name: str, *fragments: str) -> str:
    """The DataError message: one line that starts with the file's name."""
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{name}: "), msg
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)
    return msg


def _idx_bytes(array: np.ndarray, magic: bytes = b"\x00\x00\x08") -> bytes:
    header = magic + bytes([array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def _write_fake_mnist(root: Path, n_train: int = 20, n_test: int = 10) -> Path:
    """Tiny MNIST .gz files in torchvision's layout; returns the raw folder."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28))
        labels = np.arange(n) % 10
        (raw / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(images)))
        (raw / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(labels)))
    return raw


def test_fake_mnist_loads(tmp_path: Path) -> None:
    _write_fake_mnist(tmp_path)
    d = load_dataset("mnist", root=tmp_path)
    assert d.train_x.shape == (20, 1, 28, 28) and d.test_y.tolist() == list(range(10))


TRAIN_IMAGES = "train-images-idx3-ubyte.gz"


def _gz(data: bytes) -> bytes:
    return gzip.compress(data)


@pytest.mark.parametrize(
    ("corrupt", "fragment"),
    [
        (lambda b: b[: len(b) // 2], "truncated gzip file (EOFError)"),
        (lambda b: b[:10] + bytes(len(b) - 10), "(zlib.error"),
        (lambda b: b"not gzip at all", "not a valid gzip file (BadGzipFile"),
        (lambda b: b[:-8] + bytes(8), "not a valid gzip file (BadGzipFile"),  # bad CRC
    ],
    ids=["truncated", "zeroed", "not-gzip", "bad-crc"],
)
def test_corrupt_mnist_gzip(tmp_path: Path, corrupt, fragment: str) -> None:
    raw = _write_fake_mnist(tmp_path)
    path = raw / TRAIN_IMAGES
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", root=tmp_path)
    _one_line_error(err, f"MNIST/raw/{TRAIN_IMAGES}", fragment, "re-download it or fix data.root")


def test_truncated_copy_of_real_mnist(tmp_path: Path) -> None:
    """A download cut short: the real test-images file, truncated."""
    shared = _require("MNIST", "raw") / "MNIST" / "raw"
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in shared.glob("*.gz"):
        (raw / f.name).symlink_to(f)
    name = "t10k-images-idx3-ubyte.gz"
    (raw / name).unlink()
    (raw / name).write_bytes((shared / name).read_bytes()[:100_000])
    with pytest.raises(DataError) as err:
        load_dataset("mnist", root=tmp_path)
    _one_line_error(err, f"MNIST/raw/{name}", "truncated gzip file (EOFError)")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (_idx_bytes(np.zeros((20, 28, 28)), magic=b"\x00\x00\x0b"), "not an IDX file of uint8"),
        (_idx_bytes(np.zeros((20, 28, 28)))[:-1], "IDX header says shape (20, 28, 28) (15696"),
        (_idx_bytes(np.zeros((20, 28, 28))) + b"\x00", "but the file holds 15697"),
        (b"\x00\x00\x08\x03\x00", "IDX header cut short"),
        (b"", "not an IDX file of uint8 (magic nothing"),
    ],
    ids=["magic", "short", "long", "header", "empty"],
)
def test_malformed_idx(tmp_path: Path, content: bytes, fragment: str) -> None:
    raw = _write_fake_mnist(tmp_path)
    (raw / TRAIN_IMAGES).write_bytes(_gz(content))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", root=tmp_path)
    _one_line_error(err, f"MNIST/raw/{TRAIN_IMAGES}", fragment)


def test_extracted_idx_is_checked_too(tmp_path: Path) -> None:
    raw = _write_fake_mnist(tmp_path)
    (raw / "train-images-idx3-ubyte").write_bytes(_idx_bytes(np.zeros((20, 28, 28)))[:-5])
    with pytest.raises(DataError) as err:
        load_dataset("mnist", root=tmp_path)
    _one_line_error(err, "MNIST/raw/train-images-idx3-ubyte", "IDX header says shape")


def test_mnist_labels_that_do_not_match_the_images(tmp_path: Path) -> None:
    raw = _write_fake_mnist(tmp_path)
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(_gz(_idx_bytes(np.zeros(9))))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", root=tmp_path)
    _one_line_error(err, "MNIST/raw/t10k-labels-idx1-ubyte.gz", "expected 10 labels", "got 9")
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(_gz(_idx_bytes(np.zeros((10, 28, 28)))))
    with pytest.raises(DataError, match="expected 10 labels"):
        load_dataset("mnist", root=tmp_path)


def _pickle_bytes(obj) -> bytes:
    return pickle.dumps(obj)


@pytest.mark.parametrize(
    ("corrupt", "fragment"),
    [
        (lambda b: b[: len(b) // 2], "corrupt pickle (UnpicklingError: pickle data was truncated"),
        (lambda b: b"", "truncated file (EOFError"),
        (lambda b: b"\x00garbage" + b, "corrupt pickle (UnpicklingError"),
        (lambda b: _pickle_bytes([1, 2]), "expected a pickled dict, got list"),
        (lambda b: _pickle_bytes({"data": np.zeros((3, 3072), np.uint8)}), "no 'labels' entry"),
        (
            lambda b: _pickle_bytes({"data": np.zeros((3, 3000), np.uint8), "labels": [0] * 3}),
            "'data' must be uint8 of shape (n, 3072), got uint8 (3, 3000)",
        ),
        (
            lambda b: _pickle_bytes({"data": np.zeros((3, 3072), np.uint8), "labels": [0] * 2}),
            "'labels' must be 3 integers",
        ),
    ],
    ids=["truncated", "empty", "garbage", "list", "no-labels", "data-shape", "labels-count"],
)
def test_corrupt_cifar10_pickle(tmp_path: Path, corrupt, fragment: str) -> None:
    write_fake_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", root=tmp_path)
    _one_line_error(err, "cifar-10-batches-py/data_batch_3", fragment)


def test_corrupt_cifar10_meta(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "batches.meta").write_bytes(_pickle_bytes({"x": 1}))
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", root=tmp_path)
    _one_line_error(err, "cifar-10-batches-py/batches.meta", "'label_names' must be a list")


@pytest.mark.parametrize(
    ("corrupt", "fragment"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:3000]), "not a readable MATLAB .mat file ("),
        (
            lambda p: p.write_bytes(b"this is not a .mat file" * 10),
            "not a readable MATLAB .mat file (",
        ),
        (lambda p: _savemat(p, {"y": np.ones((4, 1), np.uint8)}), "no 'X' variable"),
        (
            lambda p: _savemat(p, {"X": np.zeros((32, 32, 3, 4)), "y": np.ones((4, 1))}),
            "'X' must be uint8 (32, 32, 3, n), got float64",
        ),
        (
            lambda p: _savemat(p, {"X": np.zeros((32, 32, 3, 4), np.uint8), "y": np.ones(3)}),
            "'y' must hold 4 labels",
        ),
    ],
    ids=["truncated", "garbage", "no-X", "X-dtype", "y-count"],
)
def test_corrupt_svhn_mat(tmp_path: Path, corrupt, fragment: str) -> None:
    _write_fake_svhn(tmp_path / "svhn", {"train": 6, "test": 4})
    corrupt(tmp_path / "svhn" / "test_32x32.mat")
    with pytest.raises(DataError) as err:
        load_dataset("svhn", root=tmp_path)
    _one_line_error(err, "svhn/test_32x32.mat", fragment)


def _savemat(path: Path, variables: dict) -> None:
    from scipy.io import savemat

    savemat(str(path), variables)


def _write_fake_cifar10_subset(root: Path, n: int = 12, **overrides) -> Path:
    d = root / "cifar10_subset"
    d.mkdir(parents=True)
    arrays = {
        "data": np.zeros((n, 3, 32, 32), np.uint8),
        "labels": np.arange(n) % 10,
        "batch": np.array(["data_batch_1", "test_batch"] * (n // 2)),
        **overrides,
    }
    path = d / "cifar10_prefix_subset.npz"
    np.savez(path, **arrays)
    return path


def test_corrupt_cifar10_subset_npz(tmp_path: Path) -> None:
    path = _write_fake_cifar10_subset(tmp_path)
    assert len(load_dataset("cifar10_subset", root=tmp_path).train_y) == 6
    path.write_bytes(path.read_bytes()[:1000])
    name = "cifar10_subset/cifar10_prefix_subset.npz"
    with pytest.raises(DataError) as err:
        load_dataset("cifar10_subset", root=tmp_path)
    _one_line_error(err, name, "not a valid .npz (zip) file, truncated or corrupt (BadZipFile")
    np.savez(path, data=np.zeros((2, 3, 32, 32), np.uint8), labels=np.zeros(2, int))
    with pytest.raises(DataError) as err:
        load_dataset("cifar10_subset", root=tmp_path)
    _one_line_error(err, name, "no 'batch' array")
    np.savez(path, data=np.zeros((2, 32, 32, 3), np.uint8), labels=np.zeros(2), batch=np.ones(2))
    with pytest.raises(DataError) as err:
        load_dataset("cifar10_subset", root=tmp_path)
    _one_line_error(err, name, "'data' must be uint8 (n, 3, 32, 32)")


# ------------------------------------------------------------ train_size subsets


def _fingerprint(idx: torch.Tensor) -> str:
    return hashlib.sha256(idx.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


# Recorded with the picker that produced the published results (before the pickers
# of datasets.py and aux.py were merged): the same seed must keep giving the same
# training examples.
RECORDED_SUBSETS = [
    ("mnist", 10000, True, 0, "f26585baadad5163"),
    ("mnist", 1000, True, 3, "67f3fa961f9dd06f"),
    ("mnist", 777, False, 0, "579fe0e71ec9adb0"),
    ("digits", 103, True, 0, "74a8f6c410bcadbe"),
    ("digits", 500, True, 1, "f5d8fb86b6819784"),
]


@pytest.mark.parametrize(("name", "size", "balanced", "seed", "recorded"), RECORDED_SUBSETS)
def test_train_size_subsets_are_unchanged(name, size, balanced, seed, recorded) -> None:
    root = _require("MNIST", "raw") if name == "mnist" else Path("unused")
    y = LOADERS[name](root, False).train_y.long()
    idx = _subset_indices(y, size, 10, balanced, seed)
    assert len(idx) == size and _fingerprint(idx) == recorded


def test_balanced_pick_remainder_and_shortfall() -> None:
    y = torch.tensor([0] * 10 + [1] * 10 + [2] * 2 + [7])  # 7: a label outside [0, 3)
    idx = balanced_pick(y, 9, 3, torch.Generator().manual_seed(0), fill=True)
    counts = torch.bincount(y[idx], minlength=8)
    assert counts[2] == 2 and counts[0] + counts[1] + counts[7] == 7  # class 2 short by 1
    assert counts[0] >= 3 and counts[1] >= 3 and len(set(idx.tolist())) == 9
    assert torch.equal(idx, idx.sort().values)
    with pytest.raises(NotEnoughExamples) as err:
        balanced_pick(y, 9, 3, torch.Generator().manual_seed(0))
    assert (err.value.cls, err.value.want, err.value.have) == (2, 3, 2)
    exact = balanced_pick(y[:20], 5, 2, torch.Generator().manual_seed(1))
    assert torch.bincount(y[exact]).tolist() == [3, 2]  # the remainder goes to class 0
    again = balanced_pick(y[:20], 5, 2, torch.Generator().manual_seed(1))
    assert torch.equal(exact, again)


def test_balanced_train_size_too_large_for_a_class() -> None:
    with pytest.raises(ValueError, match=r"needs 144 examples of class \d, but .* only"):
        load_dataset("digits", root="unused", train_size=1437)


# ------------------------------------------- normalization is not a private statistic


def test_digits_normalization_ignores_the_training_images(monkeypatch) -> None:
    """Perturbing a training image must not change the normalization."""
    import sklearn.datasets

    base = load_dataset("digits", root="unused")
    real = sklearn.datasets.load_digits

    def perturbed(*args, **kwargs):
        d = real(*args, **kwargs)
        d.images[0] = 16.0  # the first image (in the training split) all white
        return d

    monkeypatch.setattr(sklearn.datasets, "load_digits", perturbed)
    other = load_dataset("digits", root="unused")
    assert not torch.equal(other.train_x, base.train_x)
    assert (other.mean, other.std) == (base.mean, base.std)
    small = load_dataset("digits", root="unused", train_size=100)
    assert (small.mean, small.std) == (base.mean, base.std)


def test_synthetic_normalization_comes_from_the_generator() -> None:
    opts = {"n_train": 100, "n_test": 20, "channels": 3, "size": 8, "num_classes": 4}
    a = load_dataset("synthetic", root="unused", synthetic=opts)
    b = load_dataset("synthetic", root="unused", synthetic={**opts, "n_train": 3000})
    assert (a.mean, a.std) == (b.mean, b.std)  # other samples, same distribution
    # ... and they are the distribution's: a large sample is standardized
    assert b.train_x.mean().abs() < 0.02 and (b.train_x.std() - 1).abs() < 0.02
    noisier = load_dataset("synthetic", root="unused", synthetic={**opts, "noise": 2.0})
    assert all(n > s for n, s in zip(noisier.std, a.std, strict=True))


def _labelled(y: torch.Tensor) -> DatasetBundle:
    x = torch.arange(len(y), dtype=torch.float32).view(-1, 1, 1, 1)  # pixel = position
    e = torch.zeros(0, 1, 1, 1)
    return DatasetBundle("toy", x, y, e, torch.zeros(0, dtype=torch.long), 3, None, (0.0,), (1.0,))


def test_a_hash_validation_pick_moves_no_other_example_when_one_is_added():
    """dpsub-select's pick: each example's part is a function of its own bytes (and the seed
    and rate). Appending one example moves none of the others; a positional pick moves most."""
    from dpsub.data.validation import carve_validation

    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 3, (3001,), generator=g)
    x = torch.randn(3001, 1, 2, 2, generator=g)

    def held(n, pick):  # the held-out examples of the first n, as rows
        e = torch.zeros(0, 1, 2, 2)
        data = DatasetBundle("toy", x[:n], y[:n], e, y[:0], 3, None, (0.0,), (1.0,))
        part = carve_validation(data, 300, seed=4, pick=pick)
        return {tuple(r.flatten().tolist()) for r in part.test_x}, part

    small, _ = held(3000, "hash")
    large, part = held(3001, "hash")
    assert large - small <= {tuple(x[3000].flatten().tolist())} and small <= large
    assert 240 < len(small) < 360 and len(part.train_y) == 3001 - len(large)
    moved = held(3000, "uniform")[0] ^ held(3001, "uniform")[0]
    assert len(moved) > 300


def test_a_uniform_validation_pick_depends_on_the_seed_alone_never_the_labels():
    """dpsub-select needs a held-out part fixed before the data are read: relabelling the
    examples must not move a single one in or out of it (a balanced pick does)."""
    from dpsub.data.validation import carve_validation

    g = torch.Generator().manual_seed(1)
    y1, y2 = torch.randint(0, 3, (300,), generator=g), torch.randint(0, 3, (300,), generator=g)

    def held(y, pick):
        return carve_validation(_labelled(y), 60, seed=4, pick=pick).test_x.flatten().tolist()

    assert held(y1, "uniform") == held(y2, "uniform")
    assert held(y1, "balanced") != held(y2, "balanced")
    assert (
        held(y1, "uniform")
        != carve_validation(_labelled(y1), 60, 5, "uniform").test_x.flatten().tolist()
    )
