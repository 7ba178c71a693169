"""Empirical privacy auditing (dpsub.audit): the bounds, the white-box gradient-canary audit of
the real step code, a deliberately broken mechanism it must catch, and the one-run audit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dpsub.audit import bounds
from dpsub.audit.onerun import guesses, insert_canaries
from dpsub.audit.whitebox import WhiteboxOptions, whitebox_audit
from dpsub.mechanisms.base import StepResult
from dpsub.mechanisms.dpsgd import DPSGD
from dpsub.privacy import Sensitive
from dpsub.training.build import build_run

from conftest import compose_cfg
from helpers.audit import TINY

#: one full-batch step (q = 1): the released gradient is one Gaussian mechanism


def tiny_run(*overrides: str):
    return build_run(compose_cfg(*TINY, *overrides))


# ------------------------------------------------------------------ bounds
def test_clopper_pearson_upper_matches_closed_form() -> None:
    # k = 0 of n: the upper bound p solves (1 - p)^n = alpha
    assert bounds.clopper_pearson_upper(0, 100, 0.025) == pytest.approx(1 - 0.025 ** (1 / 100))
    assert bounds.clopper_pearson_upper(100, 100, 0.025) == 1.0


def test_epsilon_from_rates() -> None:
    assert bounds.epsilon_from_rates(0.01, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert bounds.epsilon_from_rates(0.5, 0.5, 0.0) == 0.0


def test_threshold_chosen_apart_from_evaluation_is_not_fooled_by_chance() -> None:
    """Identical score distributions: the valid bound is 0 in at least 90% of small audits."""
    positive = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        a, b = rng.standard_normal(200), rng.standard_normal(200)
        positive += bounds.split_threshold_bound(a, b, 1e-5, rng=rng).epsilon > 0
    assert positive <= 4


def test_rates_are_counted_on_the_trials_the_threshold_never_saw(monkeypatch) -> None:
    seen = {}
    real = bounds._best_threshold

    def spy(s_in, s_out, delta, alpha):
        seen["in"], seen["out"] = set(s_in.tolist()), set(s_out.tolist())
        return real(s_in, s_out, delta, alpha)

    monkeypatch.setattr(bounds, "_best_threshold", spy)
    rng = np.random.default_rng(0)
    s_in, s_out = 1 + rng.standard_normal(2001), rng.standard_normal(3001)
    rb = bounds.split_threshold_bound(s_in, s_out, 1e-5, rng=rng)
    assert rb.n_in == 2001 - len(seen["in"]) and rb.n_out == 3001 - len(seen["out"])
    assert rb.false_pos == sum(x >= rb.threshold for x in s_out if x not in seen["out"])
    assert rb.false_neg == sum(x < rb.threshold for x in s_in if x not in seen["in"])


def test_gdp_epsilon_solves_the_gdp_curve() -> None:
    for mu in (0.25, 1.0, 2.0):
        eps = bounds.gdp_epsilon(mu, 1e-5)
        assert bounds.gdp_delta(eps, mu) == pytest.approx(1e-5, rel=1e-6)
    assert bounds.gdp_epsilon(1.0, 1e-5) == pytest.approx(4.377, abs=2e-3)
    assert bounds.gdp_epsilon(0.0, 1e-5) == 0.0


def test_one_run_bound_all_correct_has_a_closed_form() -> None:
    """delta = 0 and r = v: p-value = p^r, so eps = log(p / (1 - p)) with p = alpha^(1/r)."""
    for r in (10, 100):
        p = 0.05 ** (1 / r)
        assert bounds.one_run_epsilon(1000, r, r, 0.0) == pytest.approx(
            math.log(p / (1 - p)), abs=1e-5
        )
    assert bounds.one_run_epsilon(1000, 100, 50, 0.0) == 0.0  # chance accuracy shows nothing


def test_one_run_delta_term_is_the_papers_maximum() -> None:
    """Independent computation of 2 m delta max_i P[v-i <= Bin < v] / i by direct sums."""
    from scipy import stats

    m, r, v, eps, delta = 1000, 60, 50, 1.0, 1e-5
    p = 1 / (1 + math.exp(-eps))
    tail = sum(stats.binom.pmf(j, r, p) for j in range(v, r + 1))
    window = max(
        sum(stats.binom.pmf(j, r, p) for j in range(v - i, v)) / i for i in range(1, v + 1)
    )
    want = tail + 2 * m * delta * window
    assert bounds.one_run_p_value(m, r, v, eps, delta) == pytest.approx(want, rel=1e-9)
    assert bounds.one_run_epsilon(m, r, v, delta) < bounds.one_run_epsilon(m, r, v, 0.0)


# -------------------------------------------------------- white-box audit
@pytest.mark.parametrize("z", [0.5, 1.0, 2.0, 4.0])
def test_dpsgd_one_step_fitted_mu_is_one_over_z(z: float) -> None:
    run = tiny_run(f"privacy.noise_multiplier={z}")
    report = whitebox_audit(run, WhiteboxOptions(trials=200_000))
    assert report["trials"]["mode"] == "affine"
    assert report["gdp"]["mu"] == pytest.approx(1 / z, rel=0.1)
    assert report["gdp"]["mu_exact"] == pytest.approx(1 / z, rel=1e-4)
    assert report["lower_bound"]["epsilon"] <= report["epsilon_upper"]
    assert report["lower_bound"]["epsilon"] > 0.3 * report["epsilon_upper"]


@pytest.mark.parametrize("backend", ["opacus", "ghost"])
def test_canary_reaches_every_backend(backend: str) -> None:
    run = tiny_run("privacy.noise_multiplier=1.0", f"grads.backend={backend}")
    report = whitebox_audit(run, WhiteboxOptions(trials=10_000))
    assert report["gdp"]["mu_exact"] == pytest.approx(1.0, rel=1e-4)
    assert report["per_step"][0]["shift_norm"] == pytest.approx(1 / 32, rel=1e-4)


class HalfNoise(DPSGD):
    """Draws half the noise and tells the privatizer the sensitivity is half: the records
    (and so the trainer's check and the ledger) still say multiplier z."""

    def step(self, x, y, ctx) -> StepResult:
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        lie = Sensitive(clipped.sum.value, clipped.sum.sensitivity / 2)
        noisy = ctx.noise.gaussian(lie, ctx.z * self.opts.clip / 2, "gradient")
        return StepResult(noisy / ctx.expected_batch_size, clipped.stats)


def test_broken_mechanism_is_caught_above_its_reported_epsilon() -> None:
    from dpsub.training.build import train_step

    run = tiny_run("privacy.noise_multiplier=1.5")
    broken = HalfNoise(clip=1.0)
    broken.setup(run.engine)
    run.mechanism = broken
    report = whitebox_audit(run, WhiteboxOptions(trials=1_000_000))
    assert train_step(tiny_run("privacy.noise_multiplier=1.5")).z_records == pytest.approx(1.5)
    assert report["per_step"][0]["z_records"] == pytest.approx(1.5)  # the records are fooled
    assert report["lower_bound"]["epsilon"] > report["epsilon_upper"]
    assert report["exceeds_upper"]


def test_large_canary_is_clipped_and_the_bound_holds() -> None:
    run = tiny_run("privacy.noise_multiplier=1.0")
    report = whitebox_audit(run, WhiteboxOptions(trials=200_000, norm_scale=10.0))
    assert report["gdp"]["mu_exact"] == pytest.approx(1.0, rel=1e-3)
    assert not report["exceeds_upper"]


def test_pdpsgd_aligned_canary_is_as_visible_as_dpsgds() -> None:
    run = tiny_run("privacy.noise_multiplier=1.0", "mechanism=rpdpsgd", "mechanism.num_bases=4")
    report = whitebox_audit(run, WhiteboxOptions(trials=10_000))
    assert report["gdp"]["mu_exact"] == pytest.approx(1.0, rel=1e-3)
    rnd = whitebox_audit(
        tiny_run("privacy.noise_multiplier=1.0", "mechanism=rpdpsgd", "mechanism.num_bases=4"),
        WhiteboxOptions(trials=10_000, direction="random"),
    )
    assert rnd["gdp"]["mu_exact"] < 0.1


GEP = ("privacy.noise_multiplier=1.0", "mechanism=gep", "aux=gaussian", "aux.num_samples=32",
       "mechanism.num_bases=8")  # fmt: skip


def test_gep_split_canary_reaches_one_over_z_on_the_releases() -> None:
    """GEP's canary is S1 = 10 in the anchor subspace and S2 = 2 orthogonal to it; scored on
    both releases over their noise std, mu is 1/z (the residual's book-keeping margin takes
    < 1e-3); the update adds the residual's noise to the embedding's: projected on the
    shift, mu = (S1^2 + S2^2) / sqrt(S1^2 (s1^2 + s2^2) + S2^2 s2^2), s_j = sqrt(2) S_j."""
    rel = whitebox_audit(tiny_run(*GEP), WhiteboxOptions(trials=10_000, view="releases"))
    assert rel["gdp"]["mu_exact"] == pytest.approx(1.0, rel=1e-3)
    assert rel["canary"]["norm"] == pytest.approx(math.hypot(10, 2), rel=1e-5)
    assert rel["view"] == "releases" and not rel["exceeds_upper"]
    upd = whitebox_audit(tiny_run(*GEP), WhiteboxOptions(trials=10_000))
    want = 104 / math.sqrt(100 * 2 * 104 + 4 * 2 * 4)
    assert upd["gdp"]["mu_exact"] == pytest.approx(want, rel=1e-3)


def test_dphero_least_noisy_direction_exceeds_its_nominal_epsilon() -> None:
    run = tiny_run("privacy.epsilon=2", "mechanism=dphero")
    report = whitebox_audit(run, WhiteboxOptions(trials=200_000, direction="least_noisy"))
    assert report["epsilon_nominal"] == pytest.approx(2.0, abs=0.05)
    assert report["lower_bound"]["epsilon"] > report["epsilon_nominal"]
    assert report["lower_bound"]["epsilon"] <= report["epsilon_upper"]  # the honest epsilon


# ------------------------------------------------------------- one run
def test_insert_canaries_relabels_and_includes_about_half() -> None:
    from dpsub.training.build import load_data

    data = load_data(compose_cfg(*TINY, "dataset.synthetic.n_train=400"))
    out, cx, cy, inc = insert_canaries(data, 100, seed=0)
    flat = data.train_x.reshape(400, -1)
    where = [int((flat == c.reshape(1, -1)).all(1).nonzero()[0]) for c in cx]
    assert cx.shape[0] == 100 and bool((cy != data.train_y[where]).all())
    assert out.train_y.shape[0] == 300 + int(inc.sum()) and 30 < int(inc.sum()) < 70


def test_guesses_count_correct_calls() -> None:
    losses = torch.tensor([0.1, 0.2, 5.0, 6.0])
    included = torch.tensor([True, False, False, True])
    assert guesses(losses, included, 1) == (2, 1)  # lowest (in: right), highest (out: wrong)


# ----------------------------------------------------------------- CLI
def audit_cfg(*overrides: str):
    from dpsub.config import compose

    return compose(["logger=disabled", *overrides], config_name="dpsub_audit")


def test_audit_writes_audit_json_beside_the_summary_and_a_log_line(tmp_path) -> None:
    from dpsub.cli.audit import run_audit

    run_audit(audit_cfg(*TINY, "audit.trials=20000"), tmp_path / "a")
    report = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert report["lower_bound"]["epsilon"] <= report["epsilon_upper"]
    assert report["lower_bound"]["confidence"] == 0.95 and report["trials"]["in"] == 20000
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["epsilon"] == report["epsilon_upper"]
    assert (
        "audit: whitebox dpsgd | lower bound epsilon" in (tmp_path / "a" / "train.log").read_text()
    )


@pytest.mark.parametrize(
    "bad",
    [
        "audit.direction=sideways",
        "audit.view=sideways",
        "audit.trials=0",
        "audit.alpha=1.5",
        "privacy.epsilon=-1",
    ],
)
def test_bad_audit_option_is_one_line_and_exit_2(tmp_path, capsys, bad: str) -> None:
    from dpsub.cli.audit import run_audit

    with pytest.raises(SystemExit) as exc:
        run_audit(audit_cfg(*TINY, bad), tmp_path / "b")
    assert exc.value.code == 2
    assert bad.split("=")[0] in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_onerun_audit_end_to_end_on_a_tiny_run(tmp_path) -> None:
    from dpsub.cli.audit import run_audit

    cfg = audit_cfg(
        "dataset=synthetic", "dataset.synthetic.n_train=200", "dataset.synthetic.n_test=50",
        "train.batch_size=50", "train.max_steps=3", "model=lenet", "audit=onerun",
        "audit.canaries=40", "audit.guesses=10",
    )  # fmt: skip
    report = run_audit(cfg, tmp_path / "o")
    assert report["trials"]["canaries"] == 40 and report["trials"]["guesses"] == 20
    assert 0 <= report["lower_bound"]["epsilon"] <= report["epsilon_upper"]
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["steps"] == 3
