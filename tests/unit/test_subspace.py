"""Tests of dpsub.subspace: grouping, quota split, power method, projections, diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from dpsub.grads import ParamLayout
from dpsub.models import build_model
from dpsub.subspace import (
    GROUPING_SCHEMES,
    Group,
    GroupedBasis,
    captured_energy,
    fit_grouped_basis,
    group_parameters,
    orthonormal_random_basis,
    orthonormality_error,
    power_iteration,
    relative_error_of_mean,
    relative_projection_error,
    resolve_dtype,
    row_relative_errors,
    split_quota,
    stable_rank,
    top_eigvecs_from_gram,
)


# --------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def resnet_layout() -> ParamLayout:
    torch.manual_seed(0)
    return ParamLayout.of(build_model("resnet20", (3, 32, 32), 10))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_partition(groups: list[Group], p: int) -> None:
    """Groups are contiguous, non-overlapping, non-empty and cover [0, p) in order."""
    assert groups[0].start == 0
    assert groups[-1].end == p
    for a, b in zip(groups[:-1], groups[1:], strict=True):
        assert a.end == b.start
    assert all(g.size > 0 for g in groups)
    assert sum(g.size for g in groups) == p


def planted(m: int, d: int, r: int, noise: float = 1e-4, seed: int = 0, gap: bool = True):
    """Ga = U diag(s) V + noise with V (r x d) orthonormal rows; returns (Ga, V)."""
    g = gen(seed)
    V = orthonormal_random_basis(d, r, generator=g)
    U = torch.randn(m, r, generator=g)
    s = torch.linspace(10.0, 5.0, r) if gap else torch.ones(r)
    Ga = (U * s) @ V + noise * torch.randn(m, d, generator=g)
    return Ga, V


def subspace_overlap(V: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Norms of the projections of the rows of V onto span(B) (1 = contained)."""
    return (V.double() @ B.double().T).norm(dim=1)


# -------------------------------------------------------------------------- grouping
def test_stages_resnet20(resnet_layout):
    groups = group_parameters(resnet_layout, "stages")
    assert [g.name for g in groups] == ["conv1", "layer1", "layer2", "layer3", "fc"]
    assert_partition(groups, resnet_layout.dim)
    sl = resnet_layout.slices()
    assert groups[0].size == sl["conv1.weight"].stop - sl["conv1.weight"].start == 3 * 16 * 9
    assert groups[-1].size == 64 * 10 + 10
    # Every parameter falls in the group of its top-level module.
    for name, s in sl.items():
        (g,) = [g for g in groups if g.name == name.split(".")[0]]
        assert g.start <= s.start and s.stop <= g.end


def test_chunks_resnet20(resnet_layout):
    p = resnet_layout.dim
    groups = group_parameters(resnet_layout, "chunks", num_groups=3)
    assert len(groups) == 3
    assert_partition(groups, p)
    sizes = [g.size for g in groups]
    assert max(sizes) - min(sizes) <= 1
    # Not aligned to layers: some chunk boundary falls inside a tensor.
    offsets = set(resnet_layout.offsets)
    assert any(g.start not in offsets for g in groups[1:])
    for n in (1, 2, 7):
        gs = group_parameters(resnet_layout, "chunks", num_groups=n)
        assert len(gs) == n
        assert_partition(gs, p)
        assert max(g.size for g in gs) - min(g.size for g in gs) <= 1


def test_tensors_and_flat(resnet_layout):
    groups = group_parameters(resnet_layout, "tensors")
    assert [g.name for g in groups] == list(resnet_layout.names)
    assert [g.size for g in groups] == list(resnet_layout.numels)
    assert_partition(groups, resnet_layout.dim)
    (flat,) = group_parameters(resnet_layout, "flat")
    assert (flat.start, flat.end) == (0, resnet_layout.dim)
    assert set(GROUPING_SCHEMES) == {"stages", "chunks", "tensors", "flat"}


