"""dataset=npz and dataset=imagefolder: your own data, with no statistic of it reaching the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dpsub.config import ConfigError, validate
from dpsub.data import load_dataset
from dpsub.data.registry import REGISTRY
from dpsub.errors import DataError

from conftest import compose_cfg


def _npz(path, x, y, classes=True, **extra):
    arrays = dict(x_train=x[:40], y_train=y[:40], x_test=x[40:], y_test=y[40:], **extra)
    if classes:
        arrays["classes"] = np.array(["a", "b", "c"])
    np.savez(path, **arrays)
    return path


def _load(name, path, **user):
    return load_dataset(name, "/nonexistent", user={"path": str(path), **user})


@pytest.mark.parametrize("layout", ["nhw", "nhwc", "nchw"])
def test_npz_layouts_load_channels_first(tmp_path, layout):
    rng = np.random.default_rng(0)
    shape = {"nhw": (50, 8, 8), "nhwc": (50, 8, 8, 3), "nchw": (50, 3, 8, 8)}[layout]
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    d = _load("npz", _npz(tmp_path / "d.npz", x, rng.integers(0, 3, 50)))
    assert d.in_shape == ((1, 8, 8) if layout == "nhw" else (3, 8, 8))
    assert (len(d.train_y), len(d.test_y), d.num_classes, d.classes) == (40, 10, 3, ["a", "b", "c"])
    assert d.train_x.dtype == torch.float32 and d.train_x.min() >= -1 and d.train_x.max() <= 1


def test_normalization_and_classes_are_not_statistics_of_the_data(tmp_path):
    """Two datasets with different pixels and labels get the same constants and classes."""
    rng = np.random.default_rng(1)
    dark = rng.integers(0, 30, (50, 8, 8), dtype=np.uint8)
    light = rng.integers(200, 256, (50, 8, 8), dtype=np.uint8)
    a = _load(
        "npz", _npz(tmp_path / "a.npz", dark, np.zeros(50, int), classes=False), num_classes=7
    )
    b = _load(
        "npz", _npz(tmp_path / "b.npz", light, np.ones(50, int), classes=False), num_classes=7
    )
    assert a.mean == b.mean == (0.5,) and a.std == b.std == (0.5,)
    assert a.num_classes == b.num_classes == 7  # the labels' maximum (0 and 1) is not used
    c = _load("npz", tmp_path / "a.npz", num_classes=7, mean=[0.1], std=[0.2])
    assert c.mean == (0.1,) and c.std == (0.2,)


def test_npz_errors_name_the_problem(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (50, 8, 8), dtype=np.uint8)
    with pytest.raises(DataError, match="dataset.num_classes"):
        _load("npz", _npz(tmp_path / "n.npz", x, rng.integers(0, 3, 50), classes=False))
    with pytest.raises(DataError, match="outside"):
        _load("npz", _npz(tmp_path / "o.npz", x, np.full(50, 3)))
    with pytest.raises(DataError, match="x_test"):
        np.savez(tmp_path / "m.npz", x_train=x, y_train=np.zeros(50, int))
        _load("npz", tmp_path / "m.npz", num_classes=2)
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        _load("npz", _npz(tmp_path / "f.npz", x.astype(np.float32), rng.integers(0, 3, 50)))


def _folder(root, sizes=None, test_classes=("cat", "dog"), gray=False):
    rng = np.random.default_rng(3)
    for split, classes in (("train", ("cat", "dog")), ("test", test_classes)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(3):
                s = (sizes or {}).get((split, c, i), 12)
                img = rng.integers(0, 256, (s, s) if gray else (s, s, 3), dtype=np.uint8)
                Image.fromarray(img).save(root / split / c / f"{i}.png")
    return root


def test_imagefolder_classes_are_the_train_folders(tmp_path):
    d = _load("imagefolder", _folder(tmp_path / "f"))
    assert d.classes == ["cat", "dog"] and d.num_classes == 2 and d.in_shape == (3, 12, 12)
    assert d.train_y.tolist() == [0, 0, 0, 1, 1, 1] and len(d.test_y) == 6


def test_imagefolder_channels_are_never_decided_by_a_private_image(tmp_path):
    """One colour training image among gray ones used to make every image RGB (the model's
    input shape, and so the released model, then told whether it was there)."""
    root = _folder(tmp_path / "f", gray=True)
    assert _load("imagefolder", root).in_shape == (1, 12, 12)
    colour = np.random.default_rng(0).integers(0, 256, (12, 12, 3), dtype=np.uint8)
    Image.fromarray(colour).save(root / "train" / "cat" / "9.png")
    d = _load("imagefolder", root)
    assert d.in_shape == (1, 12, 12) and len(d.train_y) == 7  # its luminance


def test_imagefolder_sizes_must_agree_unless_resized(tmp_path):
    root = _folder(tmp_path / "f", sizes={("train", "dog", 1): 16})
    with pytest.raises(DataError, match="image_size"):
        _load("imagefolder", root)
    d = load_dataset("imagefolder", "/x", image_size=10, user={"path": str(root)})
    assert d.in_shape == (3, 10, 10)
    with pytest.raises(DataError, match="not in train"):
        _load("imagefolder", _folder(tmp_path / "g", test_classes=("cat", "emu")))


def test_user_keys_belong_to_user_datasets_and_the_registry_lists_them():
    assert {n for n, s in REGISTRY.items() if s.user_path} == {"npz", "imagefolder"}
    with pytest.raises(ConfigError, match="dataset.path"):
        validate(compose_cfg("dataset=digits", "+dataset.path=/x"))
    with pytest.raises(ConfigError, match="together"):
        validate(compose_cfg("dataset=npz", "dataset.path=/x", "dataset.mean=[0.5]"))


def test_npz_without_test_arrays_needs_a_validation_split(tmp_path):
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "xy.npz", x=rng.integers(0, 256, (30, 8, 8), dtype=np.uint8),
             y=rng.integers(0, 2, 30))  # fmt: skip
    with pytest.raises(DataError, match="validation_size"):
        _load("npz", tmp_path / "xy.npz", num_classes=2)
    d = _load("npz", tmp_path / "xy.npz", num_classes=2, validation_size=10)
    assert (len(d.train_y), len(d.test_y)) == (30, 0)
