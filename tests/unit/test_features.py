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


def test_normalization_does_not_depend_on_the_private_split(tmp_path, public_npz):
    """Two private training sets, one test set: the normalized test features are identical
    and equal to normalization by the PUBLIC images' feature statistics."""
    o = opts(tmp_path, public_npz)
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


@pytest.mark.parametrize("name", ["linear", "scatter_cnn"])
def test_per_example_gradients_and_ghost_norms_are_exact(name):
    """float64: vmap rows, ghost rows and ghost norms equal a loop of single backward passes."""
    torch.manual_seed(0)
    shape = (6, 4, 4)
    model = build_model(name, shape, 5).double()
    x, y = torch.randn(7, *shape, dtype=torch.float64), torch.randint(0, 5, (7,))
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
