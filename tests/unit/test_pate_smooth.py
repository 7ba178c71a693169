"""PATE's smooth-sensitivity release of the data-dependent cost (dpsub.pate.smooth):
local sensitivity at distance k against a brute force over every small histogram, the
smoothness of the bound, the release's own RDP against the Gaussian Renyi divergence, and
the noise actually drawn (torch-free, fast)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpsub.pate import smooth
from dpsub.pate.accounting import log_q_gnmax, rdp_gnmax_data_dependent
from dpsub.privacy.accountants import rdp_to_epsilon


def _cost(counts, sigma, order) -> float:
    """The released function for one query: the ledger's data-dependent RDP at ``order``."""
    counts = np.asarray(counts, dtype=float)
    return float(rdp_gnmax_data_dependent(log_q_gnmax(counts, sigma), sigma, np.array([order]))[0])


def _brute_force(start, sigma, order) -> np.ndarray:
    """Exact local sensitivity at distance k = 0..n: every histogram of n votes within k
    moved votes of ``start``, each against every one-vote neighbour."""
    n, k = sum(start), len(start)
    hists = [h for h in itertools.product(range(n + 1), repeat=k) if sum(h) == n]
    cost = {h: _cost(h, sigma, order) for h in hists}

    def neighbours(h):
        for a, b in itertools.permutations(range(k), 2):
            if h[a]:
                yield tuple(h[i] - (i == a) + (i == b) for i in range(k))

    local = {h: max(abs(cost[h] - cost[g]) for g in neighbours(h)) for h in hists}
    dist = {h: sum(abs(x - y) for x, y in zip(h, start, strict=True)) // 2 for h in hists}
    return np.array([max(local[h] for h in hists if dist[h] <= d) for d in range(n + 1)])


SMALL = [(6, 0, 0), (5, 1, 0), (4, 1, 1), (3, 3, 0), (4, 2, 0), (2, 2, 2), (3, 2, 1)]


@pytest.mark.parametrize("sigma,order", [(0.5, 2.0), (1.0, 2.0), (0.7, 3.0), (1.0, 1.5)])
def test_local_sensitivity_at_distance_k_bounds_the_brute_force(sigma, order):
    """A(k) is never below the exact local sensitivity at distance k (6 teachers, 3
    classes, every histogram), and is not vacuous: its largest value is within 1.4x of
    the exact one."""
    grid = smooth.bound_grid(sigma, order, 3, 6)
    for start in SMALL:
        ours = smooth.local_sensitivities(np.array([start]), sigma, grid)
        exact = _brute_force(start, sigma, order)
        assert (ours >= exact - 1e-12).all(), (start, ours, exact)
        assert ours.max() <= 1.4 * exact.max() + 1e-9, (start, ours.max(), exact.max())


def test_local_sensitivities_add_up_over_queries():
    grid = smooth.bound_grid(1.0, 2.0, 3, 6)
    rows = np.array([(6, 0, 0), (3, 3, 0), (6, 0, 0)])
    each = [smooth.local_sensitivities(r[None], 1.0, grid) for r in rows]
    assert np.allclose(smooth.local_sensitivities(rows, 1.0, grid), sum(each))


def test_smooth_sensitivity_is_beta_smooth_between_neighbours():
    """One teacher changing its vote: A(k) of one histogram is covered by A(k + 1) of the
    other, so SS_beta changes by at most e^beta (MNIST-sized: 250 teachers, 10 classes)."""
    rng = np.random.default_rng(0)
    sigma, beta = 40.0, 0.02
    grid = smooth.bound_grid(sigma, 10.0, 10, 250)
    for _ in range(40):
        h = rng.multinomial(250, rng.dirichlet(np.full(10, 0.3)))
        a, b = rng.choice(np.flatnonzero(h)), rng.integers(10)
        g = h.copy()
        g[a] -= 1
        g[b] += 1
        ah, ag = (smooth.local_sensitivities(x[None], sigma, grid) for x in (h, g))
        assert (ah[:-1] <= ag[1:] + 1e-15).all() and (ag[:-1] <= ah[1:] + 1e-15).all()
        ss_h, ss_g = smooth.smooth_sensitivity(ah, beta), smooth.smooth_sensitivity(ag, beta)
        assert ss_h <= math.exp(beta) * ss_g + 1e-15


def test_a_bound_that_grows_with_the_gap_is_refused(monkeypatch):
    """The analysis needs B non-increasing in the equivalent gap (the paper's C5)."""
    monkeypatch.setattr(smooth, "_bound_at", lambda x, *a: np.sin(x))
    smooth.bound_grid.cache_clear()
    with pytest.raises(ValueError, match="not monotone"):
        smooth.bound_grid(1.0, 2.0, 3, 6)
    smooth.bound_grid.cache_clear()


def _renyi(t: float, m: float, sigma: float, a: float) -> float:
    """D_a(N(0, sigma^2) || N(m, t^2 sigma^2)) by quadrature (p^a q^(1-a) is a Gaussian
    bump: the window is centred on its mode, (1-a) m / v, and spans 40 of its widths)."""
    v = a * t**2 + 1 - a
    mode, width = (1 - a) * m / v, t * sigma / math.sqrt(v)
    x = np.linspace(mode - 40 * width, mode + 40 * width, 200_001)
    log_p = -0.5 * (x / sigma) ** 2 - math.log(sigma)
    log_q = -0.5 * ((x - m) / (t * sigma)) ** 2 - math.log(t * sigma)
    g = a * log_p + (1 - a) * log_q - 0.5 * math.log(2 * math.pi)
    top = g.max()
    return (math.log(np.trapezoid(np.exp(g - top), x)) + top) / (a - 1)


@pytest.mark.parametrize("beta,sigma", [(0.02, 8.0), (0.05, 3.0), (0.01, 2.0)])
def test_release_rdp_bounds_every_pair_the_smoothness_allows(beta, sigma):
    """Scaling SS(D) to 1: SS(D') = t in [e^-beta, e^beta], means at most min(1, t) apart;
    the Renyi divergence (both directions: t <-> 1/t) never exceeds gnss_rdp."""
    for a in (2.0, 5.0, 0.9 * smooth.max_order(beta)):
        bound = smooth.gnss_rdp(beta, sigma, [a])[0]
        worst = max(_renyi(t, min(1.0, t), sigma, a) for t in np.exp(np.linspace(-beta, beta, 9)))
        assert worst <= bound + 1e-9
        assert bound <= 2 * worst + beta  # and not vacuous
    assert np.isinf(smooth.gnss_rdp(beta, sigma, [smooth.max_order(beta) + 0.1])[0])


def test_the_papers_closed_form_undercounts_near_its_range_end():
    """Why dpsub charges its own bound: at order 20, beta 0.02 (0.4 / order, in the paper's
    range), sigma 8, the paper's closed form is below an admissible pair's divergence."""
    a, beta, sigma = 20.0, 0.02, 8.0
    paper = a * math.exp(2 * beta) / sigma**2 + (beta * a - 0.5 * math.log1p(-2 * beta * a)) / (
        a - 1
    )
    t = math.exp(-beta)
    assert _renyi(t, t, sigma, a) > 1.5 * paper
    assert smooth.gnss_rdp(beta, sigma, [a])[0] >= _renyi(t, t, sigma, a)


def _mnist_like(n_queries: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = rng.binomial(250, rng.beta(20, 1.5, n_queries))
    rest = np.stack([rng.multinomial(250 - t, np.full(9, 1 / 9)) for t in top])
    return np.column_stack([top, rest]).astype(float)


def test_release_draws_noise_of_the_smooth_sensitivity_and_reports_its_cost():
    """The released RDP spreads as SS_beta * sigma (the noise actually drawn), and the
    released epsilon converts the released RDP plus the release's cost at the order."""
    counts, opts = _mnist_like(300), {"order": 10.0, "beta": 0.02, "sigma": 8.0}
    grid = smooth.bound_grid(40.0, 10.0, 10, 250)
    ss = smooth.smooth_sensitivity(smooth.local_sensitivities(counts, 40.0, grid), 0.02)
    assert ss > 0
    f = sum(_cost(c, 40.0, 10.0) for c in counts)
    draws = [
        smooth.release(counts, 250, f, (-1e9, 1e9), 40.0, opts, 1e-5, np.random.default_rng(s))
        for s in range(250)
    ]
    values = np.array([r.rdp_released for r in draws])
    assert values.std() == pytest.approx(ss * 8.0, rel=0.15)
    assert values.mean() == pytest.approx(f, abs=0.3 * ss * 8.0)
    r = draws[0]
    assert r.rdp_cost == pytest.approx(smooth.gnss_rdp(0.02, 8.0, [10.0])[0])
    assert r.epsilon == pytest.approx(
        rdp_to_epsilon(np.array([r.rdp_released + r.rdp_cost]), 1e-5, [10.0])
    )
    assert set(r.as_dict()) == {
        "mechanism",
        "order",
        "beta",
        "sigma",
        "rdp_released",
        "rdp_cost",
        "epsilon",
    }  # fmt: skip  (never SS or f)


def test_release_is_clipped_into_the_public_range():
    counts, opts = _mnist_like(50), {"order": 10.0, "beta": 0.02, "sigma": 8.0}
    for s in range(20):
        r = smooth.release(counts, 250, 0.3, (0.25, 0.4), 40.0, opts, 1e-5,
                           np.random.default_rng(s))  # fmt: skip
        assert 0.25 <= r.rdp_released <= 0.4
