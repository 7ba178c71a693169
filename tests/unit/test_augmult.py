"""Augmentation multiplicity (train.augmult): views, gradients averaged before clipping, and the
randomness they use (docs/recipe.md)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpsub.data.augment import Augmult, build_augmult, view_padding
from dpsub.grads import GradEngine, clipped_sum
from dpsub.grads.ghost import GhostClipper
from dpsub.mechanisms import StepContext
from dpsub.privacy import Privatizer, SeededNoise
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg
from helpers.hostile import HOSTILE, releases

K = 3


def _reference_view(x: torch.Tensor, pad: int, dy: int, dx: int, flip: bool) -> torch.Tensor:
    """One view, the slow way: mirror-pad (border repeated), crop at (dy, dx), flip."""
    rows = torch.cat([x[:, :pad].flip(1), x, x[:, -pad:].flip(1)], 1)
    full = torch.cat([rows[:, :, :pad].flip(2), rows, rows[:, :, -pad:].flip(2)], 2)
    crop = full[:, dy : dy + x.shape[1], dx : dx + x.shape[2]]
    return crop.flip(2) if flip else crop


def test_views_are_mirror_padded_crops_and_flips_from_their_own_generator():
    x = torch.randn(4, 3, 8, 8)
    aug = Augmult(K, 2, True, torch.Generator().manual_seed(5))
    v = aug.views(x)
    g = torch.Generator().manual_seed(5)  # the same draws, replayed
    shift = torch.randint(0, 5, (4, K, 2), generator=g)
    flips = torch.randint(0, 2, (4, K), generator=g).bool()
    for i in range(4):
        for k in range(K):
            dy, dx, f = int(shift[i, k, 0]), int(shift[i, k, 1]), bool(flips[i, k])
            assert torch.equal(v[i, k], _reference_view(x[i], 2, dy, dx, f))
    assert view_padding(32) == 4 and view_padding(28) == 2 and view_padding(8) == 1
    assert build_augmult(1, "cifar10", (3, 32, 32), None) is None
    assert not build_augmult(4, "mnist", (1, 28, 28), g).flip


def _models():
    torch.manual_seed(0)
    conv = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2), nn.Flatten(), nn.Linear(100, 4),
    )  # fmt: skip
    linear = nn.Sequential(nn.Flatten(), nn.Linear(48, 6), nn.ReLU(), nn.Linear(6, 4))
    return {"conv": (conv, (1, 12, 12)), "linear": (linear, (3, 4, 4))}


def _view_rows(model, xv, y):
    """Every view's gradient, materialized by vmap: (b, K, p)."""
    e = GradEngine(copy.deepcopy(model), microbatch=1000)
    rows = torch.cat([c.grads for c in e.per_example(xv.flatten(0, 1), y.repeat_interleave(K))])
    return rows.view(xv.shape[0], K, -1)


