"""Tests of dpsub.data.aux: every auxiliary data source, the image conversion, the
label modes, the config checks and the conf/aux files. The central property: no
auxiliary example is ever in the evaluation set or in the private training set."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpsub.config import ConfigError, compose
from dpsub.data import DatasetBundle, DatasetNotFoundError, load_dataset
from dpsub.data.aux import AUX_LOADERS, AuxData, build_aux, convert_images, source
from dpsub.data.aux_options import AUX_SOURCES, LABEL_MODES, check_aux_config
from dpsub.errors import DataError

from conftest import SHARED_ROOT
from helpers.data import write_fake_cifar100

CONF = Path(__file__).resolve().parents[2] / "conf" / "aux"
NATURAL = Path("aux") / "tinyimagenet_val_32x32.npz"


SHARED = SHARED_ROOT


def _require_natural() -> Path:
    if not (SHARED / NATURAL).is_file():
        pytest.skip(f"{SHARED / NATURAL} not found (set DPSUB_DATA to the shared data folder)")
    return SHARED


def _synthetic(tmp_path: Path, **kw) -> DatasetBundle:
    opts = {"n_train": 300, "n_test": 120, "channels": 1, "size": 28, "num_classes": 10}
    opts.update(kw)
    return load_dataset("synthetic", root=str(tmp_path), synthetic=opts)


@pytest.fixture(scope="module")
def digits() -> DatasetBundle:
    return load_dataset("digits", root="unused")


@pytest.fixture
def mono(tmp_path: Path) -> DatasetBundle:
    return _synthetic(tmp_path)


@pytest.fixture
def rgb(tmp_path: Path) -> DatasetBundle:
    return _synthetic(tmp_path, channels=3, size=32, n_train=200, n_test=80)


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.flatten(1).contiguous()}


def _multiset(x: torch.Tensor) -> list[bytes]:
    return sorted(r.numpy().tobytes() for r in x.flatten(1).contiguous())


# ----------------------------------------------------- removal from the splits


@pytest.mark.parametrize("m", [10, 37])
def test_heldout_test_is_removed_from_the_test_set(mono: DatasetBundle, m: int) -> None:
    aux, out = build_aux({"name": "heldout_test", "num_samples": m}, mono, root="x", seed=0)
    assert len(aux) == m and aux.source == "heldout_test"
    assert aux.x.shape == (m, *mono.in_shape) and aux.y.shape == (m,)
    assert len(out.test_y) == len(mono.test_y) - m == len(out.test_x)
    # no auxiliary image is among the remaining test images (exact row comparison)
    assert not (_rows(aux.x) & _rows(out.test_x))
    # aux + remaining test == original test, labels travelling with their images
    assert _multiset(torch.cat([aux.x, out.test_x])) == _multiset(mono.test_x)
    for xa, ya in zip(aux.x, aux.y, strict=True):
        j = (mono.test_x.flatten(1) == xa.flatten()).all(1).nonzero().flatten()
        assert len(j) == 1 and mono.test_y[j].item() == ya.item()
    # the private training set is untouched
    assert out.train_x is mono.train_x and out.train_y is mono.train_y
    # class-balanced: m // K or m // K + 1 per class
    counts = torch.bincount(aux.y, minlength=10)
    assert counts.min() >= m // 10 and counts.max() <= m // 10 + 1


def test_public_train_is_removed_from_the_private_set(mono: DatasetBundle) -> None:
    aux, out = build_aux({"name": "public_train", "pick": "balanced"}, mono, root="x", seed=3)
    m = AUX_SOURCES["public_train"].defaults["num_samples"]
    assert m == 100 and len(aux) == m and aux.labels == "true"
    assert len(out.train_y) == len(mono.train_y) - m == len(out.train_x)
    assert not (_rows(aux.x) & _rows(out.train_x))
    assert _multiset(torch.cat([aux.x, out.train_x])) == _multiset(mono.train_x)
    assert out.test_x is mono.test_x and out.test_y is mono.test_y  # test set untouched
    assert torch.equal(torch.bincount(aux.y, minlength=10), torch.full((10,), 10))
    assert torch.equal(aux.batch_labels(torch.Generator()), aux.y)
    # the original bundle is not modified in place
    assert len(mono.train_y) == 300


def test_split_sources_on_digits(digits: DatasetBundle) -> None:
    aux, out = build_aux({"name": "heldout_test", "num_samples": 50}, digits, root="x", seed=1)
    assert len(out.test_y) == len(digits.test_y) - 50
    assert not (_rows(aux.x) & _rows(out.test_x))
    assert out.train_x is digits.train_x
    assert aux.x.shape == (50, 1, 28, 28)
    aux, out = build_aux({"name": "public_train", "num_samples": 100}, digits, root="x", seed=1)
    assert 60 < len(aux) < 140 and len(out.train_y) == len(digits.train_y) - len(aux)  # hash
    assert not (_rows(aux.x) & _rows(out.train_x))
    assert out.test_x is digits.test_x
    again, _ = build_aux({"name": "public_train", "num_samples": 100}, digits, root="x", seed=2)
    assert torch.equal(aux.x, again.x)  # the hash pick is the same for every seed


def test_selection_is_deterministic_in_the_seed(mono: DatasetBundle) -> None:
    cfg = {"name": "heldout_test", "num_samples": 20}
    a, _ = build_aux(cfg, mono, root="x", seed=5)
    b, _ = build_aux(cfg, mono, root="x", seed=5)
    c, _ = build_aux(cfg, mono, root="x", seed=6)
    d, _ = build_aux({**cfg, "seed": 6}, mono, root="x", seed=5)  # aux.seed overrides
    assert torch.equal(a.x, b.x) and not torch.equal(a.x, c.x) and torch.equal(c.x, d.x)


def test_balanced_pick_with_too_few_of_a_class(tmp_path: Path) -> None:
    data = _synthetic(tmp_path, n_test=40, num_classes=4)
    keep = (data.test_y != 0) | (torch.arange(40) < 8)  # class 0 keeps only a few examples
    data.test_x, data.test_y = data.test_x[keep], data.test_y[keep]
    n0 = int((data.test_y == 0).sum())
    aux, out = build_aux({"name": "heldout_test", "num_samples": 20}, data, root="x", seed=0)
    assert len(aux) == 20 and len(out.test_y) == len(data.test_y) - 20
    counts = torch.bincount(aux.y, minlength=4)
    assert counts[0] == min(n0, 5) and counts.sum() == 20


def test_split_sources_too_many_samples(mono: DatasetBundle) -> None:
    with pytest.raises(ValueError, match=r"^aux\.num_samples: .*exceeds"):
        build_aux({"name": "heldout_test"}, mono, root="x", seed=0)  # default 2000 > 120
    with pytest.raises(ValueError, match=r"^aux\.num_samples"):
        build_aux({"name": "public_train", "num_samples": 300}, mono, root="x", seed=0)


# --------------------------------------------------------------- label modes


def test_random_per_step_labels_change(mono: DatasetBundle) -> None:
    aux, _ = build_aux({"name": "gaussian", "num_samples": 64}, mono, root="x", seed=0)
    assert aux.labels == "random_per_step" and aux.y is None and aux.fixed_labels is None
    g = torch.Generator().manual_seed(0)
    l1, l2 = aux.batch_labels(g), aux.batch_labels(g)
    assert l1.shape == (64,) and l1.dtype == torch.int64
    assert not torch.equal(l1, l2)
    for lab in (l1, l2):
        assert lab.min() >= 0 and lab.max() < mono.num_classes


def test_random_once_labels_are_fixed(mono: DatasetBundle) -> None:
    cfg = {"name": "gaussian", "num_samples": 64, "labels": "random_once"}
    aux, _ = build_aux(cfg, mono, root="x", seed=0)
    g = torch.Generator().manual_seed(0)
    l1, l2 = aux.batch_labels(g), aux.batch_labels(g)
    assert torch.equal(l1, l2) and torch.equal(l1, aux.fixed_labels)
    assert l1.min() >= 0 and l1.max() < mono.num_classes and len(l1.unique()) > 1
    again, _ = build_aux(cfg, mono, root="x", seed=0)
    other, _ = build_aux(cfg, mono, root="x", seed=1)
    assert torch.equal(again.fixed_labels, l1) and not torch.equal(other.fixed_labels, l1)
    moved = aux.to("cpu")
    assert isinstance(moved, AuxData) and torch.equal(moved.batch_labels(g), l1)


@pytest.mark.parametrize("name", ["natural", "gaussian"])
@pytest.mark.parametrize("value", ["true", True])
def test_true_labels_need_a_labelled_source(mono: DatasetBundle, name: str, value) -> None:
    with pytest.raises(ValueError, match=r"^aux\.labels: .*has none"):
        build_aux({"name": name, "labels": value}, mono, root="x", seed=0)


def test_true_labels_from_bool(mono: DatasetBundle) -> None:
    # YAML / Hydra parse `labels: true` as a boolean
    aux, _ = build_aux({"name": "heldout_test", "num_samples": 10, "labels": True}, mono, "x", 0)
    assert aux.labels == "true" and torch.equal(aux.batch_labels(torch.Generator()), aux.y)


# ---------------------------------------------------------- natural images


def test_natural_to_mnist_shape(mono: DatasetBundle) -> None:
    root = _require_natural()
    aux, out = build_aux({"name": "natural", "num_samples": 300}, mono, root=str(root), seed=0)
    assert out is mono and aux.y is None and aux.source == "natural"
    assert aux.x.shape == (300, 1, 28, 28) and aux.x.dtype == torch.float32
    # in [0, 1] before normalization with the private mean/std
    raw = aux.x * mono.std[0] + mono.mean[0]
    assert raw.min() >= -1e-5 and raw.max() <= 1 + 1e-5 and raw.std() > 0.1
    # reproduce by hand: grayscale with the luma weights, antialiased bilinear resize
    with np.load(root / NATURAL) as npz:
        images = npz["images"]
    rows = {r.tobytes(): i for i, r in enumerate(images.reshape(len(images), -1))}
    assert len(rows) == len(images)  # all distinct: selection is identifiable below
    aux32, _ = build_aux(
        {"name": "natural", "num_samples": 300}, _fake_rgb32(mono), root=str(root), seed=0
    )
    pix = (aux32.x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).flatten(1)
    idx = [rows[r.numpy().tobytes()] for r in pix]
    assert len(set(idx)) == 300  # without replacement
    x = torch.from_numpy(images[idx]).permute(0, 3, 1, 2).float() / 255
    gray = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    want = torch.nn.functional.interpolate(gray, size=(28, 28), mode="bilinear", antialias=True)
    want = (want - mono.mean[0]) / mono.std[0]
    torch.testing.assert_close(aux.x, want, atol=1e-5, rtol=1e-5)


def _fake_rgb32(like: DatasetBundle) -> DatasetBundle:
    """A bundle with in_shape 3x32x32 and mean 0 / std 1: aux.x = raw pixels in [0, 1]."""
    x = torch.zeros(4, 3, 32, 32)
    y = torch.arange(4)
    return DatasetBundle("fake", x, y, x, y, 10, None, (0.0,) * 3, (1.0,) * 3)


def test_natural_to_rgb_32(rgb: DatasetBundle) -> None:
    root = _require_natural()
    cfg = {"name": "natural", "num_samples": 50, "path": str(root / NATURAL)}
    aux, out = build_aux(cfg, rgb, root="unused", seed=2)
    assert out is rgb and aux.x.shape == (50, 3, 32, 32)
    mean = torch.tensor(rgb.mean).view(1, 3, 1, 1)
    std = torch.tensor(rgb.std).view(1, 3, 1, 1)
    raw = aux.x * std + mean
    # 32x32 RGB source, same size: the exact uint8 pixels come back
    torch.testing.assert_close(raw * 255, (raw * 255).round(), atol=1e-3, rtol=0)
    with np.load(root / NATURAL) as npz:
        images = npz["images"]
    pool = {r.tobytes() for r in images.reshape(len(images), -1)}
    for r in (raw * 255).round().to(torch.uint8).permute(0, 2, 3, 1).flatten(1):
        assert r.numpy().tobytes() in pool


def test_natural_default_path_and_interpolation(mono: DatasetBundle) -> None:
    root = _require_natural()
    a, _ = build_aux({"name": "natural", "num_samples": 5}, mono, root=str(root), seed=0)
    cfg = compose(["aux=natural", f"data.root={root}", "aux.num_samples=5"])
    b, _ = build_aux(cfg.aux, mono, root="elsewhere", seed=0)
    assert torch.equal(a.x, b.x)


def test_natural_missing_file(mono: DatasetBundle, tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="aux.path") as e:
        build_aux({"name": "natural"}, mono, root=str(tmp_path), seed=0)
    assert str(tmp_path / NATURAL) in str(e.value)
    missing = tmp_path / "nope.npz"
    with pytest.raises(DatasetNotFoundError, match=str(missing)):
        build_aux({"name": "natural", "path": str(missing)}, mono, root="x", seed=0)


def test_natural_small_npz(mono: DatasetBundle, tmp_path: Path) -> None:
    images = np.random.default_rng(0).integers(0, 256, (30, 32, 32, 3), dtype=np.uint8)
    path = tmp_path / "imgs.npz"
    np.savez(path, images=images)
    aux, _ = build_aux(
        {"name": "natural", "num_samples": 30, "path": str(path)}, mono, root="x", seed=0
    )
    assert aux.x.shape == (30, 1, 28, 28)
    with pytest.raises(ValueError, match=r"^aux\.num_samples: 31 exceeds the 30"):
        build_aux({"name": "natural", "num_samples": 31, "path": str(path)}, mono, "x", 0)


def _natural_error(data: DatasetBundle, path: Path, root: str = "x") -> str:
    """The one-line DataError of the natural source reading ``path``."""
    with pytest.raises(DataError) as err:
        build_aux({"name": "natural", "num_samples": 3, "path": str(path)}, data, root, 0)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    assert msg.endswith("; fix the file, or point aux.path at another one"), msg
    return msg


@pytest.mark.parametrize(
    ("write", "fragment"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:500]), "truncated or corrupt (BadZipFile"),
        (lambda p: p.write_bytes(b"hello"), "not a readable .npz file (ValueError"),
        (lambda p: np.savez(p, pictures=np.zeros((4, 8, 8, 3), np.uint8)), "no 'images' array"),
        (lambda p: np.savez(p, images=np.zeros((4, 8, 8, 3))), "must be uint8 of shape"),
        (lambda p: np.savez(p, images=np.zeros((4, 8, 8, 2), np.uint8)), "got uint8 (4, 8, 8, 2)"),
        (lambda p: np.savez(p, images=np.zeros(8, np.uint8)), "got uint8 (8,)"),
        (lambda p: p.write_bytes(_npy_bytes()), "a single .npy array, not an .npz archive"),
    ],
    ids=["truncated", "garbage", "no-images", "float", "two-channels", "1d", "npy"],
)
def test_natural_malformed_npz(mono: DatasetBundle, tmp_path: Path, write, fragment: str) -> None:
    path = tmp_path / "imgs.npz"
    np.savez(path, images=np.zeros((30, 32, 32, 3), np.uint8))
    write(path)
    assert fragment in _natural_error(mono, path)


def _npy_bytes() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 8, 8, 3), np.uint8))
    return buf.getvalue()


def test_natural_error_names_the_file_relative_to_the_root(mono, tmp_path: Path) -> None:
    path = tmp_path / NATURAL
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    with pytest.raises(DataError, match=r"^aux/tinyimagenet_val_32x32\.npz: "):
        build_aux({"name": "natural", "num_samples": 3}, mono, root=str(tmp_path), seed=0)


def test_truncated_copy_of_the_real_natural_npz(mono: DatasetBundle, tmp_path: Path) -> None:
    real = _require_natural() / NATURAL
    path = tmp_path / "cut.npz"
    path.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    assert "BadZipFile" in _natural_error(mono, path)


# ------------------------------------------------------------------ cifar100


def test_cifar100_from_fake_pickle(mono: DatasetBundle, rgb: DatasetBundle, tmp_path: Path) -> None:
    data, fine = write_fake_cifar100(tmp_path)
    aux, out = build_aux({"name": "cifar100", "num_samples": 25}, mono, root=str(tmp_path), seed=0)
    assert out is mono and aux.x.shape == (25, 1, 28, 28) and aux.y.shape == (25,)
    raw = aux.x * mono.std[0] + mono.mean[0]
    assert raw.min() >= -1e-5 and raw.max() <= 1 + 1e-5
    # 3x32x32: the exact images with their true fine labels
    aux3, _ = build_aux({"name": "cifar100", "num_samples": 25}, _fake_rgb32(rgb), str(tmp_path), 0)
    pool = {r.tobytes(): int(lab) for r, lab in zip(data, fine, strict=True)}
    for r, lab in zip(aux3.x.flatten(1), aux3.y, strict=True):
        assert pool[(r * 255).round().to(torch.uint8).numpy().tobytes()] == lab.item()
    # true labels are CIFAR-100 classes: only valid with 100 private classes
    with pytest.raises(ValueError, match=r"^aux\.labels: .*100 classes"):
        build_aux({"name": "cifar100", "labels": "true", "num_samples": 5}, mono, str(tmp_path), 0)
    data100 = _synthetic(tmp_path / "s", num_classes=100, n_train=200, n_test=100)
    aux100, _ = build_aux(
        {"name": "cifar100", "labels": "true", "num_samples": 5}, data100, str(tmp_path), 0
    )
    assert torch.equal(aux100.batch_labels(torch.Generator()), aux100.y)


@pytest.mark.parametrize(
    ("write", "fragment"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-100]), "corrupt pickle (UnpicklingError"),
        (
            lambda p: p.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)})),
            "no 'fine_labels' entry",
        ),
        (lambda p: p.write_bytes(pickle.dumps("x")), "expected a pickled dict, got str"),
    ],
    ids=["truncated", "no-labels", "not-a-dict"],
)
def test_cifar100_corrupt_pickle(mono: DatasetBundle, tmp_path: Path, write, fragment) -> None:
    write_fake_cifar100(tmp_path)
    write(tmp_path / "cifar-100-python" / "train")
    with pytest.raises(DataError) as err:
        build_aux({"name": "cifar100", "num_samples": 4}, mono, root=str(tmp_path), seed=0)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("cifar-100-python/train: "), msg
    assert fragment in msg and "aux.download=true" in msg, msg


def test_cifar100_missing(mono: DatasetBundle, tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="cifar-100-python") as e:
        build_aux({"name": "cifar100"}, mono, root=str(tmp_path), seed=0)
    assert str(tmp_path / "cifar-100-python" / "train") in str(e.value)
    assert "aux.download" in str(e.value)


def test_cifar100_download(mono: DatasetBundle, tmp_path: Path, monkeypatch) -> None:
    """aux.download=true goes through torchvision's CIFAR100 (faked here: no network)."""
    calls = []

    def failing(root, train, download):
        calls.append((root, train, download))
        raise RuntimeError("no network")

    def working(root, train, download):
        write_fake_cifar100(Path(root))

    fake = types.ModuleType("torchvision")
    fake.datasets = types.SimpleNamespace(CIFAR100=failing)
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    cfg = {"name": "cifar100", "num_samples": 4, "download": True}
    with pytest.raises(DatasetNotFoundError, match="no network"):
        build_aux(cfg, mono, root=str(tmp_path), seed=0)
    assert calls == [(str(tmp_path), True, True)]
    fake.datasets.CIFAR100 = working
    aux, _ = build_aux(cfg, mono, root=str(tmp_path), seed=0)
    assert aux.x.shape == (4, 1, 28, 28)


