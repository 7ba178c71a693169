"""Private selection (Papernot and Steinke 2022): the bounds against an independent
implementation's numbers and against exact Renyi divergences; the sampler against its
law; ``select_privately``'s guards (a run over its bound, the score's noise)."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import dpsub
from dpsub.errors import PrivacyError
from dpsub.privacy.accountants import DEFAULT_ORDERS, PrivacyLedger
from dpsub.privacy.selection import (
    Repetitions,
    gaussian_rdp,
    rdp_to_delta,
    repeat_and_select_rdp,
    selection_epsilon,
)

ORDERS = np.asarray(DEFAULT_ORDERS)
LAWS = {
    "poisson": Repetitions(10.0),
    "geometric": Repetitions(10.0, 1.0),
    "logarithmic": Repetitions(10.0, 0.0),
    "tnb-0.5": Repetitions(10.0, 0.5),
    "poisson-3": Repetitions(3.0),
}
#: Google's dp_accounting 0.6.0, ``rdp_privacy_accountant._compute_rdp_repeat_and_select``
#: on the base curve ``rho * order`` over these orders (a Gaussian mechanism), and its
#: ``_gamma_truncated_negative_binomial``; it caps by monotonicity only the truncated
#: negative binomial's bounds, so the Poisson rows compare ``capped=False``. Values at
#: orders 2, 8 and 32, and gamma: ``uv run --with dp-accounting`` on 2026-11-29.
REFERENCE = {
    ("poisson", 0.05): ((2.464088544214096, 1.9981001960523004, 3.417296609569236), None),
    ("geometric", 0.05): ((1.9858463645561966, 1.986171637274709, 2.93150784818781), 0.1),
    ("logarithmic", 0.05): (
        (1.5289037404428172, 1.5292290131613295, 2.4745652240744307),
        0.02691825958900153,
    ),
    ("tnb-0.5", 0.05): (
        (1.770626682408615, 1.7709519551271273, 2.7162881660402283),
        0.06249999997671692,
    ),
    ("poisson-3", 0.05): ((1.2170633240341249, 0.9376924532113895, 2.158345007411735), None),
    ("poisson", 0.5): ((6.687760698845598, 9.504591458568559, 21.57585346831773), None),
    ("geometric", 0.5): ((5.939407275705779, 7.621878911374431, 19.36721512228753), 0.1),
    ("logarithmic", 0.5): (
        (4.835339620613552, 6.5178112562822035, 18.263147467195303),
        0.02691825958900153,
    ),
    ("tnb-0.5", 0.5): (
        (5.429337043534621, 7.111808679203272, 18.857144890116373),
        0.06249999997671692,
    ),
    ("poisson-3", 0.5): ((3.114164970423576, 5.709639831966268, 17.685912065036284), None),
}


@pytest.mark.parametrize(("law", "rho"), list(REFERENCE))
def test_bounds_equal_an_independent_implementation(law, rho):
    (at2, at8, at32), gamma = REFERENCE[law, rho]
    rep = LAWS[law]
    got = repeat_and_select_rdp(rho * ORDERS, rep, capped=not rep.poisson)
    for order, value in ((2.0, at2), (8.0, at8), (32.0, at32)):
        assert got[DEFAULT_ORDERS.index(order)] == pytest.approx(value, rel=1e-8)
    if gamma is not None:
        assert rep.gamma == pytest.approx(gamma, rel=1e-8)


def test_capping_lowers_no_bound_below_the_exact_and_keeps_it_monotone():
    for rep in LAWS.values():
        raw = repeat_and_select_rdp(0.05 * ORDERS, rep, capped=False)
        capped = repeat_and_select_rdp(0.05 * ORDERS, rep)
        assert np.all(capped <= raw) and np.all(np.diff(capped) >= 0)


def _renyi(p, q, a):
    m = p > 0
    return math.log(np.sum(p[m] ** a * q[m] ** (1 - a))) / (a - 1)


def _both(p, q):
    return np.array([max(_renyi(p, q, a), _renyi(q, p, a)) for a in ORDERS])


def _best_of_k(rep, p, kmax=400):
    """The law of the highest of K draws of a score with pmf ``p`` (index 0 = K = 0)."""
    pk = np.array([rep.pmf(k) for k in range(kmax)])
    cdf = np.cumsum(p)
    pgf = [np.sum(pk * c ** np.arange(kmax)) for c in np.concatenate([[0.0], cdf])]
    return np.concatenate([[pk[0]], np.diff(pgf)])


@pytest.mark.parametrize("law", list(LAWS))
@pytest.mark.parametrize(
    ("p", "q"),
    [((0.999, 0.001), (0.997, 0.003)), ((0.98, 0.015, 0.005), (0.95, 0.03, 0.02))],
)
def test_bound_covers_the_exact_divergence_of_a_small_selection(law, p, q):
    """A score mechanism with a few outcomes: the best of K draws has a law computed
    exactly, so its Renyi divergence must lie under the theorem's bound at every order."""
    rep, p, q = LAWS[law], np.asarray(p), np.asarray(q)
    bound = repeat_and_select_rdp(_both(p, q), rep)
    exact = _both(_best_of_k(rep, p), _best_of_k(rep, q))
    assert np.all(exact <= bound + 1e-12)
    assert exact[DEFAULT_ORDERS.index(8.0)] > 0.3 * bound[DEFAULT_ORDERS.index(8.0)]


