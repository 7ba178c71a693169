"""RGP, RGP-random and DP-PowerSGD: reparametrization, carrier gradients, privacy, state.

References are independent: per-example weight gradients from a loop of single-example
backward passes through the *original* model, projections computed from them directly.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpsub.errors import ConfigError
from dpsub.grads import GradEngine
from dpsub.mechanisms import StepContext, build_mechanism
from dpsub.models import build_model
from dpsub.privacy import Privatizer, SeededNoise
from dpsub.subspace.lowrank import power_carriers
from dpsub.subspace.reparam import LowRankReparam
from dpsub.training.build import build_run, load_run_state, run_state, train_step

from conftest import SYNTH, compose_cfg
from helpers.rgp import INF, check_ghost_carriers, rand_carriers


class ConvNet(nn.Module):
    """Strided / padded convs with and without bias, a GroupNorm affine and a linear head."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.c1 = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, width)
        self.c2 = nn.Conv2d(width, 6, (3, 2), padding=(1, 0), bias=False)
        self.fc = nn.Linear(6 * 4 * 3, 5)

    def forward(self, x):
        x = torch.relu(self.gn(self.c1(x)))
        return self.fc(torch.relu(self.c2(x)).flatten(1))


def data(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def loop_weight_grads(model, x, y):
    """{name: (n, *shape)} per-example gradients of every parameter, one backward each."""
    rows = {n: [] for n, _ in model.named_parameters()}
    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for n, p in model.named_parameters():
            rows[n].append(p.grad.detach().clone())
    model.zero_grad()
    return {n: torch.stack(r) for n, r in rows.items()}


def ctx(z=0.0, B=6.0, step=0, seed=0, noise=None):
    noise = noise or Privatizer(SeededNoise(torch.Generator().manual_seed(seed)))
    return StepContext(step, 100, B, z, noise, torch.Generator().manual_seed(1000 + seed))


def mechanism(name, model, microbatch=4, backend="vmap", **opts):
    mech = build_mechanism(name, **opts)
    mech.setup(GradEngine(model, microbatch=microbatch, backend=backend))
    return mech


# ----------------------------------------------------------- reparametrization
@pytest.mark.parametrize("model", ["convnet", "wrn", "resnet20"])
def test_reparametrized_network_computes_the_original_output(model):
    torch.manual_seed(0)
    if model == "convnet":
        net, x = ConvNet(), data()[0]
    else:
        kw = {"depth": 10, "width": 1} if model == "wrn" else {}
        net, x = build_model(model, (3, 32, 32), 10, **kw), torch.randn(3, 3, 32, 32)
    reparam = LowRankReparam(net)
    target = reparam.target(rand_carriers(reparam, 3))
    assert set(target.params) >= {"c1.left", "c1.right", "fc.left"} or model != "convnet"
    assert not any(n.endswith(".weight") and p.dim() > 1 for n, p in target.params.items())
    torch.testing.assert_close(target.forward(target.params, x), net(x), atol=1e-5, rtol=1e-5)


def test_carrier_gradients_are_dW_RT_and_LT_dW_per_example():
    """Theorem 2.1 (eq. 2) for conv (3x3, 3x2, strided, padded) and linear weights."""
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    reparam = LowRankReparam(net)
    carriers = rand_carriers(reparam, 3)
    target = reparam.target(carriers)
    engine = GradEngine(net, microbatch=4)
    G = torch.cat([c.grads for c in engine.per_example(x, y, target)])
    got = target.layout.unflatten(G)
    ref = loop_weight_grads(net, x, y)
    for name, (L, R) in carriers.items():
        dW = ref[name].reshape(x.shape[0], L.shape[0], -1)
        left, right = reparam.carrier_names(name)
        torch.testing.assert_close(got[left].reshape(dW.shape[0], *L.shape), dW @ R.T)
        torch.testing.assert_close(got[right].reshape(dW.shape[0], *R.shape), L.T @ dW)
    for name in ("c1.bias", "gn.weight", "gn.bias", "fc.bias"):  # non-matrix: their own gradient
        torch.testing.assert_close(got[name], ref[name])


def projection(dW, L, R, left_only=False):
    """Orthogonal projection of dW onto {L A + B R}: eq. (10); (dW) R^T R for a frozen R."""
    if left_only:
        return dW @ R.T @ R
    return L @ L.T @ dW + dW @ R.T @ R - L @ L.T @ dW @ R.T @ R


@pytest.mark.parametrize("update", ["full", "left"])
def test_reconstruction_is_the_projection_of_the_weight_gradient(update):
    """Corollary 2.1.1: no clipping, no noise -> the mean of the projected gradients."""
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    mech = mechanism("rgp_random", net, rank=2, clip=INF, update=update)
    res = mech.step(x, y, ctx(B=10.0))  # divided by the expected batch size, not by 6
    ref = {n: g.sum(0) / 10 for n, g in loop_weight_grads(net, x, y).items()}
    got = mech.engine.layout.unflatten(res.grad)
    for name, (L, R) in mech.carriers.items():
        dW = ref[name].reshape(L.shape[0], -1)
        want = projection(dW, L, R, update == "left")
        torch.testing.assert_close(got[name].reshape(want.shape), want, atol=1e-6, rtol=1e-5)
        assert (got[name] - ref[name]).norm() > 1e-3  # rank 2: a real projection
    torch.testing.assert_close(got["fc.bias"], ref["fc.bias"])
    assert res.metrics["noise_std"] == 0.0


@pytest.mark.parametrize("name", ["rgp", "rgp_random"])
def test_full_rank_without_clipping_and_noise_is_plain_sgd(name):
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    mech = mechanism(name, net, rank=1000, clip=INF)
    res = mech.step(x, y, ctx(B=float(x.shape[0])))
    mean, _ = mech.engine.mean_gradient(x, y)
    torch.testing.assert_close(res.grad, mean, atol=1e-6, rtol=1e-5)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    before = [p.detach().clone() for p in net.parameters()]
    mech.engine.set_grad(res.grad)
    opt.step()
    grads = mech.engine.layout.unflatten(mean).values()
    for p, p0, g in zip(net.parameters(), before, grads, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.5 * g, atol=1e-6, rtol=1e-5)


def test_projection_residual_is_a_private_diagnostic_of_what_the_carriers_miss():
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    mech = mechanism("rgp_random", net, rank=2, diagnostics_every=1)
    assert mech.step(x, y, ctx()).private_metrics == {}  # only when diagnostics are wanted
    c = ctx(step=1)
    c.diagnostics = True
    got = mech.step(x, y, c).private_metrics["projection_residual"]
    mean = {n: g.mean(0) for n, g in loop_weight_grads(net, x, y).items()}
    missed = total = 0.0
    for n, (L, R) in mech.carriers.items():
        G = mean[n].reshape(L.shape[0], -1)
        missed += float((G - projection(G, L, R)).pow(2).sum())
        total += float(G.pow(2).sum())
    assert got == pytest.approx((missed / total) ** 0.5, rel=1e-4)
    full = mechanism("rgp_random", net, rank=1000, diagnostics_every=1)
    assert full.step(x, y, c).private_metrics["projection_residual"] < 1e-5


@pytest.mark.parametrize("update", ["full", "left"])
def test_ghost_clipping_of_the_carriers_equals_vmap(update):
    """grads.backend=ghost clips the carriers as plain layers (no vmap): the same clipped sum,
    norms and counts, for refitted carriers too, with a huge and a non-finite example (a WRN:
    tests/e2e/test_e2e_rgp.py)."""
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data(n=7)
    check_ghost_carriers(net, x, y, update)


def test_power_carriers_span_a_low_rank_update_and_are_orthonormal():
    g = torch.Generator().manual_seed(0)
    delta = torch.randn(30, 3, generator=g) @ torch.randn(3, 50, generator=g)
    L, R = power_carriers(delta, 3, iters=1, generator=g)
    torch.testing.assert_close(L.T @ L, torch.eye(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(R @ R.T, torch.eye(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(L @ L.T @ delta @ R.T @ R, delta, atol=1e-4, rtol=1e-4)
    L0, R0 = power_carriers(torch.zeros(4, 9), 16)  # rank capped; Delta = 0 still orthonormal
    assert L0.shape == (4, 4) and R0.shape == (4, 9)
    torch.testing.assert_close(R0 @ R0.T, torch.eye(4), atol=1e-5, rtol=0)


def rank2_like(W, g):
    return torch.randn(W.shape[0], 2, generator=g) @ torch.randn(2, W.shape[1], generator=g)


def captured(L, R, M):
    """How well the carriers reproduce M: ||M - projection|| / ||M||."""
    return float((M - projection(M, L, R)).norm() / M.norm())


def test_rgp_carriers_come_from_the_weights_during_warmup_then_the_historical_update():
    """Algorithm 1, line 5: Delta = W_t while t < warmup_steps, W_t - W_0 after."""
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    g = torch.Generator().manual_seed(0)
    params = dict(net.named_parameters())
    with torch.no_grad():  # rank-2 weights W_0: the warm-up carriers (rank 2) span them exactly
        for n in ("c1.weight", "c2.weight", "fc.weight"):
            p = params[n]
            p.copy_(rank2_like(p.reshape(p.shape[0], -1), g).view_as(p))
    mech = mechanism("rgp", net, rank=2, warmup_steps=1)
    mech.step(x, y, ctx(step=0))
    W0 = mech.reparam.matrices()
    assert all(captured(*mech.carriers[n], W0[n]) < 1e-4 for n in W0)
    W0 = {n: W.clone() for n, W in W0.items()}
    with torch.no_grad():  # a rank-2 historical update D: W_1 = W_0 + D has rank 4
        D = {n: rank2_like(W, g) for n, W in W0.items()}
        for n in D:
            params[n].add_(D[n].view_as(params[n]))
    mech.step(x, y, ctx(step=1))
    for n, W in mech.reparam.matrices().items():
        assert captured(*mech.carriers[n], D[n]) < 1e-4, n
        assert captured(*mech.carriers[n], W) > 0.05, n  # not the weights themselves


def test_rgp_random_carriers_are_public_randomness_from_ctx_rng():
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    a, b = mechanism("rgp_random", net, rank=2), mechanism("rgp_random", net, rank=2)
    a.step(x, y, ctx(seed=1))
    b.step(x, y, ctx(seed=1))
    for n in a.carriers:
        torch.testing.assert_close(a.carriers[n][0], b.carriers[n][0])
    b.step(x, y, ctx(seed=2, step=1))  # a fresh draw at the next step
    assert not torch.allclose(a.carriers["fc.weight"][1], b.carriers["fc.weight"][1])


# -------------------------------------------------------------------- privacy
class SpyPrivatizer(Privatizer):
    """Keeps every Sensitive it is handed."""

    def gaussian(self, s, std, name="release"):
        self.seen = [*getattr(self, "seen", []), s]
        return super().gaussian(s, std, name)


@pytest.mark.parametrize("backend", ["vmap", "ghost"])
@pytest.mark.parametrize("name", ["rgp", "rgp_random"])
def test_one_example_moves_the_released_carrier_sum_by_at_most_C(name, backend):
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data(n=8)
    x[0] *= 1e3  # a huge gradient
    values = []
    for rows in (slice(0, 8), slice(1, 8)):
        spy = SpyPrivatizer(SeededNoise(torch.Generator().manual_seed(0)))
        mech = mechanism(name, net, rank=2, clip=0.5, backend=backend)
        mech.step(x[rows], y[rows], ctx(z=1.0, noise=spy))
        assert len(spy.seen) == 1 and spy.seen[0].sensitivity == 0.5
        assert spy.records[0].std == pytest.approx(0.5)  # z C on every carrier coordinate
        values.append(spy.seen[0].value)
    assert values[0].shape == values[1].shape  # the concatenation of all carriers
    assert (values[0] - values[1]).norm() <= 0.5 * (1 + 1e-5)
    assert (values[0] - values[1]).norm() >= 0.49  # the huge example is clipped to C, not dropped


@pytest.mark.parametrize("mech", ["rgp", "rgp_random", "dppowersgd", "rgp grads.backend=ghost"])
def test_records_give_exactly_the_planned_multiplier(mech):
    mech, *more = mech.split()
    run = build_run(
        compose_cfg(*SYNTH, f"mechanism={mech}", "mechanism.rank=2", "train.max_steps=3", *more)
    )
    for _ in range(3):
        out = train_step(run)
        assert out.z_records == pytest.approx(run.z, rel=1e-12)
        rec = run.privatizer.records
        assert [(r.sensitivity, r.std) for r in rec] == [(1.0, pytest.approx(run.z))]
    assert run.ledger.history == [(run.z, run.q, 3)]


# ---------------------------------------------------------------- DP-PowerSGD
def test_dppowersgd_at_full_rank_is_dpsgd():
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    dpsgd = mechanism("dpsgd", net, clip=0.7)
    power = mechanism("dppowersgd", net, clip=0.7, rank=1000, error_feedback=True)
    for step in range(2):
        a = dpsgd.step(x, y, ctx(z=1.3, seed=step, step=step))
        b = power.step(x, y, ctx(z=1.3, seed=step, step=step))
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4)


def test_dppowersgd_is_rank_r_keeps_Q_and_feeds_back_the_error():
    """Rank r per weight, error feedback M + e = approximation + e', Q warm-started."""
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data()
    power = mechanism("dppowersgd", net, rank=2, error_feedback=True)
    dpsgd = mechanism("dpsgd", net)
    layout = power.engine.layout
    Q, error = {}, {n: 0.0 for n in layout.matrix_names()}
    for step in range(2):
        res = power.step(x, y, ctx(z=1.0, seed=step, step=step))
        noisy = dpsgd.step(x, y, ctx(z=1.0, seed=step, step=step)).grad  # the same release
        for name in layout.matrix_names():
            M = layout.matrix_view(noisy, name) + error[name]
            out = layout.matrix_view(res.grad, name)
            assert torch.linalg.matrix_rank(out) <= 2
            torch.testing.assert_close(out + power.error[name], M)
            if step == 1:  # P = orth(M Q_prev), out = P P^T M: the warm start was used
                P = torch.linalg.qr(M @ Q[name])[0]
                torch.testing.assert_close(out, P @ P.T @ M, atol=1e-5, rtol=1e-4)
        Q = {n: q.clone() for n, q in power.Q.items()}
        error = {n: e.clone() for n, e in power.error.items()}
        bias = layout.unflatten(res.grad)["fc.bias"]
        torch.testing.assert_close(bias, layout.unflatten(noisy)["fc.bias"])


# ------------------------------------------------------------------- state
@pytest.mark.parametrize(
    "mech,opts",
    [
        ("rgp", ("mechanism.warmup_steps=1", "mechanism.carriers_every=3")),
        ("rgp_random", ("mechanism.carriers_every=3",)),
        ("dppowersgd", ("mechanism.error_feedback=true",)),
    ],
)
def test_checkpoint_state_round_trips(mech, opts):
    """2 steps, save, a fresh run loads the state, 2 more steps == 4 uninterrupted steps."""
    cfg = compose_cfg(*SYNTH, f"mechanism={mech}", "mechanism.rank=2", *opts)
    straight = build_run(cfg)
    for _ in range(4):
        train_step(straight)
    first = build_run(cfg)
    for _ in range(2):
        train_step(first)
    buf = io.BytesIO()
    torch.save(run_state(first), buf)
    resumed = build_run(cfg)
    if mech == "rgp":  # a run whose W_0 differed must get the saved reference back
        resumed.mechanism.reference = {n: 0 * W for n, W in resumed.mechanism.reference.items()}
    buf.seek(0)
    load_run_state(resumed, torch.load(buf, weights_only=False))
    for _ in range(2):
        train_step(resumed)
    for p, q in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


# ------------------------------------------------------------------ memory
class PeakRss:
    """Peak resident memory of this process while inside the block (sampled every ms)."""

    def __enter__(self):
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4),
    )  # fmt: skip


def per_example_dim_and_peak(net, mech_name, b=32, rank=4):
    x, y = torch.randn(b, 32), torch.randint(0, 4, (b,))
    engine = GradEngine(net, microbatch=b)
    target = None
    if mech_name == "rgp":
        reparam = LowRankReparam(net)
        target = reparam.target(rand_carriers(reparam, rank))
    with PeakRss() as mem:
        dim = next(engine.per_example(x, y, target)).grads.shape[1]
    return dim, mem.extra


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
def test_per_example_memory_grows_with_r_not_with_p_times_d():
    torch.manual_seed(0)
    b = 32
    sizes = {}
    for width in (256, 1024):
        for rank in (2, 4):
            sizes[width, rank] = per_example_dim_and_peak(mlp(width), "rgp", b, rank)
    full = {w: sum(p.numel() for p in mlp(w).parameters()) for w in (256, 1024)}
    # the per-example rows: r (p + d) per weight (+ biases), linear in the width and in r
    for (width, rank), (dim, _) in sizes.items():
        shapes = [p.shape for p in mlp(width).parameters()]
        want = sum(min(rank, *s) * sum(s) if len(s) == 2 else s[0] for s in shapes)
        assert dim == want
    assert sizes[1024, 4][0] / sizes[256, 4][0] < 4.5  # width x4: full gradients grow x16
    assert full[1024] / full[256] > 14
    # measured: RGP at width 1024 stays far below one batch of full per-example gradients,
    # which DP-SGD does materialize
    batch_of_full = b * full[1024] * 4
    dim, dpsgd_peak = per_example_dim_and_peak(mlp(1024), "dpsgd", b)
    assert dim == full[1024] and dpsgd_peak > 0.9 * batch_of_full
    assert sizes[1024, 4][1] < 0.1 * batch_of_full, (sizes[1024, 4][1], batch_of_full)


# ------------------------------------------------------------------ config
def test_bad_settings_are_refused_with_the_key():
    with pytest.raises(ConfigError, match="mechanism.rank"):
        build_run(compose_cfg(*SYNTH, "mechanism=rgp", "mechanism.rank=0"))
    with pytest.raises(ConfigError, match="grads.backend=vmap"):
        build_run(compose_cfg(*SYNTH, "mechanism=rgp", "grads.backend=opacus"))
    with pytest.raises(ValueError, match="Conv2d and Linear"):
        LowRankReparam(nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(4, 2)))


# ------------------------------------------------- the authors' classification layer
def authors_step_reference(net, x, y, carriers, clip, scale, B):
    """RGP's step as the authors' code takes it, from per-example gradients of the original
    model (one backward each): conv weights by their left carriers only, ``dL = dW R^T``;
    the head's full gradient times ``scale``; all of one example clipped jointly to
    ``clip``; the update ``(sum dL) R`` per conv, the head's scaled sum as is, / B."""
    grads = loop_weight_grads(net, x, y)
    rows = {}
    for name, g in grads.items():
        if name in carriers:
            L, R = carriers[name]
            rows[name] = g.reshape(g.shape[0], L.shape[0], -1) @ R.T  # (n, p, r)
        else:
            rows[name] = g * (scale if name == "fc.weight" else 1.0)
    norms = torch.sqrt(sum(r.flatten(1).pow(2).sum(1) for r in rows.values()))
    factor = (clip / norms).clamp(max=1.0)
    out = {}
    for name, r in rows.items():
        s = (r * factor.view(-1, *[1] * (r.dim() - 1))).sum(0)
        if name in carriers:
            s = s @ carriers[name][1]
        out[name] = (s / B).reshape(grads[name].shape[1:])
    return out, norms


def test_authors_head_step_equals_an_independent_step_float64():
    """mechanism=rgp_authors (update=left, source=weights, head full-rank x 0.01) at zero
    noise in float64: equal to the reference above; the clip binds for some examples."""
    torch.manual_seed(0)
    net = ConvNet().double()
    x, y = data(n=6)
    x = x.double()
    # GroupNorm keeps the norms close: a clip between them binds for some examples only
    cfg = compose_cfg(*SYNTH, "mechanism=rgp_authors", "mechanism.rank=2", "mechanism.clip=1.08")
    opts = {k: v for k, v in cfg.mechanism.items() if k != "name"}
    assert (opts["update"], opts["source"], opts["head"], opts["head_scale"]) == (
        "left", "weights", "full", 0.01,
    )  # fmt: skip
    mech = mechanism("rgp", net, **opts)
    res = mech.step(x, y, ctx(z=0.0, B=8.0))
    assert set(mech.carriers) == {"c1.weight", "c2.weight"}  # the head has no carriers
    want, norms = authors_step_reference(net, x, y, mech.carriers, 1.08, 0.01, 8.0)
    assert (norms > 1.08).any() and (norms < 1.08).any()
    got = mech.engine.layout.unflatten(res.grad)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, atol=1e-12, rtol=1e-10)
    # the head's gradient is scaled inside the clip, not rescaled after it
    plain, _ = authors_step_reference(net, x, y, mech.carriers, 1.08, 1.0, 8.0)
    assert (got["fc.weight"] - plain["fc.weight"]).norm() > 1e-3 * plain["fc.weight"].norm()


