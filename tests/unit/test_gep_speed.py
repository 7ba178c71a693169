"""GEP at lower cost: streamed and warm-started power steps, book-keeping residual clipping.

Each test compares a fast path with the reference it replaces: a tracked (warm-started)
subspace with the exact top-k subspace, the streamed power step with the stacked one, the
book-keeping residual with the materialized residual.
"""

from __future__ import annotations

import math

import pytest
import torch

from dpsub.grads import ClippedAccumulator, ClippedResidualSum, ParamLayout, finite_norms
from dpsub.models import build_model
from dpsub.subspace import (
    RESIDUAL_SLACK,
    Group,
    GroupedBasis,
    GroupedPowerStep,
    PowerStep,
    captured_energy,
    fit_grouped_basis,
    group_parameters,
    orthonormal_random_basis,
    power_iteration,
    random_starts,
)

from conftest import loop_grads
from helpers.mechanisms import ctx, setup


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def decaying(m: int = 50, d: int = 800, k: int = 6, seed: int = 8) -> tuple[torch.Tensor, ...]:
    """Ga (m x d) with sigma_{k+1} / sigma_k = 0.8 and its exact top-k right singular rows."""
    g = gen(seed)
    U = torch.linalg.qr(torch.randn(m, m, generator=g))[0]
    Vt = orthonormal_random_basis(d, m, g)
    s = torch.tensor([10.0, 9.5, 9.0, 8.5, 8.0, 7.5] + [6.0] * (m - k))
    return (U * s) @ Vt, Vt[:k]


def sin_angle(exact: torch.Tensor, B: torch.Tensor) -> float:
    """Sine of the largest principal angle between two row spaces (orthonormal rows)."""
    E, B = exact.double(), B.double()
    return float(torch.linalg.matrix_norm(E - (E @ B.T) @ B, ord=2))


# ------------------------------------------------------------------ tracking
def test_tracked_subspace_converges_to_the_exact_one():
    """Warm-started t = 1 updates on a fixed matrix: the error shrinks like t = n iterations;
    fresh t = 1 starts stay where one iteration gets them."""
    Ga, exact = decaying()
    B = power_iteration(Ga, 6, iters=1, generator=gen(1))
    fresh = [sin_angle(exact, power_iteration(Ga, 6, 1, gen(s))) for s in range(2, 6)]
    errs = []
    for _ in range(40):
        B = power_iteration(Ga, 6, iters=1, start=B)
        errs.append(sin_angle(exact, B))
    assert errs[-1] < 1e-4 < min(fresh)
    assert errs[4] < min(fresh) and errs[20] < errs[4]
    # 41 tracked updates = one run of 41 iterations (same start)
    full = power_iteration(Ga, 6, iters=41, generator=gen(1))
    assert sin_angle(full, B) < 1e-5
    with pytest.raises(ValueError, match="start"):
        power_iteration(Ga, 6, start=B[:5])


def test_tracked_grouped_subspace_converges_per_group():
    (Ga1, exact1), (Ga2, exact2) = decaying(d=450, seed=1), decaying(d=450, seed=2)
    Ga = torch.cat([Ga1, Ga2], dim=1)
    groups = [Group("a", 0, 450), Group("b", 450, 900)]
    basis = fit_grouped_basis(Ga, groups, 12, generator=gen(2))
    assert basis.ks == [6, 6]
    for _ in range(40):
        basis = fit_grouped_basis(Ga, groups, 12, start=basis)
    assert sin_angle(exact1, basis.bases[0]) < 1e-4
    assert sin_angle(exact2, basis.bases[1]) < 1e-4
    with pytest.raises(ValueError, match="does not match"):
        fit_grouped_basis(Ga, groups, 10, start=basis)


# ----------------------------------------------------------------- streaming
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_streamed_power_step_equals_the_stacked_one(dtype):
    Ga, _ = decaying()
    Ga = Ga * 1e-3  # gradient-sized entries (fp16 scaling)
    start = torch.randn(6, 800, generator=gen(3))
    one = PowerStep(start, dtype)
    one.add(Ga)
    streamed = PowerStep(start, dtype)
    for chunk in Ga.split(7):  # chunks of different scales are weighted alike
        streamed.add(chunk * 1.0)
    assert streamed.rows == 50
    tol = 1e-5 if dtype == "fp32" else 0.05
    assert sin_angle(one.finish(), streamed.finish()) < tol


