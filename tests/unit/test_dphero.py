"""DP-Hero: Theorem 3's noise, and its two epsilons (the paper's nominal one, the honest one).

The honest multiplier of a step is z times the smallest scale over all layers (the least
noisy direction of the release); every test computes it independently of the mechanism
(singular values of W instead of eigh of W W^T; a grid search over directions in 2-D).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpsub.errors import PrivacyError
from dpsub.grads import GradEngine
from dpsub.mechanisms import build_mechanism
from dpsub.mechanisms.dphero import hero_scales
from dpsub.privacy import NoiseBlock, Privatizer, SeededNoise, Sensitive, epsilon_for
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg


def hero_cfg(*extra):
    """SYNTH with a fixed multiplier and no budget in the way (both epsilons are logged)."""
    return compose_cfg(
        *SYNTH, "privacy.noise_multiplier=1.3", "privacy.epsilon=1e12", "train.max_steps=3", *extra
    )


def matrices(run):
    layout = run.engine.layout
    return {n: p for n, p in run.model.named_parameters() if n in layout.matrix_names()}


def independent_min_scale(run) -> float:
    """min over layers of Theorem 3's v_i / sigma, from the singular values of each W."""
    smallest = 1.0  # biases get DP-SGD's noise
    for w in matrices(run).values():
        w2 = w.detach().double().reshape(w.shape[0], -1)
        egv = torch.zeros(w2.shape[0], dtype=torch.float64)
        sv = torch.linalg.svdvals(w2)
        egv[: len(sv)] = sv**2
        smallest = min(smallest, float(egv.min() * math.sqrt(len(egv)) / egv.norm()))
    return smallest


def set_equal_eigenvalues(run, c=0.7):
    """Every weight W := c [I | 0] (out <= in'), so W W^T = c^2 I: all eigenvalues equal."""
    with torch.no_grad():
        for w in matrices(run).values():
            w2 = torch.zeros(w.shape[0], w[0].numel())
            w2[:, : w.shape[0]] = c * torch.eye(w.shape[0])
            w.copy_(w2.view_as(w))


def params_of(run):
    return torch.cat([p.detach().reshape(-1) for p in run.model.parameters()])


# ------------------------------------------------------------------- Theorem 3
def test_scales_follow_theorem_3():
    torch.manual_seed(0)
    w = torch.randn(6, 20)
    basis, s = hero_scales(w)
    egv = torch.linalg.svdvals(w.double()) ** 2
    expected = egv * math.sqrt(6) / egv.norm()
    torch.testing.assert_close(s.sort().values, expected.sort().values)
    assert float((s**2).sum()) == pytest.approx(6.0)  # sum v_i^2 = k sigma^2
    # B diag(egv) B^T = W W^T
    gram = basis @ torch.diag(egv.sort().values) @ basis.T
    torch.testing.assert_close(gram, w.double() @ w.double().T)


def test_equal_eigenvalues_give_exactly_dpsgd_and_both_epsilons_agree():
    """W W^T = c^2 I: DP-Hero releases exactly DP-SGD's gradient (same seed, same noise)."""
    runs = {
        m: build_run(hero_cfg(f"mechanism={m}", "mechanism.clip=0.5")) for m in ("dpsgd", "dphero")
    }
    for run in runs.values():
        set_equal_eigenvalues(run)
    outs = {m: train_step(run) for m, run in runs.items()}
    torch.testing.assert_close(params_of(runs["dphero"]), params_of(runs["dpsgd"]))
    hero = runs["dphero"]
    assert outs["dphero"].z_records == pytest.approx(hero.z, rel=1e-12)
    assert hero.ledger.epsilon() == pytest.approx(hero.nominal.epsilon(), rel=1e-12)
    assert hero.ledger.epsilon() == pytest.approx(runs["dpsgd"].ledger.epsilon(), rel=1e-12)


# ---------------------------------------------------------- the two epsilons
def test_theorem_3_scales_never_exceed_dpsgd_in_the_least_noisy_direction():
    """mean(s^2) = 1, so min s <= 1: the honest multiplier is never above the nominal one."""
    gen = torch.Generator().manual_seed(1)
    for rows, cols in [(1, 5), (2, 2), (6, 25), (16, 150), (10, 84), (7, 7)]:
        for scale in (1e-3, 1.0, 50.0):
            _, s = hero_scales(scale * torch.randn(rows, cols, generator=gen))
            assert float(s.min()) <= 1.0 + 1e-12
            assert float((s**2).mean()) == pytest.approx(1.0)


def test_honest_epsilon_exceeds_the_nominal_one_for_anisotropic_noise():
    run = build_run(hero_cfg("mechanism=dphero"))
    for _ in range(3):
        expected = run.z * independent_min_scale(run)  # from W^(t-1), before the update
        out = train_step(run)
        assert out.z_records == pytest.approx(expected, rel=1e-6)
        assert out.z_charged == out.z_records < run.z
    honest, nominal = run.ledger.epsilon(), run.nominal.epsilon()
    assert nominal == pytest.approx(epsilon_for([(run.z, run.q, 3)], 1e-5), rel=1e-12)
    assert honest == pytest.approx(epsilon_for(run.ledger.history, 1e-5), rel=1e-12)
    assert honest > nominal


