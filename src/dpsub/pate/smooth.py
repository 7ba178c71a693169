"""Releasing PATE's data-dependent epsilon with smooth sensitivity (torch-free).

Papernot et al. 2018 ("Scalable Private Learning with PATE", section 4 and appendix)
make the data-dependent privacy cost itself a private release: at one Renyi order
``lambda`` the cost ``f(D)`` (the ledger's data-dependent RDP at that order) is published
as ``f(D) + SS_beta(D) * sigma * N(0, 1)``, where ``SS_beta`` is a beta-smooth upper bound
on the local sensitivity of ``f`` (the paper's "GNSS" mechanism). That release has an RDP
curve of its own (:func:`gnss_rdp`: a bound derived here from the Gaussian Renyi divergence,
larger than the paper's closed form, which undercounts near the top of its order range),
charged like any other release (:mod:`dpsub.pate.accounting`) from the start of the run.

The sensitivity, in dpsub's words (the idea is the paper's; the way the bound is computed
is ours and assumes less):

* A query's data-dependent cost at ``lambda`` is ``B(q)``, a function of Proposition 7's
  bound ``q`` on the probability of a non-plurality answer. Write ``q`` through its
  *equivalent gap* ``x``: ``q = (K-1)/2 erfc(x)`` (all K-1 runners-up at the same gap
  ``2 sigma x``). One teacher changing its vote moves every gap by at most 2 (also when the
  plurality changes), and since ``y -> erfc(erfcinv(y) -+ 1/sigma)`` is concave / convex,
  Jensen's inequality keeps ``x`` within ``1/sigma`` of where it was. After k such changes,
  ``x`` is within ``k / sigma``; it always lies in ``[0, n / (2 sigma)]`` (n teachers).
* ``B`` is non-increasing in ``x`` (the paper's condition C5; checked on a fine grid for the
  run's sigma, order and K, and refused when it fails). Then on a grid of step
  ``1 / (sigma r)`` the largest change of ``B`` between two neighbours whose ``x`` lies in a
  cell is bounded from the grid values alone (:func:`bound_grid`), and the local sensitivity
  at distance k of a query at ``x`` is bounded by the largest cell value within ``k / sigma``
  of ``x`` (:func:`local_sensitivities`). Summed over the answered queries (one changed
  training example changes one teacher, so every histogram moves one step at once) this is
  ``A(k)``; ``SS_beta = max_k e^(-beta k) A(k)`` (:func:`smooth_sensitivity`). Because each
  query's cell index moves by at most r per step, ``A`` of a neighbour at k + 1 covers
  ``A`` at k, which is what makes ``SS_beta`` beta-smooth.

The paper bounds the same quantities with vote-moving searches and checks two conditions
(C5, C6) numerically; here only the monotonicity of ``B`` is assumed (and checked), at the
price of a somewhat larger bound (within a factor of about 1.5 of the paper's on MNIST-like
histograms). The tests compare ``A(k)`` with a brute force over every histogram of a few
teachers.

Only the GNMax step of an answered query has a data-dependent cost here; the
Confident-GNMax threshold check is charged data-independently (a constant: no
sensitivity). ``SS_beta`` and ``f(D)`` are private: neither is written anywhere, only the
noisy release and its cost.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from dpsub.pate.accounting import log_q_sums, rdp_gnmax_data_dependent

#: grid cells per 1/sigma of equivalent gap (even: the grid ends exactly at n / (2 sigma))
CELLS = 16


@dataclass(frozen=True)
class BoundGrid:
    """``bound[j] = B(x_j)`` at ``x_j = j * step`` and the per-cell local-sensitivity bounds."""

    step: float
    cells_per_vote: int
    bound: np.ndarray
    cell: np.ndarray


def _bound_at(x: np.ndarray, sigma: float, order: float, num_classes: int) -> np.ndarray:
    """B at equivalent gaps ``x``: Theorem 6 at ``q = (K-1)/2 erfc(x)`` (capped as the ledger)."""
    cap = math.log1p(-1.0 / num_classes)
    log_q = np.minimum(math.log(num_classes - 1) + special.log_ndtr(-math.sqrt(2.0) * x), cap)
    orders = np.array([order])
    return np.array([rdp_gnmax_data_dependent(float(lq), sigma, orders)[0] for lq in log_q])


@functools.lru_cache(maxsize=16)
def bound_grid(sigma: float, order: float, num_classes: int, teachers: int) -> BoundGrid:
    """The grid of B and of its cells' sensitivity bounds; ValueError when B is not
    non-increasing in the equivalent gap (a finer grid is checked too)."""
    r = CELLS
    n_cells = teachers * r // 2
    step = 1.0 / (sigma * r)
    fine = _bound_at(np.arange(4 * n_cells + 1) * step / 4, sigma, order, num_classes)
    if np.any(np.diff(fine) > 1e-12 * max(1.0, float(fine.max()))):
        raise ValueError(
            f"the data-dependent bound at order {order} is not monotone in q for sigma2 "
            f"{sigma} and {num_classes} classes (the paper's condition C5): choose another order"
        )
    b = fine[::4]
    j = np.arange(n_cells)
    up = b[np.maximum(j - r, 0)] - b[j + 1]  # the neighbour's gap 1/sigma smaller
    down = b[j] - b[np.minimum(j + 1 + r, n_cells)]  # or 1/sigma larger
    return BoundGrid(step, r, b, np.maximum(np.maximum(up, down), 0.0))


def equivalent_gaps(counts: np.ndarray, sigma: float) -> np.ndarray:
    """Per row of ``counts``, ``x`` with ``(K-1)/2 erfc(x)`` = Proposition 7's (uncapped) q."""
    log_q = log_q_sums(counts, sigma) - math.log(np.shape(counts)[1] - 1)
    return np.maximum(-special.ndtri_exp(np.minimum(log_q, 0.0)) / math.sqrt(2.0), 0.0)