def test_grouped_streamed_step_equals_fit_grouped_basis():
    Ga = torch.randn(30, 700, generator=gen(4))
    groups = [Group("a", 0, 50), Group("b", 50, 250), Group("c", 250, 700)]
    ref = fit_grouped_basis(Ga, groups, 12, generator=gen(5))
    starts = random_starts(groups, ref.ks, gen(5), "cpu")
    step = GroupedPowerStep(groups, starts, 700)
    for chunk in Ga.split(8):
        step.add(chunk)
    got = step.finish()
    for a, b in zip(ref.bases, got.bases, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gep_streams_its_anchors_into_the_reference_basis():
    """The mechanism's fit (micro-batches of anchors, t = 1 and t = 2) is fit_grouped_basis."""
    for t in (1, 2):
        model, engine, mech, *_ = setup("gep", num_bases=8, aux_m=64, power_iters=t)
        got = mech.fit_subspace(gen(7))
        g = gen(7)
        labels = mech.aux.batch_labels(g)
        Ga = loop_grads(model, mech.aux.x, labels)
        ref = fit_grouped_basis(Ga, mech.groups, 8, iters=t, generator=g)
        for a, b in zip(ref.bases, got.bases, strict=True):
            assert sin_angle(a, b) < 1e-4


# ------------------------------------------------------------- book-keeping
def hard_rows(basis: GroupedBasis, seed: int = 0, tiny: bool = True) -> torch.Tensor:
    """Rows with large, moderate, tiny and no residual (``tiny``), at norms 1e-3 to 1e4."""
    g = gen(seed)
    inside = basis.reconstruct(torch.randn(6, basis.k, generator=g))
    noise = torch.randn(6, basis.dim, generator=g) / math.sqrt(basis.dim)
    rows = [torch.randn(6, basis.dim, generator=g), inside + 0.3 * noise]
    if tiny:
        rows += [inside, inside + 1e-3 * noise]  # residual ~ rounding, and tiny
    G = torch.cat(rows)
    return G * torch.logspace(-3, 4, G.shape[0])[:, None]


def materialized_norms(basis: GroupedBasis, G: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """||g - w B|| in float64 for the float32 rows, embeddings and basis actually used."""
    return basis.to(dtype=torch.float64).residual(G.double(), W.double()).norm(dim=1)


def test_bookkept_residual_norms_bound_the_materialized_ones():
    groups = [Group("a", 0, 300), Group("b", 300, 2000)]
    basis = fit_grouped_basis(torch.randn(40, 2000, generator=gen(1)), groups, 20, generator=gen(2))
    G = hard_rows(basis)
    G_, norms, _ = finite_norms(G)
    W = basis.embed(G_)
    bound = basis.residual_norms(norms, W)
    true = materialized_norms(basis, G_, W)
    assert (bound.double() >= true).all()
    # tight: within the margin sqrt(slack) ||g|| of the true norm
    assert (bound.double() <= true + 1.01 * math.sqrt(RESIDUAL_SLACK) * norms.double()).all()
    # exact for a basis that is not orthonormal too (B B^T enters the bound)
    skewed = GroupedBasis(groups, [b * 1.01 for b in basis.bases], 2000)
    W = skewed.embed(G_)
    bound = skewed.residual_norms(norms, W)
    true = materialized_norms(skewed, G_, W)
    assert (bound.double() >= true).all()
    assert (bound.double() <= true + 1.01 * math.sqrt(RESIDUAL_SLACK) * norms.double()).all()


def test_float32_rounding_stays_far_below_the_bookkeeping_margin():
    """What the margin must absorb, on ResNet-20's stage groups (k = 256, p = 268k): the
    matmul rounding ||w^ - B g|| / ||g|| and the rounding of B B^T, both < slack / 40."""
    layout = ParamLayout.of(build_model("resnet20", (3, 32, 32), 10))
    groups = group_parameters(layout, "stages")
    g = gen(0)
    basis = fit_grouped_basis(
        1e-2 * torch.randn(300, layout.dim, generator=g), groups, 256, generator=g
    )
    G = torch.randn(16, layout.dim, generator=g)
    exact = basis.to(dtype=torch.float64)
    rho = (basis.embed(G).double() - exact.embed(G.double())).norm(dim=1) / G.double().norm(dim=1)
    assert rho.max() < RESIDUAL_SLACK / 40
    for M, b in zip(basis.grams(), exact.bases, strict=True):
        assert torch.linalg.matrix_norm(M.double() - b @ b.T, ord=2) < RESIDUAL_SLACK / 40


def test_bookkept_residual_sum_equals_the_materialized_one():
    """c^T G - B^T (c^T W) is the clipped sum of the rows of R = G - W B."""
    groups = [Group("a", 0, 300), Group("b", 300, 2000)]
    basis = fit_grouped_basis(torch.randn(40, 2000, generator=gen(1)), groups, 20, generator=gen(2))
    G = hard_rows(basis, seed=3, tiny=False)  # (a rounding-level residual is 0 or noise)
    bound = 0.5
    ref, exact, book = ClippedAccumulator(), ClippedResidualSum(bound), ClippedResidualSum(bound)
    for rows in G.split(7):
        W = basis.embed(rows)
        R = basis.residual(rows, W)
        ref.add("r", R, bound)
        exact.add(rows, W, R.norm(dim=1))
        book.add(rows, W, basis.residual_norms(rows.norm(dim=1), W))
    want = ref.sum("r", bound, 2000, "cpu")
    assert book.stats == exact.stats == ref.stats["r"]
    for acc, rtol in ((exact, 1e-5), (book, 2e-2)):  # the margin shrinks some clipped rows
        got = acc.sum(basis.reconstruct, 2000, "cpu")
        assert got.sensitivity == want.sensitivity == bound
        assert (got.value - want.value).norm() < rtol * want.value.norm()
    empty = ClippedResidualSum(bound).sum(basis.reconstruct, 2000, "cpu")
    assert not empty.value.any() and empty.sensitivity == bound


def gep_steps(residual: str, x, y, z: float = 0.0, seed: int = 0, **opts):
    """One GEP step with the residual clipped by ``residual``; returns (grad, ctx, stats)."""
    model, engine, mech, *_ = setup(
        "gep", num_bases=8, diagnostics_every=0, residual=residual, **opts
    )
    c = ctx(seed=seed, B=1.0, z=z)
    out = mech.step(x, y, c)
    return out, c


def test_gep_bookkeeping_step_equals_the_materialized_step():
    S1, S2 = 0.05, 0.02
    model, engine, mech, x, y = setup("gep", num_bases=8)
    x, y = x.clone(), y.clone()
    x[0] *= 1e4  # a huge gradient
    x[3] = float("nan")  # a non-finite example
    outs = {}
    for residual in ("materialize", "bookkeeping"):
        outs[residual], c = gep_steps(residual, x, y, clip_embedding=S1, clip_residual=S2)
        assert [r.sensitivity for r in c.noise.records] == [S1, S2]
    a, b = outs["materialize"], outs["bookkeeping"]
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-4 * S2)
    assert b.stats.clip == a.stats.clip and b.stats.clip.nonfinite == 1
    as_floats = lambda m: {k: float(v) for k, v in m.items()}  # noqa: E731 (device tensors)
    assert as_floats(b.private_metrics) == pytest.approx(as_floats(a.private_metrics))
    # removing the huge example changes the (noise-free) release by at most S1 + S2
    rest, _ = gep_steps("bookkeeping", x[1:], y[1:], clip_embedding=S1, clip_residual=S2)
    assert (b.grad - rest.grad).norm() <= (S1 + S2) * (1 + 1e-4)
    # same noise draws, same records: the step's multiplier is exactly z
    for residual in ("materialize", "bookkeeping"):
        _, c = gep_steps(residual, x, y, z=1.3, clip_embedding=S1, clip_residual=S2)
        assert c.noise.effective_multiplier() == pytest.approx(1.3, rel=1e-12)


# ------------------------------------------------------------- GEP cadence
def test_gep_refits_warm_between_refreshes(monkeypatch):
    model, engine, mech, x, y = setup(
        "gep", num_bases=8, subspace_every=2, warm_start=True, refresh_every=6
    )
    calls = []
    fit = mech.fit_subspace

    def spy(generator, start=None):
        calls.append((step, start is None))
        return fit(generator, start)

    monkeypatch.setattr(mech, "fit_subspace", spy)
    for step in range(12):
        mech.current_basis(ctx(step=step))
    assert calls == [(0, True), (2, False), (4, False), (6, True), (8, False), (10, False)]
    assert mech.state_dict()["fresh_step"] == 6
    again = setup("gep", num_bases=8)[2]
    again.load_state_dict(mech.state_dict())
    assert (again.refit.last, again.fresh.last) == (10, 6)


def test_paper_default_refits_from_random_starts_every_step(monkeypatch):
    mech = setup("gep", num_bases=8)[2]
    o = mech.opts
    assert (o.subspace_every, o.warm_start, o.anchor_precision) == (1, False, "fp32")
    starts = []
    fit = mech.fit_subspace
    monkeypatch.setattr(mech, "fit_subspace", lambda g, start=None: starts.append(start) or fit(g))
    for step in range(3):
        mech.current_basis(ctx(step=step))
    assert starts == [None, None, None]


def test_gep_tracking_converges_to_the_top_subspace_of_the_anchors():
    """Fixed anchors (labels drawn once), fixed model: tracked t = 1 updates reach the
    exact top-k right singular subspace of the anchor gradients (sigma_4 / sigma_3 = 0.69)."""
    model, engine, mech, *_ = setup("gep", num_bases=3, warm_start=True, grouping="flat")
    Ga = loop_grads(model, mech.aux.x, mech.aux.fixed_labels)
    exact = torch.linalg.svd(Ga.double(), full_matrices=False)[2][:3]
    errs = [sin_angle(exact, mech.current_basis(ctx(step=s)).bases[0]) for s in range(30)]
    assert errs[-1] < 1e-5 and errs[0] > 0.5


def test_bf16_anchors_capture_nearly_the_fp32_energy():
    model, engine, mech, *_ = setup("gep", num_bases=8, grouping="flat")
    low = setup("gep", num_bases=8, grouping="flat", anchor_precision="bf16")[2]
    Ga = loop_grads(model, mech.aux.x, mech.aux.fixed_labels)
    e32 = captured_energy(Ga, mech.fit_subspace(gen(0)))
    e16 = captured_energy(Ga, low.fit_subspace(gen(0)))
    assert e16 > 0.97 * e32
    # autocast covered the anchors only: the power step's output is float32
    assert low.fit_subspace(gen(0)).dtype == torch.float32
