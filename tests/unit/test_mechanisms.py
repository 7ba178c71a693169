"""Mechanism math: clipping bounds, noise scales, sensitivities, unbiasedness, sampling.

These tests drive the mechanisms directly with a small model so that every property
is checked against an independent computation (per-example gradients from a loop of
single-example backward passes, sample statistics of the released noise).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpsub.data.aux import AuxData
from dpsub.grads import GradEngine
from dpsub.grads.clip import ClipStats, clip_rows, clipped_sum
from dpsub.mechanisms import StepContext, build_mechanism
from dpsub.privacy import Privatizer, SeededNoise
from dpsub.privacy.sampling import PoissonSampler, ShuffleSampler, seeded_uniform
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg, loop_grads
from helpers.mechanisms import ctx, make_huge, reuse_per_example_grads, setup
from helpers.nets import ConvGN, TinyNet


@pytest.mark.parametrize("backend", ["vmap", "opacus"])
@pytest.mark.parametrize("net", ["linear", "conv_groupnorm"])
def test_engine_matches_loop(backend, net):
    torch.manual_seed(0)
    if net == "linear":
        model, x = TinyNet(), torch.randn(10, 12)
    else:
        model, x = ConvGN(), torch.randn(10, 1, 8, 8)
    y = torch.randint(0, 3, (10,))
    G = torch.cat(
        [c.grads for c in GradEngine(model, microbatch=4, backend=backend).per_example(x, y)]
    )
    torch.testing.assert_close(G, loop_grads(model, x, y), rtol=1e-4, atol=1e-6)


def test_grads_compile_wraps_the_per_example_function_with_dynamic_shapes(monkeypatch):
    """``grads.compile`` reaches the engine from the config and compiles with dynamic shapes
    (Poisson batch sizes vary); the compiled function's rows are clipped as any others."""
    calls = []

    def fake_compile(fn, **kw):
        calls.append(kw)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    run = build_run(compose_cfg(*SYNTH, "mechanism=dpsgd", "grads.compile=true"))
    assert run.engine.compile
    train_step(run)
    assert calls == [{"dynamic": True}]


# --------------------------------------------------------------------- DP-SGD
def test_dpsgd_noise_free_release_is_clipped_mean():
    model, engine, mech, x, y = setup("dpsgd", clip=0.05)
    G = loop_grads(model, x, y)
    factor = (0.05 / G.norm(dim=1)).clamp(max=1.0)
    expected = (G * factor[:, None]).sum(0) / 40.0
    torch.testing.assert_close(mech.step(x, y, ctx()).grad, expected, rtol=1e-4, atol=1e-7)


def test_dpsgd_sensitivity_is_clip_even_for_a_huge_gradient():
    """Neighbouring batches (with / without one example) differ by at most C."""
    C = 0.3
    model, engine, mech, x, y = setup("dpsgd", clip=C)
    x_huge, y = make_huge(model, x, y)  # an example whose raw gradient is enormous
    with_ex = mech.step(x_huge, y, ctx()).grad * 40.0
    without = mech.step(x_huge[1:], y[1:], ctx()).grad * 40.0
    raw = loop_grads(model, x_huge[:1], y[:1]).norm()
    assert raw > 100 * C  # the example really is huge
    assert (with_ex - without).norm() <= C * (1 + 1e-5)
    for i in range(5):  # and every example's contribution is bounded
        keep = torch.ones(40, dtype=torch.bool)
        keep[i] = False
        diff = with_ex - mech.step(x_huge[keep], y[keep], ctx()).grad * 40.0
        assert diff.norm() <= C * (1 + 1e-5)


def test_dpsgd_noise_std_is_z_C_over_expected_batch_and_recorded():
    z, C, B = 1.7, 0.5, 123.0  # B differs from the realized batch size (40)
    model, engine, mech, x, y = setup("dpsgd", clip=C)
    base = mech.step(x, y, ctx(B=B)).grad
    noise, records = [], []
    for s in range(20):
        c = ctx(seed=s, B=B, z=z)
        noise.append(mech.step(x, y, c).grad - base)
        records.append(c.noise.effective_multiplier())
    noise = torch.cat(noise)
    n = noise.numel()
    # std estimate of n Gaussians: relative standard error 1/sqrt(2n)
    assert noise.std().item() == pytest.approx(z * C / B, rel=4 / math.sqrt(2 * n))
    assert abs(noise.mean().item()) < 4 * z * C / B / math.sqrt(n)
    assert records == [pytest.approx(z, rel=1e-12)] * 20  # the records give exactly z


