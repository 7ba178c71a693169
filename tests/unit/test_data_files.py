"""dpsub.data.files: the torch-free check of the data files agrees with the loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torchvision
from omegaconf import OmegaConf

from dpsub.data import DatasetNotFoundError, load_dataset
from dpsub.data.aux import CIFAR100_FOLDER
from dpsub.data.files import CIFAR100_TRAIN, check_files
from dpsub.data.registry import REGISTRY
from dpsub.errors import DataError

from conftest import SHARED, needs_shared

FILE_BACKED = ["mnist", "fashion_mnist", "cifar10", "cifar10_subset", "svhn"]


def cfg(root: Path, dataset: str, aux: dict | None = None, features=None, **extra):
    return OmegaConf.create(
        {"data": {"root": str(root), "download": False}, "dataset": {"name": dataset, **extra},
         "aux": aux or {"name": "none"}, "features": features or {"name": "none"}}
    )  # fmt: skip


def test_file_names_are_torchvision_s():
    tv = torchvision.datasets
    files = {n: (s.folder, s.files) for n, s in REGISTRY.items()}
    assert files["mnist"] == ("MNIST/raw", tuple(f for f, _ in tv.MNIST.resources))
    fashion = tuple(f for f, _ in tv.FashionMNIST.resources)
    assert files["fashion_mnist"] == ("FashionMNIST/raw", fashion)
    cifar = [f for f, _ in tv.CIFAR10.train_list + tv.CIFAR10.test_list]
    assert files["cifar10"] == (
        tv.CIFAR10.base_folder,
        (*cifar, tv.CIFAR10.meta["filename"]),
    )
    svhn = REGISTRY["svhn"]
    assert (*svhn.files, *svhn.extra_files) == tuple(v[1] for v in tv.SVHN.split_list.values())
    assert CIFAR100_TRAIN == f"{CIFAR100_FOLDER}/train"


@pytest.mark.parametrize("name", FILE_BACKED)
def test_an_empty_root_fails_like_the_loader(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as early:
        check_files(cfg(tmp_path, name))
    with pytest.raises(DatasetNotFoundError) as loader:
        load_dataset(name, root=tmp_path)
    for msg in (str(early.value), str(loader.value)):
        assert f"Dataset '{name}' not found" in msg and str(tmp_path) in msg
    first = str(loader.value).split("missing ")[1].split(",")[0].split(" ")[0]
    assert first in str(early.value)


def test_no_check_without_files_or_with_download(tmp_path):
    for name in ("digits", "synthetic"):
        check_files(cfg(tmp_path, name))
    check_files(OmegaConf.merge(cfg(tmp_path, "mnist"), {"data": {"download": True}}))


def test_extracted_idx_files_and_svhn_layouts(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in REGISTRY["mnist"].files:
        (raw / f.removesuffix(".gz")).touch()  # extracted copies count
    check_files(cfg(tmp_path, "mnist"))
    for f in REGISTRY["svhn"].files:
        (tmp_path / f).touch()  # torchvision's layout: directly in root
    check_files(cfg(tmp_path, "svhn"))
    with pytest.raises(DatasetNotFoundError, match="extra_32x32.mat"):
        check_files(cfg(tmp_path, "svhn", use_extra=True))


def test_aux_files(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="tinyimagenet_val_32x32.npz"):
        check_files(cfg(tmp_path, "digits", {"name": "natural", "path": None}))
    with pytest.raises(DatasetNotFoundError, match="elsewhere.npz"):
        check_files(
            cfg(tmp_path, "digits", {"name": "natural", "path": str(tmp_path / "elsewhere.npz")})
        )
    with pytest.raises(DatasetNotFoundError, match="cifar-100-python/train"):
        check_files(cfg(tmp_path, "digits", {"name": "cifar100", "download": False}))
    check_files(cfg(tmp_path, "digits", {"name": "cifar100", "download": True}))
    # aux.path: an .npz instead of torchvision's layout; labels=true needs its 'labels'
    c100 = tmp_path / "c100.npz"
    with pytest.raises(DatasetNotFoundError, match=f"aux.path={c100} is not a file"):
        check_files(cfg(tmp_path, "digits", {"name": "cifar100", "path": str(c100)}))
    np.savez(c100, images=np.zeros((2, 32, 32, 3), np.uint8))
    check_files(cfg(tmp_path, "digits", {"name": "cifar100", "path": str(c100)}))
    with pytest.raises(DataError, match=r"c100\.npz: no 'labels' array, which aux\.labels=true"):
        check_files(
            cfg(tmp_path, "digits", {"name": "cifar100", "path": str(c100), "labels": True})
        )
    np.savez(c100, images=np.zeros((2, 32, 32, 3), np.uint8), labels=np.zeros(2, int))
    check_files(cfg(tmp_path, "digits", {"name": "cifar100", "path": str(c100), "labels": True}))
    check_files(cfg(tmp_path, "digits", {"name": "gaussian"}))


@needs_shared
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10_subset"])
def test_the_shared_data_passes(name):
    check_files(cfg(SHARED, name, {"name": "natural", "path": None}))


def features_cfg(root: Path, features: dict, download: bool = False):
    c = cfg(root, "digits", features={"norm": "public", **features})
    c.data.download = download
    return c


@pytest.mark.parametrize(
    "name, key", [("scatternet", "norm_path"), ("cifar100_resnet", "pretrain_path")]
)
def test_features_without_public_images_say_how_to_get_them(tmp_path, name, key):
    """The default public images were a file this project derived (issue 36): now
    torchvision's CIFAR-100 under data.root, and one line saying how to get or replace it."""
    with pytest.raises(DatasetNotFoundError) as e:
        check_files(features_cfg(tmp_path, {"name": name}))
    msg = str(e.value)
    assert msg.startswith(f"features.{key}: ") and "\n" not in msg
    assert str(tmp_path / CIFAR100_TRAIN) in msg and "data.download=true" in msg
    assert ("features.norm=example" in msg) == (key == "norm_path")
    check_files(features_cfg(tmp_path, {"name": name}, download=True))  # fetched at load time
    replaced = {"norm": "example"} if key == "norm_path" else {key: __file__, "norm": "none"}
    check_files(features_cfg(tmp_path, {"name": name, **replaced}))


