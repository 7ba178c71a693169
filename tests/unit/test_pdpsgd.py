"""PDP-SGD and RPDP-SGD: the subspace, the projection, and what the run is charged.

The basis is checked against a dense eigendecomposition of (1/m) sum g g^T built from
per-example gradients of an independent loop; the projection against sample statistics
of the released noise; the cost against DP-SGD's ledger for the same run.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from dpsub.data.aux import AuxData
from dpsub.errors import ConfigError
from dpsub.grads import GradEngine
from dpsub.mechanisms import StepContext, build_mechanism
from dpsub.privacy import Privatizer, SeededNoise
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg, loop_grads

M, K = 30, 5  # public examples, subspace dimension


class ModeScale(nn.Module):
    """Doubles its input in train mode only (like dropout's rescaling, but deterministic)."""

    def forward(self, x):
        return 2.0 * x if self.training else x


class ModeNet(nn.Module):
    """A small MLP whose gradients differ between train and eval mode."""

    def __init__(self, d=12, h=16, c=4):
        super().__init__()
        self.body = nn.Linear(d, h)
        self.mode = ModeScale()
        self.head = nn.Linear(h, c)

    def forward(self, x):
        return self.head(self.mode(torch.relu(self.body(x.flatten(1)))))


def setup(name, n=40, **opts):
    torch.manual_seed(0)
    model = ModeNet()
    x, y = torch.randn(n, 12), torch.randint(0, 4, (n,))
    aux = AuxData(torch.randn(M, 12), torch.randint(0, 4, (M,)), 4, "test", labels="true")
    mech = build_mechanism(name, num_bases=K, **opts)
    mech.setup(GradEngine(model, microbatch=16), aux)
    return model, mech, aux, x, y


def ctx(seed=0, z=0.0, step=0, B=40.0, diagnostics=False):
    noise = Privatizer(SeededNoise(torch.Generator().manual_seed(seed)))
    rng = torch.Generator().manual_seed(10_000 + seed)
    return StepContext(step, 100, B, z, noise, rng, diagnostics)


def dense_top_projector(model, aux, k):
    """V^T V for the top-k eigenvectors of (1/m) sum g g^T, formed densely (p x p)."""
    model.eval()
    G = loop_grads(model, aux.x, aux.y).double()
    model.train()
    evals, evecs = torch.linalg.eigh(G.T @ G / G.shape[0])
    assert evals[-k] > 1.05 * evals[-k - 1]  # a gap: the top-k eigenspace is well defined
    V = evecs[:, -k:]
    return V @ V.T


def projector(basis):
    b = basis.double()
    return b.T @ b


# ------------------------------------------------------------------- the subspace
def test_basis_is_the_top_k_eigenspace_of_the_public_second_moment():
    model, mech, aux, x, y = setup("pdpsgd")
    basis, metrics = mech.fit_basis(ctx())
    assert model.training  # eval mode only while the public gradients are taken
    assert basis.shape == (K, mech.engine.dim)
    torch.testing.assert_close(basis @ basis.T, torch.eye(K), atol=1e-5, rtol=0)
    P = dense_top_projector(model, aux, K)
    assert (projector(basis) - P).abs().max() < 1e-5
    assert 0 < metrics["public_energy_topk"] <= 1


def test_power_iteration_option_approximates_the_exact_basis():
    model, mech, aux, x, y = setup("pdpsgd", eigensolver="power", power_iters=60)
    basis, metrics = mech.fit_basis(ctx())
    P = dense_top_projector(model, aux, K)
    assert torch.linalg.matrix_norm(projector(basis) - P, ord=2) < 0.05
    _, exact = setup("pdpsgd")[1].fit_basis(ctx())
    assert metrics["public_energy_topk"] == pytest.approx(exact["public_energy_topk"], rel=1e-3)


def test_rpdpsgd_basis_is_orthonormal_public_and_redrawn_every_s_steps():
    model, mech, aux, x, y = setup("rpdpsgd", subspace_every=3)
    c = ctx(z=1.0)
    bases = []
    for step in range(7):
        c.step = step
        mech.step(x, y, c)
        bases.append(mech.basis.clone())
    torch.testing.assert_close(bases[0] @ bases[0].T, torch.eye(K), atol=1e-5, rtol=0)
    assert torch.equal(bases[0], bases[2]) and torch.equal(bases[3], bases[5])
    assert not torch.equal(bases[2], bases[3]) and not torch.equal(bases[5], bases[6])
    # from the public generator: the same rng state gives the same basis
    again, _ = setup("rpdpsgd")[1].fit_basis(ctx())
    first, _ = setup("rpdpsgd")[1].fit_basis(ctx())
    assert torch.equal(again, first)


# ----------------------------------------------------------------- the projection
@pytest.mark.parametrize("name", ["pdpsgd", "rpdpsgd"])
def test_projection_is_idempotent_and_removes_exactly_the_noise_outside(name):
    z, C, B = 2.0, 0.5, 40.0
    model, mech, aux, x, y = setup(name, clip=C, subspace_every=1000)
    base = mech.step(x, y, ctx(B=B)).grad  # noise-free release, fixes the basis
    basis = mech.basis
    clipped = mech.engine.clipped_sum(x, y, C).sum.value
    torch.testing.assert_close(base, basis.T @ (basis @ clipped) / B, rtol=1e-5, atol=1e-8)
    noise, kept = [], []
    for s in range(1, 201):
        c = ctx(seed=s, z=z, step=s, B=B)
        out = mech.step(x, y, c)
        assert c.noise.effective_multiplier() == pytest.approx(z, rel=1e-12)
        noise.append((out.grad - base) * B)
        kept.append(out.metrics["kept_norm_fraction"])
    noise = torch.stack(noise).double()
    P = projector(basis)
    # idempotent, and nothing is left outside the subspace
    torch.testing.assert_close(noise @ P, noise, rtol=0, atol=1e-4 * z * C)
    inside = noise @ basis.double().T  # (200, k): the noise in the subspace's coordinates
    n = inside.numel()
    assert inside.std().item() == pytest.approx(z * C, rel=4 / math.sqrt(2 * n))
    assert (noise.pow(2).sum(1).mean() / (K * (z * C) ** 2)).item() == pytest.approx(1, abs=0.1)
    assert all(0 < f < 1 for f in kept)


def test_before_start_step_the_update_is_plain_dpsgd():
    model, mech, aux, x, y = setup("pdpsgd", start_step=3)
    dpsgd = build_mechanism("dpsgd")
    dpsgd.setup(mech.engine)
    for step in range(5):
        c1, c2 = ctx(seed=step, z=1.0, step=step), ctx(seed=step, z=1.0, step=step)
        out, ref = mech.step(x, y, c1), dpsgd.step(x, y, c2)
        assert out.metrics["projected"] == float(step >= 3)
        assert torch.equal(out.grad, ref.grad) == (step < 3)
        assert (mech.basis is None) == (step < 3)  # no public gradients before the start


def test_private_diagnostics_only_when_asked():
    model, mech, aux, x, y = setup("pdpsgd", diagnostics_every=1)
    assert mech.step(x, y, ctx(z=1.0)).private_metrics == {}
    private = mech.step(x, y, ctx(z=1.0, diagnostics=True)).private_metrics
    assert set(private) == {"residual_mean_grad", "residual_clipped_sum"}
    assert all(0 <= v <= 1 for v in private.values())


def test_basis_survives_a_checkpoint():
    model, mech, aux, x, y = setup("pdpsgd", subspace_every=10)
    mech.step(x, y, ctx(z=1.0))
    fresh = setup("pdpsgd", subspace_every=10)[1]
    fresh.load_state_dict(mech.state_dict())
    assert torch.equal(fresh.basis, mech.basis) and fresh.refit.last == 0


def test_k_larger_than_the_public_set_is_refused():
    mech = build_mechanism("pdpsgd", num_bases=M + 1)
    with pytest.raises(ValueError, match="num_bases"):
        mech.setup(GradEngine(ModeNet()), AuxData(torch.randn(M, 12), None, 4, "test"))
    with pytest.raises(ConfigError, match="num_bases"):
        build_run(compose_cfg(*SYNTH, "mechanism=pdpsgd", "aux.num_samples=20"))


# ------------------------------------------------------------------- the run
def test_public_examples_are_neither_in_the_private_set_nor_in_N():
    run = build_run(compose_cfg(*SYNTH, "mechanism=pdpsgd", "aux.num_samples=50"))
    assert run.aux.source == "public_train"  # the mechanism's default public set
    m = len(run.aux.x)  # the hash pick: about 50
    assert 30 < m < 70 and len(run.data.train_y) == 400 - m
    assert run.q == pytest.approx(64 / (400 - m))  # q = B / (N - m)
    priv = {tuple(r.tolist()) for r in run.data.train_x.flatten(1)}
    assert not any(tuple(r.tolist()) in priv for r in run.aux.x.flatten(1))


def test_epsilon_equals_dpsgds_for_the_same_run():
    common = (*SYNTH, "aux=public_train", "aux.num_samples=50", "train.max_steps=3")
    runs = {
        m: build_run(compose_cfg(*common, f"mechanism={m}", *extra))
        for m, extra in [
            ("dpsgd", ()),
            ("pdpsgd", ("mechanism.num_bases=8",)),
            ("rpdpsgd", ("mechanism.num_bases=8",)),
        ]
    }
    for run in runs.values():
        for _ in range(3):
            out = train_step(run)
            assert out.z_charged == run.z
    ref = runs["dpsgd"]
    for name in ("pdpsgd", "rpdpsgd"):
        run = runs[name]
        assert run.ledger.history == ref.ledger.history == [(ref.z, ref.q, 3)]
        assert run.ledger.epsilon() == ref.ledger.epsilon()


def test_the_public_part_moves_no_other_example_when_one_private_example_is_removed():
    """The public examples set PDP-SGD's basis without noise: which ones are public must not
    depend on the other examples (a class-balanced pick used every private label: with one
    example removed, 28 of 50 public examples stayed, a membership test on the model)."""
    from dpsub.data.aux import build_aux
    from dpsub.data.datasets import DatasetBundle

    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(1001, 1, 2, 2, generator=g), torch.randint(0, 3, (1001,), generator=g)

    def public(n, pick):
        e = torch.zeros(0, 1, 2, 2)
        data = DatasetBundle("toy", x[:n], y[:n], e, y[:0], 3, None, (0.0,), (1.0,))
        aux, _ = build_aux({"name": "public_train", "num_samples": 50, "pick": pick}, data, "", 0)
        return {tuple(r.flatten().tolist()) for r in aux.x}

    small, large = public(1000, "hash"), public(1001, "hash")
    assert small <= large and large - small <= {tuple(x[1000].flatten().tolist())}
    assert public(1000, "balanced") != public(1001, "balanced")  # (the old pick moves many)


def test_a_balanced_public_part_marks_the_run_not_covered(tmp_path):
    from dpsub.training.loop import train

    cfg = compose_cfg(*SYNTH, "mechanism=pdpsgd", "aux.num_samples=50", "aux.pick=balanced",
                      "train.max_steps=1", "mechanism.num_bases=4")  # fmt: skip
    train(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["covered_by_epsilon"] is False
    assert "public_part_chosen_with_private_labels" in str(summary)