def _cifar100_npz(path: Path, n: int = 40, labels: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    fine = rng.integers(0, 100, n)
    np.savez(path, images=images, **({"labels": fine} if labels else {}))
    return images, fine


def test_cifar100_from_npz_path(rgb: DatasetBundle, tmp_path: Path) -> None:
    """aux.path: the .npz's images, converted like the other sources, with their labels."""
    images, fine = _cifar100_npz(tmp_path / "c100.npz")
    cfg = {"name": "cifar100", "num_samples": 25, "path": str(tmp_path / "c100.npz")}
    aux, out = build_aux(cfg, _fake_rgb32(rgb), root="unused", seed=0)
    assert out.num_classes == 10 and aux.x.shape == (25, 3, 32, 32) and aux.y.shape == (25,)
    pool = {im.transpose(2, 0, 1).tobytes(): int(lab) for im, lab in zip(images, fine, strict=True)}
    for r, lab in zip(aux.x, aux.y, strict=True):
        assert pool[(r * 255).round().to(torch.uint8).numpy().tobytes()] == lab.item()
    data100 = _synthetic(tmp_path / "s", num_classes=100, n_train=200, n_test=100)
    aux100, _ = build_aux({**cfg, "labels": "true"}, data100, "unused", 0)
    assert aux100.x.shape == (25, 1, 28, 28)
    assert torch.equal(aux100.batch_labels(torch.Generator()), aux100.y)
    # the same pick as the natural source reading the same file: one conversion code
    nat, _ = build_aux({**cfg, "name": "natural"}, data100, "unused", 0)
    assert torch.equal(nat.x, aux100.x)


def test_cifar100_npz_without_labels(mono: DatasetBundle, tmp_path: Path) -> None:
    _cifar100_npz(tmp_path / "c100.npz", labels=False)
    cfg = {"name": "cifar100", "num_samples": 5, "path": str(tmp_path / "c100.npz")}
    aux, _ = build_aux(cfg, mono, "unused", 0)
    assert aux.y is None and aux.x.shape == (5, 1, 28, 28)
    data100 = _synthetic(tmp_path / "s", num_classes=100, n_train=200, n_test=100)
    with pytest.raises(DataError, match=r"^aux\.labels: .*has no 'labels' array") as err:
        build_aux({**cfg, "labels": True}, data100, "unused", 0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("write", "fragment"),
    [
        (lambda p: np.savez(p, pictures=np.zeros((4, 8, 8, 3), np.uint8)), "no 'images' array"),
        (lambda p: np.savez(p, images=np.zeros((4, 8, 8, 3), np.uint8), labels=np.full(4, 100)),
         "'labels' must be 4 integers in [0, 100)"),
        (lambda p: np.savez(p, images=np.zeros((4, 8, 8, 3), np.uint8), labels=np.zeros(3, int)),
         "got int64 (3,)"),
    ],
    ids=["no-images", "label-out-of-range", "label-count"],
)  # fmt: skip
def test_cifar100_bad_npz(mono: DatasetBundle, tmp_path: Path, write, fragment) -> None:
    path = tmp_path / "c100.npz"
    write(path)
    with pytest.raises(DataError) as err:
        build_aux({"name": "cifar100", "num_samples": 2, "path": str(path)}, mono, "x", 0)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ") and fragment in msg, msg


def test_cifar100_npz_missing(mono: DatasetBundle, tmp_path: Path) -> None:
    missing = tmp_path / "nope.npz"
    with pytest.raises(DatasetNotFoundError, match=f"aux.path={missing} is not a file"):
        build_aux({"name": "cifar100", "path": str(missing)}, mono, root="x", seed=0)


def test_cifar100_real_npz_with_true_labels(tmp_path: Path) -> None:
    real = SHARED / "aux" / "cifar100_train_first10000.npz"
    if not real.is_file():
        pytest.skip(f"{real} not found (set DPSUB_DATA to the shared data folder)")
    data100 = _synthetic(tmp_path, num_classes=100, channels=3, size=32, n_train=200, n_test=100)
    cfg = {"name": "cifar100", "num_samples": 1000, "labels": True, "path": str(real)}
    aux, _ = build_aux(cfg, data100, "unused", 0)
    assert aux.x.shape == (1000, 3, 32, 32) and aux.labels == "true"
    assert len(aux.y.unique()) > 90 and 0 <= aux.y.min() and aux.y.max() < 100
    with np.load(real) as npz:
        assert len(npz["fine_label_names"]) == 100 and len(npz["labels"]) == 10000


# ------------------------------------------------------------------ gaussian


def test_gaussian_has_the_private_shape(mono: DatasetBundle, rgb: DatasetBundle) -> None:
    for data in (mono, rgb):
        aux, out = build_aux({"name": "gaussian", "num_samples": 500}, data, root="x", seed=0)
        assert out is data and aux.x.shape == (500, *data.in_shape) and aux.y is None
        assert abs(aux.x.mean().item()) < 0.02 and abs(aux.x.std().item() - 1) < 0.02


def test_none(mono: DatasetBundle) -> None:
    assert build_aux({"name": "none"}, mono, root="x", seed=0) == (None, mono)
    assert build_aux(OmegaConf.load(CONF / "none.yaml"), mono, root="x", seed=0) == (None, mono)


# ---------------------------------------------------------------- conversion


def test_convert_images_gray_to_rgb_and_resize() -> None:
    gray = torch.randint(0, 256, (3, 1, 8, 8), dtype=torch.uint8)
    out = convert_images(gray, (3, 16, 16), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    assert out.shape == (3, 3, 16, 16)
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    same = convert_images(gray, (1, 8, 8), (0.5,), (0.25,))
    torch.testing.assert_close(same, (gray.float() / 255 - 0.5) / 0.25)
    with pytest.raises(ValueError, match="channels"):
        convert_images(torch.zeros(1, 2, 4, 4), (3, 4, 4), (0,) * 3, (1,) * 3)


# ------------------------------------------------------------ config checks


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"name": "x"}, r"^aux\.name: unknown auxiliary data source 'x'; choose from \["),
        ({"name": "natural", "foo": 1}, r"^aux\.foo: unknown option for aux source natural; valid"),
        ({"name": "gaussian", "path": "a"}, r"^aux\.path: unknown option for aux source gaussian"),
        ({"name": "none", "num_samples": 3}, r"^aux\.num_samples: unknown option"),
        ({"name": "natural", "labels": "foo"}, r"^aux\.labels: must be one of \(.*\), got 'foo'"),
        ({"name": "gaussian", "labels": "true"}, r"^aux\.labels: "),
        ({"name": "heldout_test", "num_samples": 0}, r"^aux\.num_samples: must be >= 1"),
        ({"name": "heldout_test", "num_samples": 2.5}, r"^aux\.num_samples: must be an integer"),
        ({"name": "public_train", "seed": "a"}, r"^aux\.seed: "),
        ({"name": "cifar100", "download": "yes"}, r"^aux\.download: "),
        ({"name": "natural", "path": 3}, r"^aux\.path: "),
    ],
)
def test_check_aux_config_errors_name_the_key(options: dict, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        check_aux_config(options)


def test_build_aux_checks_the_config_first(mono: DatasetBundle) -> None:
    with pytest.raises(ConfigError, match=r"^aux\.num_samples"):
        build_aux({"name": "gaussian", "num_samples": -1}, mono, root="x", seed=0)


# ---------------------------------------------------------------- conf files


def test_conf_files_match_the_sources() -> None:
    names = {p.stem for p in CONF.glob("*.yaml")}
    assert names == {"none", *AUX_SOURCES}
    for name in AUX_SOURCES:
        cfg = compose([f"aux={name}", "data.root=/r"])  # its declared defaults and its own
        opts = OmegaConf.to_container(cfg.aux, resolve=True)
        assert opts.pop("name") == name
        assert set(opts) == set(AUX_SOURCES[name].defaults), name  # every option, nothing else
        for key, value in opts.items():
            if (name, key) == ("natural", "path"):
                assert value == "/r/aux/tinyimagenet_val_32x32.npz"
            else:
                assert value == AUX_SOURCES[name].defaults[key], (name, key)
        assert opts["labels"] in LABEL_MODES
        check_aux_config(cfg.aux)


# ------------------------------------------------------------ declarations


def test_every_declared_source_has_exactly_one_loader() -> None:
    assert list(AUX_LOADERS) == list(AUX_SOURCES)
    for name, declared in AUX_SOURCES.items():
        assert declared.name == name and declared.summary and "\n" not in declared.summary
        assert set(declared.defaults) >= {"num_samples", "labels", "seed"}
    with pytest.raises(TypeError):
        AUX_SOURCES["natural"].defaults["num_samples"] = 1  # read-only declarations


def test_a_loader_needs_a_declaration() -> None:
    with pytest.raises(ValueError, match="'imagenet' is not declared in dpsub.data.aux_options"):
        source("imagenet")
    with pytest.raises(ValueError, match="'natural' already has a loader"):
        source("natural")
    assert "imagenet" not in AUX_LOADERS


def test_aux_options_imports_neither_torch_nor_numpy() -> None:
    code = (
        "import sys\n"
        "from dpsub.data.aux_options import AUX_SOURCES, check_aux_config\n"
        "for name in AUX_SOURCES:\n"
        "    check_aux_config({'name': name})\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
