"""dataset=npz and dataset=imagefolder through dpsub-train: end to end on files written here,
and every bad input one line naming it, exit code 2, nothing written (issue 39)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from conftest import cli_in_process

RUN = ("mechanism=dpsgd", "train.epochs=1", "train.batch_size=16", "privacy.epsilon=8")


def _npz(path, n=60, **over):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (n, 8, 8), dtype=np.uint8),
        "y_train": rng.integers(0, 3, n), "classes": np.array(["a", "b", "c"]),
        "x_test": rng.integers(0, 256, (20, 8, 8), dtype=np.uint8),
        "y_test": rng.integers(0, 3, 20),
    }  # fmt: skip
    arrays.update(over)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def _train(tmp_path, *overrides, check=True):
    return cli_in_process(
        *RUN, "model=cifar_cnn", *overrides, run_dir=tmp_path / "run", check=check
    )


def test_npz_trains_end_to_end(tmp_path):
    _train(tmp_path, "dataset=npz", f"dataset.path={_npz(tmp_path / 'd.npz')}", "model=mnist_cnn",
           "dataset.image_size=28")  # fmt: skip
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epsilon"] <= 8 and 0 <= summary["test_accuracy"] <= 1


def test_imagefolder_trains_end_to_end(tmp_path):
    rng = np.random.default_rng(1)
    for split, n in (("train", 30), ("test", 6)):
        for c in ("cat", "dog"):
            (tmp_path / "img" / split / c).mkdir(parents=True)
            for i in range(n // 2):
                img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(img).save(tmp_path / "img" / split / c / f"{i}.jpg")
    _train(tmp_path, "dataset=imagefolder", f"dataset.path={tmp_path / 'img'}")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epsilon"] <= 8


BAD = {
    "missing file": ({}, "nope.npz", "is not a file"),
    "wrong key": ({"x_train": None}, "d.npz", "x_train"),
    "wrong shape": ({"x_train": np.zeros((60, 2, 2, 2, 2), np.uint8)}, "d.npz", "x_train"),
    "labels out of range": ({"y_train": np.full(60, 5)}, "d.npz", "outside"),
    "nan": ({"x_train": np.full((60, 8, 8), np.nan, np.float32)}, "d.npz", "finite"),
    "fewer examples than the batch": ({"x_train": np.zeros((8, 8, 8), np.uint8),
                                       "y_train": np.zeros(8, int)}, "d.npz", "batch_size"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_npz_is_one_line_exit_2_nothing_written(tmp_path, case):
    over, name, words = BAD[case]
    path = _npz(tmp_path / "d.npz", **over) if name == "d.npz" else tmp_path / name
    proc = _train(tmp_path, "dataset=npz", f"dataset.path={path}", check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("dpsub")]
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()