def test_dpsgd_noise_is_fresh_at_every_step():
    """Consecutive steps of one run draw independent noise (a reused draw would correlate)."""
    z, C = 2.0, 1.0
    model, engine, mech, x, y = setup("dpsgd", clip=C)
    base = mech.step(x, y, ctx()).grad
    noise = Privatizer(SeededNoise(torch.Generator().manual_seed(0)))
    draws = []
    for step in range(4):  # one privatizer, as in a run
        c = StepContext(step, 100, 40.0, z, noise, torch.Generator().manual_seed(1))
        draws.append(mech.step(x, y, c).grad - base)
    p = draws[0].numel()
    for a, b in zip(draws, draws[1:], strict=False):
        corr = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
        assert abs(corr) < 5 / math.sqrt(p), corr  # independent: |corr| ~ 1/sqrt(p)


def test_dpsgd_drops_a_non_finite_example_and_counts_it():
    model, engine, mech, x, y = setup("dpsgd", clip=0.5)
    bad = x.clone()
    bad[3] = float("nan")
    out = mech.step(bad, y, ctx())
    keep = torch.ones(40, dtype=torch.bool)
    keep[3] = False
    ref = mech.step(x[keep], y[keep], ctx()).grad
    assert torch.isfinite(out.grad).all()
    torch.testing.assert_close(out.grad, ref, rtol=1e-5, atol=1e-8)
    assert out.stats.clip.nonfinite == 1 and out.stats.clip.n == 40


def test_clipped_sum_of_parts_equals_the_flat_rows():
    """Rows split over per-parameter parts clip exactly as the concatenated rows, including
    a row non-finite in one part only and a finite row whose norm overflows (dropped)."""
    g = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    g[1, :3] = 1e30  # finite entries, norm overflows to inf in float32: dropped (counted)
    g[2, 8] = float("nan")  # non-finite in the last part only
    g[4, 0] = float("inf")  # ... in the first part only
    parts = [g[:, :3], g[:, 3:7].reshape(6, 2, 2), g[:, 7:]]
    flat, flat_stats = clipped_sum(g.clone(), 0.7)
    split, split_stats = clipped_sum([p.contiguous() for p in parts], 0.7)
    assert torch.isfinite(split.value).all() and split.sensitivity == 0.7
    torch.testing.assert_close(split.value, flat.value, rtol=1e-6, atol=1e-7)
    assert split_stats == flat_stats == ClipStats(6, flat_stats.clipped, 3)
    keep = torch.tensor([True, False, False, True, False, True])
    want = clip_rows(g[keep], 0.7)[0].sum(0)
    torch.testing.assert_close(split.value, want, rtol=1e-6, atol=1e-7)


def test_nonprivate_is_exact_mean_and_releases_nothing_through_the_privatizer():
    model, engine, mech, x, y = setup("nonprivate")
    c = ctx()
    torch.testing.assert_close(
        mech.step(x, y, c).grad, loop_grads(model, x, y).mean(0), rtol=1e-4, atol=1e-7
    )
    assert c.noise.records == [] and not mech.private


# ----------------------------------------------------------------- sampling
def test_poisson_sampling_rate_and_variance():
    n, q, T = 1000, 0.05, 2000
    s = PoissonSampler(n, q, seeded_uniform(torch.Generator().manual_seed(0), "cpu"))
    counts = torch.zeros(n)
    sizes = []
    for _ in range(T):
        idx = s.sample()
        counts[idx] += 1
        sizes.append(len(idx))
    sizes = torch.tensor(sizes, dtype=torch.float64)
    assert sizes.mean().item() == pytest.approx(n * q, rel=0.02)
    # Poisson (independent inclusion): Var = n q (1 - q); a fixed-size sampler has 0
    assert sizes.var().item() == pytest.approx(n * q * (1 - q), rel=0.15)
    assert (counts / T).mean().item() == pytest.approx(q, rel=0.02)
    assert (counts / T).std().item() < 0.02  # every example has the same rate


def test_shuffle_sampler_is_fixed_size_permutation():
    s = ShuffleSampler(100, 10, seeded_uniform(torch.Generator().manual_seed(0), "cpu"))
    seen = torch.cat([s.sample() for _ in range(10)])
    assert sorted(seen.tolist()) == list(range(100))


# ---------------------------------------------------------------------- GEP
def gep_pair(**opts):
    base = dict(
        num_bases=8,
        clip_embedding=math.inf,
        clip_residual=math.inf,
        grouping="stages",
        diagnostics_every=0,
    )
    base.update(opts)
    return setup("gep", **base)


def fixed_basis(mech, basis):
    mech.basis = basis
    mech.refit.every, mech.refit.last = 10**9, 0  # never refitted


def test_gep_without_clipping_and_noise_is_the_exact_mean():
    model, engine, mech, x, y = gep_pair()
    out = mech.step(x, y, ctx(B=40.0)).grad
    torch.testing.assert_close(out, loop_grads(model, x, y).mean(0), rtol=1e-4, atol=1e-6)


