"""PATE: aggregators, accounting, vote sensitivity, pools (torch-free, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from dpsub.pate.accounting import (
    ORDERS,
    PateLedger,
    log_q_gnmax,
    rdp_gnmax_data_dependent,
    record_rdp,
)
from dpsub.pate.aggregators import ConfidentGNMax, GNMax, LNMax, build_aggregator
from dpsub.pate.pool import public_split
from dpsub.pate.votes import hash_partition, histograms, members, partition
from dpsub.privacy.accountants import epsilon_for


# ------------------------------------------------------------------ aggregators
def test_histograms_count_votes():
    preds = np.array([[0, 1, 2], [0, 1, 1], [2, 1, 1]])  # 3 teachers, 3 queries
    h = histograms(preds, 3)
    assert h.tolist() == [[2, 0, 1], [0, 3, 0], [0, 2, 1]]
    assert (h.sum(axis=1) == 3).all()


def test_gnmax_noise_std_is_its_record():
    """The noise actually drawn has the std the accountant charges (catches halved noise)."""
    agg, rng = GNMax(sigma=20.0), np.random.default_rng(1)
    counts = np.zeros(10)
    noise = np.stack([agg.noisy_counts(counts, rng) for _ in range(4000)]).ravel()
    (record,) = agg.worst_case()
    assert record.scale == 20.0 and record.sensitivity == pytest.approx(math.sqrt(2))
    assert noise.std() == pytest.approx(record.scale, rel=0.03)


def test_lnmax_noise_is_its_record():
    """Argmax of ties under Laplace noise: the winner's margin has Laplace spread b."""
    agg, rng = LNMax(scale=5.0), np.random.default_rng(2)
    counts = np.array([10.0, 0.0])
    wrong = np.mean([agg(counts, rng).label == 1 for _ in range(20000)])
    # Pr[10 + L1 < L2] with L1, L2 ~ Lap(b): the difference of two Laplaces exceeds 10
    b = agg.worst_case()[0].scale
    expected = 0.5 * math.exp(-10 / b) * (1 + 10 / (2 * b))
    assert wrong == pytest.approx(expected, abs=0.01)


def test_confident_threshold_noise_and_charge():
    """Pr[answered] = Phi((max - T) / sigma1); a refused query still pays the check."""
    agg, rng = ConfidentGNMax(sigma1=10.0, sigma2=5.0, threshold=50.0), np.random.default_rng(3)
    counts = np.array([40.0, 0.0, 0.0])  # max = T - sigma1
    answers = [agg(counts, rng) for _ in range(20000)]
    rate = np.mean([a.label is not None for a in answers])
    assert rate == pytest.approx(stats.norm.cdf(-1.0), abs=0.01)
    refused = next(a for a in answers if a.label is None)
    assert [(r.name, r.scale, r.sensitivity) for r in refused.records] == [("threshold", 10.0, 1.0)]
    answered = next(a for a in answers if a.label is not None)
    assert {r.name for r in answered.records} == {"threshold", "votes"}


def test_gnmax_answers_clear_majority():
    agg, rng = build_aggregator({"aggregator": "gnmax", "sigma2": 1.0}), np.random.default_rng(0)
    assert all(agg(np.array([0.0, 50.0, 0.0]), rng).label == 1 for _ in range(100))
    with pytest.raises(ValueError, match="pate.aggregator"):
        build_aggregator({"aggregator": "nope"})


# ------------------------------------------------------------ vote sensitivity
def test_partition_disjoint_balanced_deterministic():
    t = partition(1003, 10, seed=4)
    assert (t == partition(1003, 10, seed=4)).all()
    parts = members(t, 10)
    everyone = np.concatenate(parts)
    assert sorted(everyone.tolist()) == list(range(1003))  # disjoint and covering
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert not (t == partition(1003, 10, seed=5)).all()


def _nearest_mean_teacher(x, y, queries, k):
    """A deterministic 'teacher': nearest class mean of its own examples."""
    means = np.stack(
        [x[y == c].mean(0) if (y == c).any() else np.full(x.shape[1], 1e9) for c in range(k)]
    )
    return np.argmin(((queries[:, None, :] - means[None]) ** 2).sum(-1), axis=1)