def local_sensitivities(counts: np.ndarray, sigma: float, grid: BoundGrid) -> np.ndarray:
    """``A(k)``, k = 0..n: the summed bounds on the local sensitivity at distance k of the
    data-dependent cost of the queries whose vote histograms are the rows of ``counts``."""
    counts = np.asarray(counts, dtype=np.float64)
    teachers = int(round(counts[0].sum())) if len(counts) else 0
    n_cells = len(grid.cell)
    total = np.zeros(teachers + 1)
    if not len(counts):
        return total
    x = equivalent_gaps(counts, sigma)
    start = np.minimum((x / grid.step).astype(np.int64), n_cells - 1)
    reach = np.arange(teachers + 1) * grid.cells_per_vote  # cells within k / sigma
    for j0, times in zip(*np.unique(start, return_counts=True), strict=True):
        left = np.maximum.accumulate(grid.cell[j0::-1])
        right = np.maximum.accumulate(grid.cell[j0:])
        per_query = np.maximum(
            left[np.minimum(reach, j0)], right[np.minimum(reach, n_cells - 1 - j0)]
        )
        total += times * per_query
    return total


def smooth_sensitivity(local: np.ndarray, beta: float) -> float:
    """``max_k e^(-beta k) A(k)``: ``A`` is constant beyond k = n (every histogram is in reach)."""
    return float(np.max(np.exp(-beta * np.arange(len(local))) * local))


def gnss_rdp(beta: float, sigma: float, orders) -> np.ndarray:
    """RDP of ``f + SS_beta * sigma * N(0, 1)`` at ``orders`` (inf where it is unbounded).

    Between neighbours D, D' the two releases are Gaussians with means ``|f(D) - f(D')| <=
    min(SS(D), SS(D'))`` apart and stds ``SS * sigma`` in a ratio ``t`` within ``[e^-beta,
    e^beta]``. Scaling SS(D) to 1, the Renyi divergence of N(0, sigma^2) from N(m, t^2
    sigma^2), ``m = min(1, t)``, is ``ln t + ln(t^2 / v) / (2(a-1)) + a m^2 / (2 sigma^2 v)``
    with ``v = a t^2 - (a-1)`` (both directions are this family, t <-> 1/t). For t <= 1 each
    term is largest at t = e^-beta (ln t <= 0 dropped); for t >= 1 the sum is at most
    ``beta + a / (2 sigma^2)``. The larger of the two bounds all pairs; unbounded once
    ``v(e^-beta) <= 0``, i.e. a >= 1 / (1 - e^(-2 beta)) (about 1 / (2 beta)).

    The paper's closed form ``a e^(2 beta) / sigma^2 + (beta a - ln(1 - 2 beta a) / 2) / (a - 1)``
    is smaller than this divergence for the pair t = e^-beta, m = t near the top of its range
    (e.g. 0.389 against 0.715 at a = 20, beta = 0.02, sigma = 8: tests/unit/test_pate_smooth.py),
    so dpsub charges the bound above instead.
    """
    a = np.asarray(orders, dtype=np.float64)
    out = np.full(a.shape, np.inf)
    shrink = math.exp(-2.0 * beta)
    ok = (a > 1) & (a * shrink - (a - 1) > 0)
    b = a[ok]
    v = b * shrink - (b - 1)
    narrow = np.log(shrink / v) / (2 * (b - 1)) + b * shrink / (2 * sigma**2 * v)
    wide = beta + b / (2 * sigma**2)
    out[ok] = np.maximum(narrow, wide)
    return out


def max_order(beta: float) -> float:
    """The release's RDP is finite for orders below this (:func:`gnss_rdp`)."""
    return 1.0 / (1.0 - math.exp(-2.0 * beta))


@dataclass(frozen=True)
class Release:
    """What is published: the noisy data-dependent RDP at ``order`` and the release's cost."""

    order: float
    beta: float
    sigma: float
    rdp_released: float
    rdp_cost: float
    epsilon: float

    def as_dict(self) -> dict:
        return {"mechanism": "smooth_sensitivity", **self.__dict__}


def release(answered_counts, teachers: int, rdp_at_order: float, public_range, sigma2: float,
            opts, delta: float, rng: np.random.Generator) -> Release:  # fmt: skip
    """The paper's release of the data-dependent cost ``rdp_at_order`` (private) of the
    queries whose private vote histograms are ``answered_counts`` (the answered GNMax ones).

    ``opts``: order, beta, sigma. ``public_range``: (lowest, highest) value the cost can
    take whatever the votes (its data-independent parts; the data-independent total): the
    noisy value is clipped into it (post-processing). The reported epsilon converts the
    released RDP plus the release's own cost at ``order``."""
    from dpsub.privacy.accountants import rdp_to_epsilon

    order, beta, sigma = float(opts["order"]), float(opts["beta"]), float(opts["sigma"])
    ss = 0.0
    if len(answered_counts):
        grid = bound_grid(sigma2, order, np.shape(answered_counts)[1], teachers)
        ss = smooth_sensitivity(local_sensitivities(answered_counts, sigma2, grid), beta)
    noisy = float(np.clip(rdp_at_order + ss * sigma * rng.normal(), *public_range))
    cost = float(gnss_rdp(beta, sigma, [order])[0])
    eps = rdp_to_epsilon(np.array([noisy + cost]), delta, [order])
    return Release(order, beta, sigma, noisy, cost, eps)