def _averaged_rows(model, xv, y):
    """The materialized reference: the views' gradients averaged per example."""
    return _view_rows(model, xv, y).mean(1)


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_ghost_norm_of_the_averaged_gradient_equals_the_materialized_one(kind, strategy):
    """The view-summed gradient of a layer is sum_v B_v^T A_v: its ghost norm needs the
    cross-view Gram terms (the per-view ghost norms do not give it)."""
    model, shape = _models()[kind]
    xv, y = torch.randn(5, K, *shape), torch.randint(0, 4, (5,))
    G = _averaged_rows(model, xv, y)
    r = GhostClipper(model, 2, strategy=strategy).clipped_sum(xv, y, 0.05, views=K)
    torch.testing.assert_close(r.norms, G.norm(dim=1), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(r.grad_sum, clipped_sum(G, 0.05)[0].value, rtol=1e-4, atol=1e-6)
    naive = _view_rows(model, xv, y).norm(dim=2).square().sum(1).sqrt() / K  # no cross terms
    assert not torch.allclose(r.norms, naive, rtol=1e-2)


@pytest.mark.parametrize("backend", ["vmap", "opacus", "ghost"])
def test_every_backend_clips_the_average_of_the_views(backend):
    model, shape = _models()["conv"]
    xv, y = torch.randn(6, K, *shape), torch.randint(0, 4, (6,))
    G = _averaged_rows(model, xv, y)
    engine = GradEngine(copy.deepcopy(model), microbatch=4, backend=backend)
    engine.augmult = Augmult(K, 1, False, torch.Generator())
    rows = torch.cat([c.grads for c in engine.per_example(xv, y)])
    torch.testing.assert_close(rows, G, rtol=1e-4, atol=1e-6)
    total = engine.clipped_sum(xv, y, 0.05)
    assert total.sum.sensitivity == 0.05
    torch.testing.assert_close(total.sum.value, clipped_sum(G, 0.05)[0].value, rtol=1e-4, atol=1e-6)


def _run(*overrides):
    return build_run(compose_cfg(*SYNTH, "model=mnist_cnn", "train.batch_size=16", *overrides))


@pytest.mark.parametrize(
    ("mechanism", "backend", "extra"),
    [
        ("dpsgd", "vmap", []),
        ("dpsgd", "opacus", []),
        ("dpsgd", "ghost", []),
        ("gep", "vmap", ["aux=gaussian", "aux.num_samples=16", "mechanism.num_bases=4"]),
        ("rgp", "ghost", ["mechanism.rank=2"]),
    ],
)
def test_with_views_a_hostile_example_moves_each_release_by_at_most_its_sensitivity(
    mechanism, backend, extra
):
    run = _run(f"mechanism={mechanism}", f"grads.backend={backend}", "train.augmult=3", *extra)
    d = run.data
    bad = torch.stack([f(d.train_x[8 + i]) for i, f in enumerate(HOSTILE.values())])
    x = run.engine.augmult.views(torch.cat([d.train_x[:8], bad]))  # public: fixed for both
    y = d.train_y[: 8 + len(HOSTILE)]
    full = releases(run, x, y)
    for name, value, _ in full:
        assert torch.isfinite(value).all(), f"release {name!r} is not finite"
    kinds = {**{8 + i: kind for i, kind in enumerate(HOSTILE)}, 0: "ordinary", 1: "ordinary"}
    for i, kind in kinds.items():  # (the hostile ones may have no gradient at all: saturated)
        keep = torch.ones(len(y), dtype=torch.bool)
        keep[i] = False
        for (name, a, sens), (_, b, _) in zip(full, releases(run, x[keep], y[keep]), strict=True):
            gap = float((a - b).norm())
            assert gap <= sens * (1 + 1e-3) + 1e-6, f"{kind}: {name} moved {gap} > {sens}"


def test_augmult_1_is_the_batch_as_it_is():
    """K = 1: no views, no generator of its own, and the step is the mechanism's on the
    sampled batch itself (today's runs, bit for bit)."""
    run = _run()
    assert run.engine.augmult is None and "augment" not in run.generators
    sampler = run.generators["sampler"].get_state()
    out = train_step(run).result.grad
    run2 = _run()
    run2.generators["sampler"].set_state(sampler)
    idx = run2.sampler.sample()
    noise = Privatizer(SeededNoise(torch.Generator().manual_seed(2)))
    ctx = StepContext(0, run2.total_steps, run2.account.batch_size, run2.z, noise, run2.rng)
    again = run2.mechanism.step(run2.data.train_x[idx], run2.data.train_y[idx], ctx).grad
    assert torch.equal(out, again)


def test_the_augmentation_draws_leave_sampling_and_noise_streams_alone():
    plain, views = _run(), _run("train.augmult=4")
    assert set(views.generators) == {*plain.generators, "augment"}
    before = views.generators["augment"].get_state()
    for run in (plain, views):
        train_step(run)
        train_step(run)
    for name in ("sampler", "noise", "public"):
        assert torch.equal(plain.generators[name].get_state(), views.generators[name].get_state())
    assert not torch.equal(before, views.generators["augment"].get_state())


def test_augmult_on_frozen_features_is_refused():
    from dpsub.config import validate
    from dpsub.errors import ConfigError

    cfg = compose_cfg(*SYNTH, "model=linear", "features=scatternet", "train.augmult=2")
    with pytest.raises(ConfigError, match="^train.augmult"):
        validate(cfg)