def test_grouping_errors(resnet_layout):
    with pytest.raises(ValueError, match=r"mechanism\.grouping.*stages.*chunks"):
        group_parameters(resnet_layout, "layers")
    with pytest.raises(ValueError):
        group_parameters(resnet_layout, "chunks", num_groups=0)
    # A top-level module whose parameters are split by another module's.
    bad = ParamLayout(
        ("a.w", "b.w", "a.v"), (torch.Size([2]), torch.Size([3]), torch.Size([4])), (0, 2, 5)
    )
    with pytest.raises(ValueError, match="not contiguous"):
        group_parameters(bad, "stages")


# ------------------------------------------------------------------------ split_quota
def test_split_quota_sqrt_proportional():
    assert split_quota([100, 400, 900], 60) == [10, 20, 30]
    assert split_quota([100, 400, 900], 6) == [1, 2, 3]
    q = split_quota([100, 400, 900], 61)
    assert sum(q) == 61 and q in ([10, 20, 31], [10, 21, 30], [11, 20, 30])
    assert split_quota([100, 400, 900], 0) == [0, 0, 0]
    for sizes, k in [([432, 13824, 50688, 202752, 650], 1000), ([7, 11, 13, 1000], 25)]:
        q = split_quota(sizes, k)
        assert sum(q) == k
        w = [math.sqrt(s) for s in sizes]
        ideal = [k * x / sum(w) for x in w]
        assert all(abs(a - b) < 1 for a, b in zip(q, ideal, strict=True) if b > 1)


def test_split_quota_min_one_and_caps():
    # Each group gets at least one when k >= #groups, even a tiny one.
    assert split_quota([10, 1_000_000], 2) == [1, 1]
    assert min(split_quota([1, 4, 1_000_000, 1_000_000], 4)) >= 1
    # Caps are respected and the surplus goes to the others (in sqrt proportion).
    q = split_quota([100, 400, 900], 60, cap=[100, 5, 900])
    assert q[1] == 5 and sum(q) == 60 and q == [14, 5, 41]
    q = split_quota([400, 400, 400], 30, cap=[2, 100, 100])
    assert q == [2, 14, 14]
    # Cap by the number of anchors m: min(size, m).
    sizes, m = [432, 13824, 50688, 202752, 650], 50
    q = split_quota(sizes, 200, cap=[min(s, m) for s in sizes])
    assert sum(q) == 200 and all(a <= min(s, m) for a, s in zip(q, sizes, strict=True))
    # Exactly the sum of caps is allowed.
    assert split_quota([3, 4], 7) == [3, 4]
    with pytest.raises(ValueError, match="exceed the sum of the per-group caps"):
        split_quota([3, 4], 8)
    with pytest.raises(ValueError, match="caps"):
        split_quota([100, 100], 11, cap=[5, 5])


# --------------------------------------------------------------------- power method
def test_power_iteration_orthonormal_and_shapes():
    Ga = torch.randn(40, 300, generator=gen(1))
    B = power_iteration(Ga, 10, iters=2, generator=gen(2))
    assert B.shape == (10, 300) and B.dtype == torch.float32
    assert torch.allclose(B @ B.T, torch.eye(10), atol=1e-5)
    # Same generator seed, same basis.
    assert torch.equal(B, power_iteration(Ga, 10, iters=2, generator=gen(2)))
    with pytest.raises(ValueError, match="min"):
        power_iteration(Ga, 41)
    with pytest.raises(ValueError):
        power_iteration(Ga, 0)
    with pytest.raises(ValueError):
        power_iteration(Ga[:, :5], 6)


@pytest.mark.parametrize("gap", [True, False])
def test_power_iteration_recovers_planted_subspace(gap):
    Ga, V = planted(m=60, d=2000, r=8, noise=1e-3, gap=gap)
    B = power_iteration(Ga, 8, iters=8, generator=gen(3))
    assert torch.allclose(B @ B.T, torch.eye(8), atol=1e-5)
    # Limited by the planted noise (the top-8 subspace of Ga itself tilts by ~1e-4 rad).
    overlap = subspace_overlap(V, B)
    assert overlap.min() > 1 - 1e-4
    # Principal angles: singular values of V B^T are their cosines, all ~1.
    cosines = torch.linalg.svdvals(V.double() @ B.double().T)
    assert cosines.min() > 1 - 1e-4