@pytest.mark.parametrize("backend", ["vmap", "ghost"])
def test_full_rank_head_one_example_moves_the_release_by_at_most_C(backend):
    torch.manual_seed(0)
    net, (x, y) = ConvNet(), data(n=8)
    x[0] *= 1e3
    values = []
    scale = 0.01 if backend == "vmap" else 1.0  # ghost: the unscaled full-rank head
    for rows in (slice(0, 8), slice(1, 8)):
        spy = SpyPrivatizer(SeededNoise(torch.Generator().manual_seed(0)))
        mech = mechanism("rgp", net, rank=2, clip=0.5, backend=backend, head="full",
                         head_scale=scale)  # fmt: skip
        mech.step(x[rows], y[rows], ctx(z=1.0, noise=spy))
        assert len(spy.seen) == 1 and spy.seen[0].sensitivity == 0.5
        assert spy.records[0].std == pytest.approx(0.5)
        values.append(spy.seen[0].value)
    assert (values[0] - values[1]).norm() <= 0.5 * (1 + 1e-5)


@pytest.mark.parametrize(
    "opts, fragment",
    [
        ({"head_scale": 0.01}, "head=full"),
        ({"head": "full", "head_scale": 0.01, "backend": "ghost"}, "grads.backend=vmap"),
    ],
)
def test_head_scale_needs_a_full_head_and_vmap(opts, fragment):
    backend = opts.pop("backend", "vmap")
    with pytest.raises(ValueError, match=fragment):
        mechanism("rgp", ConvNet(), rank=2, backend=backend, **opts)