def test_features_read_torchvision_s_cifar100_or_the_npz_of_its_first_images(tmp_path):
    from dpsub.data.files import features_file
    from dpsub.features.public import read_public

    from helpers.data import write_fake_cifar100

    data, fine = write_fake_cifar100(tmp_path, n=30)
    torchvision_file = features_file({}, "norm_path", tmp_path)
    assert torchvision_file == tmp_path / CIFAR100_TRAIN
    images, labels = read_public(torchvision_file, tmp_path, 20)
    assert images.shape == (20, 32, 32, 3) and (labels == fine[:20]).all()
    assert (images.transpose(0, 3, 1, 2).reshape(20, -1) == data[:20]).all()
    npz = tmp_path / "aux" / "cifar100_train_first10000.npz"  # the same images, an npz
    npz.parent.mkdir()
    np.savez(npz, images=images, labels=labels)
    assert features_file({}, "norm_path", tmp_path) == npz
    again, _ = read_public(npz, tmp_path, 20)
    assert (again == images).all()
    assert features_file({"norm_path": "x.npz"}, "norm_path", tmp_path) == Path("x.npz")


def test_features_fetch_cifar100_with_data_download(tmp_path, monkeypatch):
    import sys
    import types

    from dpsub.features.public import public_file

    from helpers.data import write_fake_cifar100

    fake = types.ModuleType("torchvision")  # no network: torchvision's download faked
    fake.datasets = types.SimpleNamespace(
        CIFAR100=lambda root, **_: write_fake_cifar100(Path(root))
    )
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    with pytest.raises(DatasetNotFoundError, match="data.download=true"):
        public_file({"name": "scatternet"}, "norm_path", tmp_path)
    assert public_file({}, "norm_path", tmp_path, download=True) == tmp_path / CIFAR100_TRAIN
