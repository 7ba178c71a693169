"""Hostile examples cannot break a release: every mechanism x backend x GEP mode (linear model).

The batch and the check: ``tests/helpers/hostile.py``; the other models (a CNN, frozen
features) and bf16 autocast: ``tests/e2e/test_e2e_hostile_inputs.py``.
"""

from __future__ import annotations

import pytest
import torch

from dpsub.grads import ClippedResidualSum
from dpsub.training.build import build_run, train_step

from conftest import compose_cfg, needs_shared
from helpers.hostile import GEP_MODES, MECHANISMS, MODELS, build, check_hostile
from helpers.mechanisms import ctx, setup


@pytest.mark.parametrize("backend", ["vmap", "opacus", "ghost"])
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_a_hostile_example_moves_each_release_by_at_most_its_sensitivity(mechanism, backend):
    run = build(
        f"mechanism={mechanism}",
        *MECHANISMS[mechanism],
        *MODELS["linear"],
        f"grads.backend={backend}",
    )
    check_hostile(run)


@pytest.mark.parametrize(
    ("mechanism", "mode"),
    GEP_MODES,
    ids=[f"{m}-" + "-".join(o.split("=")[1] for o in mode) for m, mode in GEP_MODES],
)
def test_gep_hostile_examples_in_every_residual_mode_and_precision(mechanism, mode):
    run = build(f"mechanism={mechanism}", *MECHANISMS[mechanism], "model=linear", *mode)
    check_hostile(run)


# ------------------------------------------- an embedding that overflows (issue: all-NaN GEP)
def _overflowing_row(basis) -> torch.Tensor:
    """A gradient row with finite entries whose embedding (and norm) overflows float32: a
    multiple of the first basis vector, entries ~1e38, ``w_1 = ||g|| ~ 1e38 sqrt(p)``."""
    b = basis.reconstruct(torch.eye(basis.k)[0]).double()
    row = b * (2e38 / b.abs().max())
    assert torch.isfinite(row.float()).all() and not torch.isfinite(row.float().norm())
    return row.float()


@pytest.mark.parametrize("residual", ["bookkeeping", "materialize"])
@pytest.mark.parametrize("mechanism", ["gep", "bgep"])
def test_a_row_whose_embedding_overflows_contributes_nothing(mechanism, residual):
    """Finite entries, infinite norm and embedding: dropped from every clipped quantity, so
    the release equals the release without it (it was all-NaN: 0 * inf in the residual)."""
    opts = {"residual": residual} if mechanism == "gep" else {}
    model, engine, mech, x, y = setup(mechanism, num_bases=8, diagnostics_every=0, **opts)
    mech.current_basis(ctx())
    row = _overflowing_row(mech.basis)
    assert not torch.isfinite(mech.basis.embed(row[None])).all()
    per_example = engine.per_example

    def with_row(xb, yb, target=None):  # the private batch's gradients plus the hostile row
        chunks = list(per_example(xb, yb, target))
        c = chunks[-1]
        chunks[-1] = type(c)(torch.cat([c.grads, row[None]]), c.loss, c.correct)
        yield from chunks

    clean = mech.step(x, y, ctx()).grad
    engine.per_example = with_row
    out = mech.step(x, y, ctx())
    assert torch.isfinite(out.grad).all()
    torch.testing.assert_close(out.grad, clean, rtol=1e-5, atol=1e-8)
    assert int(out.stats.clip.nonfinite) == 1


@needs_shared
def test_gep_on_mnist_with_one_image_times_1e38_releases_a_finite_gradient():
    """The audit's reproduction through the trainer's own step (model=linear, real MNIST)."""
    run = build_run(
        compose_cfg(
            "dataset=mnist", "dataset.train_size=2000", "model=linear", "mechanism=gep",
            "aux.num_samples=60", "mechanism.num_bases=30",
        )
    )  # fmt: skip
    d = run.data
    d.train_x, d.train_y = (
        torch.cat([d.train_x, d.train_x[3:4] * 1e38]),
        torch.cat([d.train_y, d.train_y[3:4]]),
    )
    out = train_step(run, idx=torch.cat([torch.arange(60), torch.tensor([len(d.train_y) - 1])]))
    assert torch.isfinite(out.result.grad).all()
    assert int(out.result.stats.clip.nonfinite) == 1
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


def test_the_residual_sum_drops_a_row_whose_bound_or_embedding_is_not_finite():
    """Book-keeping's own guard: ``c^T G - lift(c^T W)`` never computes ``0 * inf``."""
    g = torch.Generator().manual_seed(0)
    G, W = torch.randn(5, 7, generator=g), torch.randn(5, 3, generator=g)
    norms = torch.rand(5, generator=g) + 0.5
    W[1, 0], norms[3] = torch.inf, torch.inf
    lift = lambda w: torch.cat([w, w.new_zeros(4)])  # noqa: E731
    res, ref = ClippedResidualSum(0.8), ClippedResidualSum(0.8)
    res.add(G, W, norms)
    keep = torch.tensor([True, False, True, False, True])
    ref.add(G[keep], W[keep], norms[keep])
    got = res.sum(lift, 7, "cpu")
    assert torch.isfinite(got.value).all()
    torch.testing.assert_close(got.value, ref.sum(lift, 7, "cpu").value)
    assert int(res.stats.nonfinite) == 2 and res.stats.n == 5