def test_hash_partition_deterministic_keyed_and_near_balanced():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(5000, 4)), rng.integers(0, 10, 5000)
    t = hash_partition(x, y, 25, seed=4)
    assert (t == hash_partition(x, y, 25, seed=4)).all()
    assert (t != hash_partition(x, y, 25, seed=5)).mean() > 0.9  # the key moves everyone
    assert ((t >= 0) & (t < 25)).all()
    sizes = np.bincount(t, minlength=25)
    assert sizes.min() > 0 and sizes.std() < 2 * math.sqrt(200)  # multinomial around 200
    assert (hash_partition(x, (y + 1) % 10, 25, seed=4) != t).mean() > 0.9  # the label counts


@pytest.mark.parametrize("change", ["remove", "add"])
def test_hash_partition_keeps_every_other_example_with_its_teacher(change):
    """Add/remove neighbours: the partition of the neighbouring training set (built from
    scratch, not reused) gives every other example the same teacher."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(600, 3)), rng.integers(0, 3, 600)
    t = hash_partition(x, y, 7, seed=1)
    for i in (0, 1, 299, 599):
        if change == "remove":
            x2, y2, others = np.delete(x, i, 0), np.delete(y, i), np.delete(t, i)
        else:  # a new example inserted at position i
            x2, y2, others = np.insert(x, i, 9.0, 0), np.insert(y, i, 2), np.insert(t, i, -1)
        t2 = hash_partition(x2, y2, 7, seed=1)
        assert (t2[others >= 0] == others[others >= 0]).all()
    # the permutation partition moves most examples when one is removed (no add/remove claim)
    moved = (np.delete(partition(600, 7, seed=1), 0) != partition(599, 7, seed=1)).mean()
    assert moved > 0.5


def _votes(x, y, queries, teacher_of, n_teachers, k):
    preds = [
        _nearest_mean_teacher(x[idx], y[idx], queries, k) for idx in members(teacher_of, n_teachers)
    ]
    return np.stack(preds), histograms(np.stack(preds), k)


def _neighbour(x, y, i, change):
    if change == "replace":
        x2, y2 = x.copy(), y.copy()
        x2[i], y2[i] = [50.0, -50.0], (y[i] + 1) % 3
        return x2, y2
    if change == "remove":
        return np.delete(x, i, 0), np.delete(y, i)
    return np.insert(x, i, [50.0, -50.0], 0), np.insert(y, i, 1)


@pytest.mark.parametrize(
    "kind,change,teachers_moved",
    [("hash", "remove", 1), ("hash", "add", 1), ("hash", "replace", 2),
     ("permutation", "replace", 1)],
)  # fmt: skip
def test_one_example_changes_at_most_one_teachers_vote(kind, change, teachers_moved):
    """Each partition is built from its own training set (the neighbour's is not reused);
    at most the teachers the partition's neighbour relation allows change their votes, and
    each changed teacher moves the histogram by at most L1 2 and its maximum by 1."""
    rng = np.random.default_rng(6)
    k, n, teachers = 3, 120, 8
    y = rng.integers(0, k, n)
    x = rng.normal(size=(n, 2)) + 3 * np.eye(3)[y][:, :2]
    queries = rng.normal(size=(200, 2)) * 3

    def part(x, y):
        return (
            hash_partition(x, y, teachers, 0) if kind == "hash" else partition(len(y), teachers, 0)
        )

    preds, hist = _votes(x, y, queries, part(x, y), teachers, k)
    for i in range(0, n, 7):
        x2, y2 = _neighbour(x, y, i, change)
        preds2, hist2 = _votes(x2, y2, queries, part(x2, y2), teachers, k)
        changed = np.flatnonzero((preds != preds2).any(axis=1))
        assert len(changed) <= teachers_moved
        assert np.abs(hist - hist2).sum(axis=1).max() <= 2 * teachers_moved
        assert np.abs(hist.max(1) - hist2.max(1)).max() <= teachers_moved


# ------------------------------------------------------------------- pools
def test_public_pool_never_overlaps_evaluation():
    for n, m in [(10000, 9000), (10000, 1), (1797, 500)]:
        pub, ev = public_split(n, m)
        assert len(pub) == m and not set(pub) & set(ev)
        assert sorted(np.concatenate([pub, ev]).tolist()) == list(range(n))
    with pytest.raises(ValueError, match="public_size"):
        public_split(100, 100)


# ------------------------------------------------- data-independent accounting
def _renyi_gaussian(mu: float, alpha: float) -> float:
    """D_alpha(N(mu, 1) || N(0, 1)) by quadrature (independent of any closed form)."""

    def integrand(x):
        return math.exp(alpha * stats.norm.logpdf(x, mu) + (1 - alpha) * stats.norm.logpdf(x))

    val, _ = integrate.quad(integrand, -40 - alpha * mu, 40 + alpha * mu, limit=200)
    return math.log(val) / (alpha - 1)


@pytest.mark.parametrize("sigma,k", [(40.0, 100), (10.0, 7), (5.0, 1)])
def test_gnmax_rdp_matches_a_numeric_composed_gaussian(sigma, k):
    """k answered GNMax(sigma) queries = one Gaussian with mean shift sqrt(2k)/sigma."""
    ledger = PateLedger(delta=1e-5)
    for _ in range(k):
        ledger.record(GNMax(sigma).worst_case(), np.array([5.0, 5.0]), True)
    mu = math.sqrt(2 * k) / sigma
    for j in [0, 10, 40, len(ORDERS) - 20]:
        a = float(ORDERS[j])
        assert ledger.rdp[j] == pytest.approx(_renyi_gaussian(mu, a), rel=1e-4, abs=1e-9)
        assert ledger.rdp[j] == pytest.approx(k * a / sigma**2, rel=1e-12)


def test_gnmax_epsilon_is_never_below_the_exact_gaussian_epsilon():
    """The RDP epsilon upper-bounds the exact (eps, delta) curve of the Gaussian (Balle-Wang)."""
    sigma, k, delta = 40.0, 300, 1e-5
    ledger = PateLedger(delta=delta)
    for _ in range(k):
        ledger.record(GNMax(sigma).worst_case(), np.zeros(10), True)
    eps, mu = ledger.epsilon(), math.sqrt(2 * k) / sigma
    exact_delta = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(
        -eps / mu - mu / 2
    )
    assert exact_delta <= delta
    assert eps < 1.5 * _exact_eps(mu, delta)  # and not absurdly loose
    # same value as the training ledger's accountant (z = sigma / sqrt 2, q = 1), same conversion
    assert eps <= epsilon_for([(sigma / math.sqrt(2), 1.0, k)], delta) + 1e-9
    assert eps == pytest.approx(epsilon_for([(sigma / math.sqrt(2), 1.0, k)], delta), rel=0.02)


def _exact_eps(mu, delta):
    from scipy.optimize import brentq

    def d(e):
        return (
            stats.norm.cdf(-e / mu + mu / 2)
            - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
            - delta
        )

    return brentq(d, 0.0, 100.0)


def test_threshold_check_charged_on_every_query():
    agg = ConfidentGNMax(sigma1=100.0, sigma2=40.0, threshold=1e9)  # never answers
    ledger, rng = PateLedger(delta=1e-5), np.random.default_rng(0)
    for _ in range(50):
        counts = np.array([200.0, 50.0])
        ans = agg(counts, rng)
        ledger.record(ans.records, counts, ans.label is not None)
    assert ledger.answered == 0 and ledger.queries == 50
    assert ledger.rdp == pytest.approx(50 * ORDERS / (2 * 100.0**2))
    assert ledger.epsilon() > 0


def test_laplace_rdp_is_pure_dp_bound():
    (rec,) = LNMax(scale=20.0).worst_case()
    eps0 = 2 / 20.0
    assert record_rdp(rec) == pytest.approx(np.minimum(eps0, ORDERS * eps0**2 / 2))


def test_budget_filter_stops_before_the_target():
    agg, ledger, rng = GNMax(40.0), PateLedger(delta=1e-5, budget=2.0), np.random.default_rng(0)
    while ledger.can_ask(agg.worst_case()):
        counts = np.array([100.0, 150.0])
        ledger.record(agg(counts, rng).records, counts, True)
    assert ledger.epsilon() <= 2.0
    over = PateLedger.from_state_dict(ledger.state_dict())
    over.record(agg.worst_case(), np.array([1.0, 2.0]), True)
    assert over.epsilon() > 2.0  # one more query would have exceeded it


# --------------------------------------------------- data-dependent accounting
def _paper_theorem6(q, sigma, alpha):
    """Theorem 6 / Proposition 7 of Papernot et al. 2018, written out without logs."""
    mu2 = sigma * math.sqrt(math.log(1 / q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / sigma**2, mu2 / sigma**2
    cond = q <= math.exp((mu2 - 1) * e2) / ((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1))) ** mu2
    if not (cond and mu2 > 1 and alpha < mu1 and q * math.exp(e2) < 1):
        return alpha / sigma**2
    a = (1 - q) / (1 - (q * math.exp(e2)) ** ((mu2 - 1) / mu2))
    b = math.exp(e1) / q ** (1 / (mu1 - 1))
    dd = math.log((1 - q) * a ** (alpha - 1) + q * b ** (alpha - 1)) / (alpha - 1)
    return min(dd, alpha / sigma**2)


HISTOGRAMS = [
    [240, 5, 5, 0, 0, 0, 0, 0, 0, 0],  # near-unanimous (MNIST-like)
    [150, 80, 20, 0, 0, 0, 0, 0, 0, 0],
    [126, 124, 0, 0, 0, 0, 0, 0, 0, 0],  # close call: the bound falls back
    [30, 25, 25, 25, 25, 25, 25, 20, 25, 25],
]


@pytest.mark.parametrize("counts", HISTOGRAMS)
@pytest.mark.parametrize("sigma", [20.0, 40.0])
def test_data_dependent_bound_matches_the_paper(counts, sigma):
    counts = np.asarray(counts, dtype=float)
    gaps = counts.max() - np.sort(counts)[:-1]
    q = min(0.5 * special.erfc(gaps / (2 * sigma)).sum(), 1 - 1 / len(counts))
    assert math.exp(log_q_gnmax(counts, sigma)) == pytest.approx(q, rel=1e-9)
    ours = rdp_gnmax_data_dependent(log_q_gnmax(counts, sigma), sigma)
    for j, a in enumerate(ORDERS):
        assert ours[j] == pytest.approx(_paper_theorem6(q, sigma, float(a)), rel=1e-6, abs=1e-12)
    assert (ours <= ORDERS / sigma**2 + 1e-15).all()  # the min rule: never above data-independent


def test_data_dependent_epsilon_is_reported_apart_and_smaller_when_votes_agree():
    ledger, agg, rng = PateLedger(delta=1e-5), GNMax(40.0), np.random.default_rng(0)
    for _ in range(200):
        counts = np.array(HISTOGRAMS[0], dtype=float)
        ledger.record(agg(counts, rng).records, counts, True)
    assert ledger.epsilon_data_dependent() < ledger.epsilon()
    assert (ledger.rdp_data_dependent <= ledger.rdp + 1e-12).all()
    close = PateLedger(delta=1e-5)
    for _ in range(200):
        close.record(agg.worst_case(), np.array([126.0, 124.0]), True)
    assert close.epsilon_data_dependent() == pytest.approx(close.epsilon())


def test_a_reserved_release_is_in_every_epsilon_and_the_budget():
    """The smooth-sensitivity release's cost (reserved from the start) is charged in the
    data-independent epsilon, the data-dependent one, and the budget filter."""
    from dpsub.pate.smooth import gnss_rdp

    agg, reserve = GNMax(40.0), gnss_rdp(0.02, 8.0, ORDERS)
    plain = PateLedger(delta=1e-5, budget=2.0)
    held = PateLedger(delta=1e-5, budget=2.0, rdp_reserved=reserve)
    for ledger in (plain, held):
        while ledger.can_ask(agg.worst_case()):
            ledger.record(agg.worst_case(), np.array([240.0, 5, 5]), True)
    assert held.queries < plain.queries  # the release's share of the budget
    assert held.epsilon() <= 2.0 + 1e-9
    assert held.epsilon() == pytest.approx(epsilon_of(held.rdp + reserve))
    assert held.epsilon_data_dependent() == pytest.approx(
        epsilon_of(held.rdp_data_dependent + reserve)
    )
    again = PateLedger.from_state_dict(held.state_dict())
    assert np.array_equal(again.rdp_reserved, held.rdp_reserved)


def epsilon_of(rdp):
    from dpsub.privacy.accountants import rdp_to_epsilon

    return rdp_to_epsilon(rdp, 1e-5, ORDERS)