@pytest.mark.parametrize("law", list(LAWS))
def test_the_sampler_draws_the_analysed_law(law):
    rep = LAWS[law]
    assert sum(rep.pmf(k) for k in range(3000)) == pytest.approx(1, abs=1e-9)
    assert sum(k * rep.pmf(k) for k in range(3000)) == pytest.approx(rep.expected(), rel=1e-9)
    assert rep.expected() >= rep.mean * (1 - 1e-9)
    draws = [rep.sample(u) for u in np.random.default_rng(0).random(20_000)]
    assert np.mean(draws) == pytest.approx(rep.expected(), rel=0.05)
    assert np.mean(np.asarray(draws) == 0) == pytest.approx(rep.pmf(0), abs=0.01)


def test_delta_conversion_inverts_the_epsilon_conversion():
    rdp = 0.05 * ORDERS
    eps = dpsub.privacy.accountants.rdp_to_epsilon(rdp, 1e-5)
    assert rdp_to_delta(rdp, eps) == pytest.approx(1e-5, rel=1e-6)


def test_selection_costs_more_than_one_run_and_its_score():
    run = 0.05 * ORDERS
    one = dpsub.privacy.accountants.rdp_to_epsilon(run + gaussian_rdp(20.0), 1e-5)
    rep = Repetitions(10.0, 1.0)
    assert selection_epsilon(run, rep, 1e-5, 20.0) > one
    assert selection_epsilon(run, rep, 1e-5, 2.0) > selection_epsilon(run, rep, 1e-5, 20.0)


def test_bad_arguments_are_refused():
    ok = dict(repetitions=Repetitions(2.0, 1.0), run_rdp=np.zeros(len(ORDERS)), delta=1e-5)
    for bad, key in (
        (dict(candidates=[]), "candidates"), (dict(delta=0.0), "delta"),
        (dict(run_rdp=np.zeros(3)), "run_rdp"), (dict(score_sigma=0.0), "score_sigma"),
    ):  # fmt: skip
        args = {"candidates": [1], "score_sigma": 1.0, **ok, **bad}
        with pytest.raises(ValueError, match=key):
            dpsub.select_privately(args.pop("candidates"), lambda c: None, **args)


def test_bad_laws_are_refused():
    for bad in (dict(mean=0.5), dict(mean=math.inf), dict(mean=5, shape=-1)):
        with pytest.raises(ValueError, match="repetitions"):
            Repetitions(**bad)


# ----------------------------------------------------------------- select_privately
def _ledger(z, q, steps):
    ledger = PrivacyLedger(delta=1e-5)
    for _ in range(steps):
        ledger.step(z, q)
    return ledger