def test_power_iteration_converges_to_svd():
    """Slowly decaying spectrum: more iterations approach the exact top-k right singular space."""
    g = gen(8)
    m, d, k = 50, 800, 6
    U = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))[0]
    Vt = orthonormal_random_basis(d, m, g, dtype=torch.float64)
    s = torch.tensor([10.0, 9.5, 9.0, 8.5, 8.0, 7.5] + [6.0] * (m - k), dtype=torch.float64)
    Ga = (U * s) @ Vt  # sigma_k+1 / sigma_k = 0.8
    exact = Vt[:k]
    errs = []
    for iters in (1, 3, 40):
        B = power_iteration(Ga, k, iters=iters, generator=gen(9))
        assert B.dtype == torch.float64
        sin = (1 - torch.linalg.svdvals(exact @ B.T).min() ** 2).clamp_min(0).sqrt()
        errs.append(float(sin))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 1e-4 < errs[0]


def test_power_iteration_one_step_big_gap():
    # Signal 5-10 vs noise 1e-3 * sqrt(d): one step already aligns (GEP uses t = 1).
    Ga, V = planted(m=60, d=2000, r=8, noise=1e-3)
    B = power_iteration(Ga, 8, iters=1, generator=gen(4))
    assert subspace_overlap(V, B).min() > 0.999
    # With more basis vectors than the planted rank, the planted span is still covered.
    B12 = power_iteration(Ga, 12, iters=1, generator=gen(4))
    assert subspace_overlap(V, B12).min() > 0.999


def test_low_precision_accuracy_cost():
    """bf16 / fp16 matmuls (QR in fp32) cost little projection accuracy on a planted matrix."""
    Ga, V = planted(m=100, d=3000, r=10, noise=1e-2, seed=5)
    Ga = Ga * 1e-3  # gradient-sized entries (exercise the fp16 rescaling)
    errs = {}
    for dt in ("float32", "bfloat16", "float16"):
        B = power_iteration(Ga, 10, iters=1, generator=gen(6), compute_dtype=dt)
        assert B.dtype == torch.float32
        assert orthonormality_error(B) < 1e-5
        errs[dt] = relative_projection_error(Ga, B)
    # Measured (t = 1, GEP's setting): fp32 0.0235, bf16 0.0299, fp16 0.0236.
    assert errs["float32"] < 0.05  # mostly the planted noise
    assert errs["bfloat16"] - errs["float32"] < 0.05
    assert errs["float16"] - errs["float32"] < 0.01
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError):
        resolve_dtype("int8")


# ----------------------------------------------------------------- grouped bases
def _grouped_example(k: int = 12, seed: int = 0, dtype: torch.dtype = torch.float32):
    groups = [Group("a", 0, 50), Group("b", 50, 250), Group("c", 250, 700)]
    Ga = torch.randn(30, 700, generator=gen(seed), dtype=dtype)
    basis = fit_grouped_basis(Ga, groups, k, iters=2, generator=gen(seed + 1), compute_dtype=dtype)
    return basis, groups


def test_fit_grouped_basis_quota_and_orthonormality():
    basis, groups = _grouped_example(k=12)
    assert basis.ks == split_quota([50, 200, 450], 12, cap=[30, 30, 30])
    assert basis.k == 12 and basis.dim == 700
    assert [b.shape for b in basis.bases] == [
        (kj, g.size) for kj, g in zip(basis.ks, groups, strict=True)
    ]
    assert orthonormality_error(basis) < 1e-5
    assert "GroupedBasis" in repr(basis)