def test_accounting_option_picks_the_ledger_the_budget_is_enforced_on():
    """At a budget the nominal plan allows, measured stops at step 0 and nominal runs on."""
    steps = {}
    for acc in ("measured", "nominal"):
        run = build_run(
            compose_cfg(*SYNTH, "mechanism=dphero", f"mechanism.accounting={acc}",
                        "privacy.epsilon=8", "train.max_steps=3")
        )  # fmt: skip
        assert run.mechanism.accounting == acc
        outs = [train_step(run) for _ in range(3)]
        steps[acc] = run.step
        assert run.budget_ledger is (run.ledger if acc == "measured" else run.nominal)
        if acc == "nominal":
            assert all(not o.stopped_by_budget for o in outs)
            assert run.ledger.epsilon() > 8 >= run.nominal.epsilon()
    assert steps == {"measured": 0, "nominal": 3}


def test_a_direction_without_noise_is_refused():
    """out > in': W W^T has zero eigenvalues, v_i = 0, no noise there: the step is refused."""
    run = build_run(hero_cfg("mechanism=dphero"))
    with torch.no_grad():
        run.model.classifier[0].weight[:, 2:] = 0  # rank 2 < 32 rows
    before = params_of(run).clone()
    with pytest.raises(PrivacyError, match=r"30 directions of classifier\.0\.weight's noise "
                       r"would get no noise .*dead or dependent rows.*dphero_floor"):  # fmt: skip
        train_step(run)
    assert torch.equal(params_of(run), before)


def test_a_release_with_a_direction_without_noise_is_never_charged():
    """The account's own guard, for any mechanism: a record of std 0 is refused."""
    from dpsub.privacy import NoiseRecord
    from dpsub.privacy.run_account import PrivacyAccount

    phases = build_mechanism("dphero").phases(5)
    acct = PrivacyAccount.open(n=100, batch_size=10, steps=5, phases=phases, policy="measured",
                               epsilon=math.inf, delta=1e-5, accountant="rdp",
                               noise_multiplier=1.0)  # fmt: skip
    with pytest.raises(PrivacyError, match="some direction of the release got no noise"):
        acct.charge([NoiseRecord("gradient", 1.0, 0.0)], 1.0)
    assert acct.ledger.steps == 0


# ----------------------------------------------------------- the floor variant
def test_floor_variant_never_adds_less_noise_than_dpsgd_in_any_direction():
    """Scales max(s_i, 1), also for rank-deficient and zero W: the record says >= z C, and
    the noise drawn with the mechanism's own shaping has it along every eigenvector."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(9, 4), nn.Linear(4, 5), nn.Linear(5, 3))  # 5 x 4: rank 4
    with torch.no_grad():
        model[2].weight.zero_()
    mech = build_mechanism("dphero_floor")
    mech.setup(GradEngine(model))
    blocks, _ = mech.noise_blocks()
    for b in blocks:
        p = Privatizer(SeededNoise(torch.Generator().manual_seed(3)))
        cols = 40_000
        wide = NoiseBlock(0, b.rows, cols, b.left)
        noise = p.shaped(Sensitive(torch.zeros(b.rows * cols), 0.5), 0.8, [wide])
        assert p.records[0].std >= 0.8 * (1 - 1e-12)
        assert p.effective_multiplier() >= 0.8 / 0.5 * (1 - 1e-12)
        basis = torch.linalg.svd(b.left.double())[0].float()  # eigenvectors of the covariance
        along = basis.T @ noise.view(b.rows, cols)
        assert along.std(dim=1).min() >= 0.8 * 0.97


def test_floor_variant_passes_the_planned_accounting():
    run = build_run(hero_cfg("mechanism=dphero_floor"))
    assert run.mechanism.accounting == "planned" and run.nominal is None
    for _ in range(3):
        out = train_step(run)
        assert out.z_records >= run.z * (1 - 1e-12)
        assert out.z_charged == run.z
    assert run.ledger.history == [(run.z, run.q, 3)]


# ------------------------------------------------- 2-D anisotropic Gaussian
class TwoDim(nn.Module):
    """logits[:2] = W x[:2] with a 2x2 weight; the other logits are 0."""

    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, 2))
        self.num_classes = num_classes

    def forward(self, x):
        two = x.flatten(1)[:, :2] @ self.w.T
        return torch.cat([two, torch.zeros(x.shape[0], self.num_classes - 2)], dim=1)


def test_charged_multiplier_of_a_2d_anisotropic_gaussian_equals_a_direct_computation(
    monkeypatch,
):
    """Each column of W's gradient gets noise of covariance Sigma (2 x 2): the worst shift
    of norm C has Mahalanobis distance d = C max_u sqrt(u^T Sigma^-1 u), and z = 1 / d."""
    from dpsub.models import MODELS

    monkeypatch.setitem(MODELS, "twodim", "test_dphero:TwoDim")
    run = build_run(hero_cfg("mechanism=dphero", "model.name=twodim", "~model.norm",
                             "mechanism.clip=0.7"))  # fmt: skip
    theta, a, b = 0.4, 1.5, 0.6
    rot = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    with torch.no_grad():
        run.model.w.copy_(rot @ torch.diag(torch.tensor([a, b])))
    # Theorem 3 without an eigendecomposition: with G = W W^T = B diag(egv) B^T,
    # C^2 B diag(v)^2 B^T = C^2 z^2 k G^2 / ||G||_F^2   (v_i = egv_i sqrt(k) z / ||egv||)
    w = run.model.w.detach().double()
    g = w @ w.T
    sigma = 0.7**2 * run.z**2 * 2 * g @ g / (g**2).sum()
    inv = torch.linalg.inv(sigma)
    angles = torch.linspace(0, math.pi, 200_001, dtype=torch.float64)
    u = torch.stack([angles.cos(), angles.sin()])
    d = 0.7 * float(((inv @ u) * u).sum(0).max().sqrt())
    out = train_step(run)
    assert out.z_charged == pytest.approx(1 / d, rel=1e-8)
    assert run.ledger.history == [(out.z_charged, run.q, 1)]