def test_gep_in_span_residual_vanishes_and_update_is_projection():
    model, engine, mech, x, y = gep_pair(num_bases=16, grouping="flat")
    # anchors = the private examples themselves (with their labels): their gradients span G
    mech.aux = AuxData(
        x=x[:16].clone(), y=y[:16].clone(), num_classes=4, source="test", labels="true"
    )
    G = loop_grads(model, x[:16], y[:16])
    basis = mech.fit_subspace(torch.Generator().manual_seed(0))
    fixed_basis(mech, basis)
    R = basis.residual(G, basis.embed(G))
    assert R.norm() / G.norm() < 1e-4
    # B-GEP (embedding only) then equals GEP: the residual carries nothing
    bg = build_mechanism(
        "bgep", num_bases=16, clip_embedding=math.inf, diagnostics_every=0, grouping="flat"
    )
    bg.setup(engine, mech.aux)
    fixed_basis(bg, basis)
    torch.testing.assert_close(
        bg.step(x[:16], y[:16], ctx(B=16.0)).grad, G.mean(0), rtol=1e-3, atol=1e-5
    )
    torch.testing.assert_close(
        mech.step(x[:16], y[:16], ctx(B=16.0)).grad, basis.project(G.mean(0)), rtol=1e-3, atol=1e-5
    )


def test_gep_noisy_releases_average_to_the_mean_gradient_bgep_does_not():
    z = 0.5
    model, engine, mech, x, y = gep_pair(subspace_every=10**9)
    G = loop_grads(model, x, y)
    target = G.mean(0)
    S = 1.05 * G.norm(dim=1).max().item()  # thresholds above every norm: no clipping
    mech.opts.clip_embedding = mech.opts.clip_residual = S
    reuse_per_example_grads(engine)  # the batch is fixed: only the noise varies
    T = 200  # the averaged noise norm concentrates: 200 releases leave 1/14 of one
    mean = torch.stack([mech.step(x, y, ctx(seed=s, z=z)).grad for s in range(T)]).mean(0)
    s1, s2 = mech.noise_stds(z)
    p, k = target.numel(), mech.opts.num_bases
    expected_err = math.sqrt(k * s1**2 + p * s2**2) / 40.0 / math.sqrt(T)  # averaged noise
    assert (mean - target).norm() < 1.5 * expected_err
    single = (mech.step(x, y, ctx(seed=9999, z=z)).grad - target).norm()
    assert (mean - target).norm() < single / 5  # averaging really removes the noise
    # B-GEP keeps the residual's bias: its average misses the mean by ||P_perp g||
    bg = build_mechanism("bgep", num_bases=8, clip_embedding=S, diagnostics_every=0)
    bg.setup(engine, mech.aux)
    fixed_basis(bg, mech.basis)
    bmean = torch.stack([bg.step(x, y, ctx(seed=s, z=z)).grad for s in range(T)]).mean(0)
    bias = (target - mech.basis.project(target)).norm()
    assert (bmean - target).norm() == pytest.approx(bias.item(), rel=0.2)
    assert bias > 3 * expected_err


def measured_noise(mech, x, y, z, T=150):
    """The released noise of ``T`` steps (release at z minus the noise-free release), B = 1."""
    reuse_per_example_grads(mech.engine)  # one fixed batch: its gradients computed once
    base = mech.step(x, y, ctx(B=1.0)).grad
    return torch.stack([mech.step(x, y, ctx(seed=s + 1, B=1.0, z=z)).grad - base for s in range(T)])


def test_gep_noise_measured_from_the_released_update():
    z, S1, S2 = 1.3, 0.7, 0.2
    model, engine, mech, x, y = gep_pair(clip_embedding=S1, clip_residual=S2)
    mech.step(x, y, ctx())  # fits the basis once
    fixed_basis(mech, mech.basis)
    basis = mech.basis
    noise = measured_noise(mech, x, y, z)
    emb = basis.embed(noise)  # embedding noise lives in the span
    res = basis.residual(noise, emb)
    assert emb.std().item() == pytest.approx(z * math.sqrt(2) * S1, rel=0.08)
    # the residual noise is isotropic N(0, s2^2 I_p) projected off the k-dim span
    p, k = basis.dim, basis.k
    s2 = z * math.sqrt(2) * S2
    assert res.pow(2).sum(1).mean().item() == pytest.approx(s2**2 * (p - k), rel=0.05)
    c = ctx(z=z)
    mech.step(x, y, c)  # two records that together give exactly z
    assert [r.name for r in c.noise.records] == ["embedding", "residual"]
    assert c.noise.effective_multiplier() == pytest.approx(z, rel=1e-12)