def test_projection_identities():
    # float64 end to end so that the identities hold to 1e-10.
    basis, groups = _grouped_example(k=12, dtype=torch.float64)
    assert basis.dtype == torch.float64 and orthonormality_error(basis) < 1e-12
    G = torch.randn(16, 700, generator=gen(9), dtype=torch.float64)
    W = basis.embed(G)
    R = basis.residual(G, W)
    assert W.shape == (16, 12) and R.shape == (16, 700)
    # Block j of W is G_j B_j^T.
    for g, b, sl in zip(basis.groups, basis.bases, basis.block_slices, strict=True):
        assert torch.allclose(W[:, sl], G[:, g.start : g.end] @ b.T)
        # Residual orthogonal to every basis row of its group.
        assert (R[:, g.start : g.end] @ b.T).abs().max() < 1e-10
    # R = G - reconstruct(W); project = reconstruct(embed(.)) is idempotent.
    assert torch.allclose(R, G - basis.reconstruct(W))
    P = basis.project(G)
    assert torch.allclose(basis.project(P), P, atol=1e-12)
    assert torch.allclose(basis.residual(G), R)
    # Pythagoras per row: ||g||^2 = ||w||^2 + ||r||^2.
    assert torch.allclose(G.pow(2).sum(1), W.pow(2).sum(1) + R.pow(2).sum(1))
    # Vectors work like single rows.
    assert torch.allclose(basis.embed(G[3]), W[3])
    assert torch.allclose(basis.reconstruct(W[3]), P[3])
    assert torch.allclose(basis.project(G[3]), P[3])
    assert torch.allclose(basis.residual(G[3]), R[3])
    # Rows in the span have no residual.
    H = basis.reconstruct(torch.randn(5, 12, generator=gen(10), dtype=torch.float64))
    assert basis.residual(H).abs().max() < 1e-12
    assert torch.allclose(basis.embed(H), basis.embed(basis.project(H)))


def test_uncovered_coordinates_and_empty_groups():
    # Coordinates [40, 60) belong to no group: projected to 0, kept in the residual.
    groups = [Group("a", 0, 40), Group("b", 60, 100), Group("c", 100, 120)]
    bases = [orthonormal_random_basis(40, 3, gen(0)), orthonormal_random_basis(40, 2, gen(1))]
    bases.append(torch.zeros(0, 20))  # a group with k_j = 0
    basis = GroupedBasis(groups, bases, 120)
    assert basis.k == 5
    G = torch.randn(4, 120, generator=gen(2))
    P = basis.project(G)
    assert P[:, 40:60].abs().max() == 0 and P[:, 100:].abs().max() == 0
    R = basis.residual(G)
    assert torch.equal(R[:, 40:60], G[:, 40:60]) and torch.equal(R[:, 100:], G[:, 100:])
    with pytest.raises(ValueError, match="overlap"):
        GroupedBasis([Group("a", 0, 40), Group("b", 30, 70)], [bases[0], bases[1]], 120)
    with pytest.raises(ValueError, match="exceeds"):
        GroupedBasis([Group("a", 100, 140)], [bases[0]], 120)
    # k below the number of groups leaves some groups with empty bases.
    Ga = torch.randn(10, 120, generator=gen(3))
    fitted = fit_grouped_basis(Ga, [Group("x", 0, 60), Group("y", 60, 120)], 1)
    assert sorted(fitted.ks) == [0, 1]
    assert fitted.embed(G).shape == (4, 1)


def test_state_dict_roundtrip_and_to():
    basis, _ = _grouped_example(k=9)
    state = basis.state_dict()
    again = GroupedBasis.from_state_dict(state)
    assert again.groups == basis.groups and again.dim == basis.dim and again.ks == basis.ks
    G = torch.randn(3, 700, generator=gen(4))
    assert torch.equal(again.embed(G), basis.embed(G))
    moved = basis.to("cpu")
    assert moved.device.type == "cpu" and torch.equal(moved.project(G), basis.project(G))


def test_grouped_basis_on_resnet20_layout(resnet_layout):
    """Stage grouping on the real 268k-parameter layout (random anchors)."""
    p = resnet_layout.dim
    groups = group_parameters(resnet_layout, "stages")
    Ga = torch.randn(24, p, generator=gen(11))
    basis = fit_grouped_basis(Ga, groups, k=40, generator=gen(12))
    assert basis.ks == split_quota([g.size for g in groups], 40, cap=[24] * 5)
    assert orthonormality_error(basis) < 1e-5
    G = torch.randn(6, p, generator=gen(13))
    W, R = basis.embed(G), basis.residual(G)
    rel = (G.pow(2).sum(1) - W.pow(2).sum(1) - R.pow(2).sum(1)).abs() / G.pow(2).sum(1)
    assert rel.max() < 1e-4
    # The anchors themselves are largely (24 directions per group, k_j <= 24) captured.
    assert captured_energy(Ga, basis) > captured_energy(G, basis)