def test_a_run_over_its_declared_bound_is_refused():
    bound = dpsub.planned_rdp(1.0, 0.01, 100)

    def train(c):
        return c, 10, _ledger(1.0, 0.01, 101)  # one step more than declared

    with pytest.raises(PrivacyError, match="run_rdp"):
        dpsub.select_privately(
            [1, 2], train, repetitions=Repetitions(3.0, 1.0), run_rdp=bound,
            score_sigma=5.0, delta=1e-5, seed=0,
        )  # fmt: skip


def test_the_released_score_carries_noise_and_the_epsilon_covers_the_search():
    bound = dpsub.planned_rdp(1.0, 0.01, 100)
    counts = {"a": 40, "b": 42}

    calls = []

    def train(c):
        calls.append(c)
        return c.upper(), counts[c], _ledger(1.0, 0.01, 100)

    rep = Repetitions(4.0, 1.0)
    sel = dpsub.select_privately(
        list(counts), train, repetitions=rep, run_rdp=bound, score_sigma=5.0, delta=1e-5, seed=1
    )
    assert calls and sel.result == sel.candidate.upper()
    assert not hasattr(sel, "runs")  # K is secret: published, the bound would not hold
    assert sel.score != counts[sel.candidate]  # noisy, not the private count
    assert sel.epsilon == selection_epsilon(bound, rep, 1e-5, 5.0)


def test_no_run_under_a_poisson_law_releases_nothing():
    calls = []
    sel = dpsub.select_privately(
        [0], lambda c: calls.append(c), repetitions=Repetitions(1.0), run_rdp=np.zeros(len(ORDERS)),
        score_sigma=1.0, delta=1e-5, seed=3,
    )  # fmt: skip
    assert sel.candidate is None and sel.score is None and not calls


def test_select_privately_around_make_private():
    torch.manual_seed(0)
    x = torch.randn(600, 8)
    y = (x @ torch.randn(8, 3)).argmax(1)

    def train(lr):
        model = nn.Linear(8, 3)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        private = dpsub.make_private(
            model, opt, (x[:500], y[:500]), batch_size=50, steps=10, noise_multiplier=1.0
        )
        for xb, yb in private.batches():
            private.backward(xb, yb)
            opt.step()
        return model, int((model(x[500:]).argmax(1) == y[500:]).sum()), private.ledger

    sel = dpsub.select_privately(
        [0.1, 1.0], train, repetitions=Repetitions(2.0, 1.0),
        run_rdp=dpsub.planned_rdp(1.0, 0.1, 10), score_sigma=3.0, delta=1e-5, seed=0,
    )  # fmt: skip
    assert sel.candidate in (0.1, 1.0) and isinstance(sel.result, nn.Linear)
    assert math.isfinite(sel.epsilon) and sel.epsilon > 0


def test_the_cost_docs_api_states():
    """docs/api.md's figures: DP-SGD at z 1, q 0.1, 50 steps (epsilon 5.88 a run), score
    noise 10, mean-5 repetitions; five runs and their scores composed."""
    run = dpsub.planned_rdp(1.0, 0.1, 50)
    assert round(dpsub.privacy.accountants.rdp_to_epsilon(run, 1e-5), 2) == 5.88
    assert round(selection_epsilon(run, Repetitions(5.0, 1.0), 1e-5, 10.0), 2) == 8.95
    assert round(selection_epsilon(run, Repetitions(5.0, 0.0), 1e-5, 10.0), 2) == 8.24
    assert round(selection_epsilon(run, Repetitions(5.0), 1e-5, 10.0), 2) == 8.55
    grid = 5 * (run + gaussian_rdp(10.0))  # five runs and their scores, all released
    assert round(dpsub.privacy.accountants.rdp_to_epsilon(grid, 1e-5), 2) == 12.42


def test_secure_selection_draws_from_the_os():
    bound = dpsub.planned_rdp(1.0, 0.01, 10)
    sel = dpsub.select_privately(
        ["a", "b"], lambda c: (c, 5, _ledger(1.0, 0.01, 10)), repetitions=Repetitions(3.0, 1.0),
        run_rdp=bound, score_sigma=2.0, delta=1e-5, secure=True,
    )  # fmt: skip
    assert sel.candidate in ("a", "b") and sel.score != 5
