"""GEP's audit canary uses the whole sensitivity, and the audit's statistic on GEP's two
releases (each divided by its noise std) moves by 1/z in units of its std."""

from __future__ import annotations

import math

import pytest
import torch

from dpsub.audit.canary import CanaryEngine, split_canary
from dpsub.audit.release import CapturingPrivatizer, ScriptedNoise
from dpsub.mechanisms import StepContext
from dpsub.privacy import SeededNoise
from dpsub.subspace import GroupedBasis
from dpsub.subspace.grouping import Group

from helpers.mechanisms import setup

S1, S2 = 0.7, 0.2


def orthonormal_rows(k: int, n: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)))
    return q.T.contiguous()


def test_split_canary_parts_have_norms_s1_and_s2():
    # two groups and coordinates in no group (those belong to the residual)
    groups = [Group("a", 0, 30), Group("b", 40, 100)]
    basis = GroupedBasis(groups, [orthonormal_rows(3, 30, 0), orthonormal_rows(5, 60, 1)], 110)
    c = split_canary(basis, S1, S2, torch.Generator().manual_seed(2))
    assert basis.embed(c).norm().item() == pytest.approx(S1, rel=1e-6)
    assert basis.residual(c).norm().item() == pytest.approx(S2, rel=1e-6)
    assert c.norm().item() == pytest.approx(math.hypot(S1, S2), rel=1e-6)


class CachedGrads:
    """The engine's per-example gradients of one batch, computed once and replayed (the
    draws below differ only in their noise, so GEP's step is all that has to run again)."""

    def __init__(self, engine, x, y):
        self.engine, self.chunks = engine, list(engine.per_example(x, y))

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def per_example(self, x, y, target=None):
        yield from self.chunks


def test_gep_release_statistic_moves_by_one_over_z():
    """GEP's real step at z = 1 with and without the split canary: the audit's statistic
    (releases / their noise std, projected on the canary's noise-free shift) has a shift of
    exactly 1/z without noise and of 1/z standard deviations over many noisy draws."""
    z, draws = 1.0, 300
    _, engine, mech, x, y = setup(
        "gep", n=16, num_bases=8, clip_embedding=S1, clip_residual=S2, diagnostics_every=0,
        subspace_every=10**9, residual="materialize",
    )  # fmt: skip
    canary = CanaryEngine(CachedGrads(engine, x, y), lambda dim: c)
    canary.private_x = x

    def release(with_canary: bool, source) -> torch.Tensor:
        canary.on = with_canary
        priv = CapturingPrivatizer(source)
        mech.step(x, y, StepContext(0, 100, 16.0, z, priv, torch.Generator().manual_seed(0)))
        return priv.whitened().double()

    release(False, ScriptedNoise())  # fits the anchor subspace once (then kept)
    mech.engine = canary
    c = split_canary(mech.basis, S1, S2, torch.Generator().manual_seed(0))
    shift = release(True, ScriptedNoise()) - release(False, ScriptedNoise())
    assert shift.norm().item() == pytest.approx(1 / z, rel=1e-5)
    u = shift / shift.norm()

    def scores(with_canary: bool, offset: int) -> torch.Tensor:
        gens = (torch.Generator().manual_seed(offset + s) for s in range(draws))
        return torch.stack([release(with_canary, SeededNoise(g)) @ u for g in gens])

    s_in, s_out = scores(True, 0), scores(False, draws)
    std = torch.cat([s_in - s_in.mean(), s_out - s_out.mean()]).std().item()
    assert std == pytest.approx(1.0, abs=0.08)  # whitened noise: unit std
    # (an embedding-only canary, or the update instead of the releases: 0.71-0.73)
    assert (s_in.mean() - s_out.mean()).item() / std == pytest.approx(1 / z, abs=0.15)