# ------------------------------------------------------------ other bases, diagnostics
def test_orthonormal_random_basis():
    B = orthonormal_random_basis(500, 20, generator=gen(0))
    assert B.shape == (20, 500)
    assert torch.allclose(B @ B.T, torch.eye(20), atol=1e-5)
    assert not torch.equal(B, orthonormal_random_basis(500, 20, generator=gen(1)))
    with pytest.raises(ValueError):
        orthonormal_random_basis(5, 6)


def test_top_eigvecs_from_gram_matches_direct():
    g = gen(7)
    s = torch.tensor([9.0, 7.0, 5.0, 3.0, 2.0, 1.5, 1.0, 0.5])
    Ga = (torch.randn(8, 8, generator=g) @ torch.diag(s)) @ orthonormal_random_basis(
        60, 8, g, dtype=torch.float64
    ).float()
    Ga = Ga.double()
    V, lam = top_eigvecs_from_gram(Ga, 5, return_eigenvalues=True)
    assert V.shape == (5, 60) and V.dtype == torch.float64
    assert torch.allclose(V @ V.T, torch.eye(5, dtype=torch.float64), atol=1e-10)
    evals, evecs = torch.linalg.eigh(Ga.T @ Ga / Ga.shape[0])
    direct = evecs.flip(1)[:, :5].T
    assert torch.allclose(lam, evals.flip(0)[:5], rtol=1e-8)
    # Equal up to sign, row by row.
    dots = (V * direct).sum(1)
    assert torch.allclose(dots.abs(), torch.ones(5, dtype=torch.float64), atol=1e-8)
    # float32 input -> float32 output; k > m rejected.
    V32 = top_eigvecs_from_gram(Ga.float(), 3)
    assert V32.dtype == torch.float32
    assert torch.allclose(
        (V32.double() * direct[:3]).sum(1).abs(), torch.ones(3, dtype=torch.float64), atol=1e-4
    )
    with pytest.raises(ValueError):
        top_eigvecs_from_gram(Ga, 9)
    # Rank-deficient: directions beyond the rank are still orthonormal.
    Vd = top_eigvecs_from_gram(Ga[:2].repeat(3, 1), 5)
    assert torch.allclose(Vd @ Vd.T, torch.eye(5, dtype=torch.float64), atol=1e-8)


def test_stable_rank():
    assert stable_rank(torch.eye(7)) == pytest.approx(7.0)
    u, v = torch.randn(30, generator=gen(0)), torch.randn(50, generator=gen(1))
    assert stable_rank(torch.outer(u, v)) == pytest.approx(1.0)
    assert stable_rank(torch.outer(u, v).T) == pytest.approx(1.0)
    assert stable_rank(torch.zeros(4, 5)) == 0.0
    assert stable_rank(torch.randn(10, generator=gen(2))) == pytest.approx(1.0)
    M = torch.diag(torch.tensor([2.0, 1.0, 1.0]))
    assert stable_rank(M) == pytest.approx(6.0 / 4.0)


def test_relative_errors():
    B = orthonormal_random_basis(100, 10, generator=gen(0))
    basis = GroupedBasis.single(B)
    inside = torch.randn(10, generator=gen(1)) @ B
    assert relative_projection_error(inside, basis) < 1e-5
    # Orthogonal to the span: error 1.
    x = torch.randn(100, generator=gen(2))
    outside = x - (x @ B.T) @ B
    assert relative_projection_error(outside, B) == pytest.approx(1.0, abs=1e-5)
    G = torch.stack([inside, outside, torch.zeros(100)])
    errs = row_relative_errors(G, basis)
    assert errs[0] < 1e-5 and errs[1] == pytest.approx(1.0, abs=1e-5) and errs[2] == 0.0
    assert relative_projection_error(G, basis) == pytest.approx(float(errs.mean()))
    mean = G.mean(0)
    expect = float((mean - basis.project(mean)).norm() / mean.norm())
    assert relative_error_of_mean(G, basis) == pytest.approx(expect, rel=1e-5)
    assert captured_energy(torch.zeros(2, 100), basis) == 0.0