def test_bgep_noise_measured_from_the_released_update():
    """B-GEP adds N(0, (z S1)^2) to the embedding and nothing outside the span."""
    z, S1 = 1.3, 0.7
    model, engine, mech, x, y = setup(
        "bgep", num_bases=8, clip_embedding=S1, diagnostics_every=0, subspace_every=10**9
    )
    mech.step(x, y, ctx())
    basis = mech.basis
    noise = measured_noise(mech, x, y, z)
    emb = basis.embed(noise)
    assert emb.std().item() == pytest.approx(z * S1, rel=0.08)
    assert emb.mean().abs().item() < 4 * z * S1 / math.sqrt(emb.numel())
    assert basis.residual(noise, emb).norm() < 1e-4 * noise.norm()  # all noise in the span
    c = ctx(z=z)
    mech.step(x, y, c)
    assert c.noise.effective_multiplier() == pytest.approx(z, rel=1e-12)


def test_gep_normalized_release_has_sensitivity_sqrt2():
    """Per example, ||[w/S1, r/S2]|| <= sqrt(2): the basis of the two records giving z."""
    S1, S2 = 0.05, 0.02
    model, engine, mech, x, y = gep_pair(clip_embedding=S1, clip_residual=S2)
    x, y = make_huge(model, x, y)
    mech.step(x, y, ctx())
    basis = mech.basis
    from dpsub.grads import clip_rows

    G = loop_grads(model, x, y)
    W = basis.embed(G)
    R = basis.residual(G, W)
    Wc, _ = clip_rows(W, S1)
    Rc, _ = clip_rows(R, S2)
    joint = torch.sqrt(Wc.pow(2).sum(1) / S1**2 + Rc.pow(2).sum(1) / S2**2)
    assert joint.max() <= math.sqrt(2) * (1 + 1e-5)
    assert joint.max() > 1.4  # the bound is attained by clipped examples
    # the mechanism's own sums agree: removing the huge example changes each release by <= S_j
    fixed_basis(mech, basis)
    both = mech.step(x, y, ctx(B=1.0)).grad
    rest = mech.step(x[1:], y[1:], ctx(B=1.0)).grad
    assert (both - rest).norm() <= (S1 + S2) * (1 + 1e-4)


def test_gep_requires_aux_and_checks_k():
    with pytest.raises(ValueError, match="aux"):
        m = build_mechanism("gep")
        m.setup(GradEngine(TinyNet()), None)
    with pytest.raises(ValueError, match="num_bases"):
        setup("gep", num_bases=10_000, aux_m=64)


def test_models_with_batchnorm_are_refused_for_private_training():
    from dpsub.grads import check_private_model
    from dpsub.models import MODELS, build_model

    bn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
    with pytest.raises(ValueError, match="BatchNorm"):
        check_private_model(bn)
    for name in set(MODELS) - {"custom"}:  # every shipped model passes
        check_private_model(
            build_model(
                name, (3, 32, 32), 10, **({"depth": 10, "width": 1} if name == "wrn" else {})
            )
        )


# ------------------------------------------------------------- micro-batch
def test_auto_microbatch_fits_a_quarter_of_free_memory():
    """3 x 4 bytes per parameter per example within free / 4; a power of two, or the batch."""
    from dpsub.grads import auto_microbatch

    cpu = torch.device("cpu")
    p = 1_000_000
    assert auto_microbatch(p, 256, cpu, free=4 * 12 * p * 100) == 64  # 100 fit: 64
    assert auto_microbatch(p, 256, cpu, free=4 * 12 * p * 1000) == 256  # all fit: the batch
    # a CPU's caches: at most 256 a pass however much memory is free (a GPU: the batch)
    assert auto_microbatch(p, 1000, cpu, free=4 * 12 * p * 10**4) == 256
    assert auto_microbatch(p, 1000, torch.device("cuda"), free=4 * 12 * p * 10**4) == 1000
    assert auto_microbatch(p, 256, cpu, free=10) == 1  # nothing fits: one at a time
    assert 1 <= auto_microbatch(p, 256, cpu) <= 256  # the machine's own free memory


def test_grads_microbatch_auto_reaches_the_engine():
    run = build_run(compose_cfg(*SYNTH, "mechanism=dpsgd", "grads.microbatch=auto"))
    assert 1 <= run.engine.microbatch <= run.cfg.train.batch_size


def test_gep_names_what_limits_num_bases():
    """k above what the anchors span: the message says how many directions there are and
    whether more anchors would help (TinyNet has 276 parameters)."""
    with pytest.raises(ValueError, match=r"num_bases=65 exceeds the 64 directions .* raise aux"):
        gep_pair(num_bases=65, grouping="flat")
    with pytest.raises(ValueError, match=r"exceeds the 276 directions .*; lower num_bases$"):
        setup("gep", aux_m=300, num_bases=280, grouping="flat")
