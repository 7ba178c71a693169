"""From attack outcomes to epsilon: the statistics of an audit (numpy/scipy only).

Three estimators, all at the run's delta:

* :func:`clopper_pearson_epsilon`: a *valid* lower bound. A test that says "canary in"
  when the score is at least a threshold has false-positive and false-negative rates
  (FPR, FNR); any (epsilon, delta)-DP mechanism satisfies ``FPR + e^eps FNR >= 1 - delta``
  and ``FNR + e^eps FPR >= 1 - delta`` (Kairouz et al. 2015), so
  ``eps >= log((1 - delta - FPR) / FNR)`` and the same with the rates swapped. With
  Clopper-Pearson upper bounds of both rates (each at confidence ``1 - alpha/2``, so the
  pair holds with probability ``>= 1 - alpha``) the bound holds with that confidence.
  The threshold is chosen on one half of the trials and the rates are counted on the
  other half (:func:`split_threshold_bound`): choosing it on the trials it is evaluated on
  would bias the bound upwards.
* :func:`gdp_fit` / :func:`gdp_epsilon`: the Gaussian trade-off fit of tight-auditing work
  (Nasr et al. 2023): ``mu = (mean_in - mean_out) / pooled std`` of the scores, and the
  epsilon that mu-GDP implies at delta (Dong, Roth, Su 2019, Corollary 2.13). An
  estimate, not a bound.
* :func:`one_run_epsilon`: Steinke, Nasr and Jagielski (NeurIPS 2023), the bound from the
  number of correct guesses about m canaries each included with probability 1/2.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, special, stats

__all__ = [
    "RateBound",
    "clopper_pearson_epsilon",
    "clopper_pearson_upper",
    "epsilon_from_rates",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_fit",
    "one_run_epsilon",
    "one_run_p_value",
    "split_threshold_bound",
]


# ------------------------------------------------------------ Clopper-Pearson
def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided upper confidence bound (level ``1 - alpha``) of a binomial rate, k of n."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def epsilon_from_rates(fpr: float, fnr: float, delta: float) -> float:
    """``max(log((1-delta-FPR)/FNR), log((1-delta-FNR)/FPR), 0)``: what the rates force."""
    best = 0.0
    for a, b in ((fpr, fnr), (fnr, fpr)):
        num = 1.0 - delta - a
        if num <= 0:
            continue
        best = max(best, math.inf if b <= 0 else math.log(num / b))
    return best


def clopper_pearson_epsilon(
    false_pos: int, n_out: int, false_neg: int, n_in: int, delta: float, alpha: float = 0.05
) -> float:
    """Epsilon lower bound at confidence ``1 - alpha`` from the counts of one fixed test."""
    fpr = clopper_pearson_upper(false_pos, n_out, alpha / 2)
    fnr = clopper_pearson_upper(false_neg, n_in, alpha / 2)
    return epsilon_from_rates(fpr, fnr, delta)


@dataclass(frozen=True)
class RateBound:
    """The valid bound of a threshold test and how it was obtained."""

    epsilon: float  # lower bound at confidence 1 - alpha (0: nothing shown)
    alpha: float
    threshold: float  # "in" when score >= threshold (chosen on the selection half)
    false_pos: int  # counted on the evaluation half
    false_neg: int
    n_out: int
    n_in: int

    def as_dict(self) -> dict:
        return asdict(self)


def _upper(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """Vectorized :func:`clopper_pearson_upper`."""
    k = np.asarray(k, np.float64)
    out = np.ones_like(k)
    ok = k < n
    out[ok] = stats.beta.ppf(1 - alpha, k[ok] + 1, n - k[ok])
    return out


def _best_threshold(s_in, s_out, delta: float, alpha: float, candidates: int = 4096) -> float:
    """The threshold (a quantile of the scores) whose Clopper-Pearson bound is largest."""
    both = np.concatenate([s_in, s_out])
    tail = np.geomspace(1e-7, 0.5, candidates // 4)
    qs = np.concatenate([np.linspace(0, 1, candidates // 2), tail, 1 - tail])
    ts = np.unique(np.quantile(both, qs))
    a_in, a_out = np.sort(s_in), np.sort(s_out)
    fn = np.searchsorted(a_in, ts, side="left")  # in-scores below t: missed
    fp = len(a_out) - np.searchsorted(a_out, ts, side="left")  # out-scores >= t
    fpr, fnr = _upper(fp, len(a_out), alpha / 2), _upper(fn, len(a_in), alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.log(np.clip(1 - delta - fpr, 0, None) / fnr)
        e2 = np.log(np.clip(1 - delta - fnr, 0, None) / fpr)
    eps = np.nan_to_num(np.maximum(e1, e2), nan=-np.inf)
    return float(ts[int(np.argmax(eps))])


def split_threshold_bound(
    s_in: np.ndarray,
    s_out: np.ndarray,
    delta: float,
    alpha: float = 0.05,
    rng: np.random.Generator | None = None,
) -> RateBound:
    """Threshold chosen on a random half of each score set, rates counted on the other.

    The evaluation half never influences the threshold, so the Clopper-Pearson bound on
    it is valid at confidence ``1 - alpha`` (no selection bias).
    """
    rng = rng or np.random.default_rng(0)
    s_in, s_out = rng.permutation(np.asarray(s_in)), rng.permutation(np.asarray(s_out))
    hi, ho = len(s_in) // 2, len(s_out) // 2
    # selected at a stricter level (alpha / 10): it favours thresholds with more errors on
    # both sides, whose rates carry over to the other half (any rule keeps the bound valid)
    t = _best_threshold(s_in[:hi], s_out[:ho], delta, alpha / 10)
    ev_in, ev_out = s_in[hi:], s_out[ho:]
    fp = int((ev_out >= t).sum())
    fn = int((ev_in < t).sum())
    eps = clopper_pearson_epsilon(fp, len(ev_out), fn, len(ev_in), delta, alpha)
    return RateBound(eps, alpha, t, fp, fn, len(ev_out), len(ev_in))


# ----------------------------------------------------------------- mu-GDP
def gdp_fit(s_in: np.ndarray, s_out: np.ndarray) -> float:
    """``mu = (mean_in - mean_out) / sqrt((var_in + var_out) / 2)`` of the scores (>= 0)."""
    s_in, s_out = np.asarray(s_in, np.float64), np.asarray(s_out, np.float64)
    pooled = math.sqrt((s_in.var(ddof=1) + s_out.var(ddof=1)) / 2)
    if pooled == 0:
        return math.inf if s_in.mean() != s_out.mean() else 0.0
    return max(0.0, float(s_in.mean() - s_out.mean()) / pooled)


def gdp_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    if mu <= 0:
        return 0.0
    a, b = -eps / mu + mu / 2, -eps / mu - mu / 2
    # e^eps Phi(b) in logs (Phi(b) underflows long before e^eps overflows)
    return float(special.ndtr(a) - math.exp(eps + special.log_ndtr(b)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest eps with ``delta(eps) <= delta`` for mu-GDP (0 if mu-GDP meets delta at 0)."""
    if not math.isfinite(mu):
        return math.inf
    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(hi, mu) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-10))


# ------------------------------------------------------- one run (Steinke+)
def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Upper bound on ``P[W >= v]`` for an (eps, delta)-DP run (Steinke et al. 2023).

    m canaries, each included independently with probability 1/2; the auditor guesses
    on r of them (abstaining on the rest) and W of its guesses are correct. Their
    Theorem 5.2 (as computed by the paper's Algorithm in its appendix):
    ``P[W >= v] <= P[Bin(r, p) >= v] + 2 m delta max_{1<=i<=v} P[v-i <= Bin(r, p) < v] / i``
    with ``p = e^eps / (1 + e^eps)``, the accuracy of eps-randomized response.
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, p))  # P[Bin(r, p) >= v]
    if delta > 0 and v > 0:
        pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)  # P[Bin = v-1], ..., P[Bin = 0]
        window = np.cumsum(pmf) / np.arange(1, v + 1)  # P[v-i <= Bin < v] / i, i = 1..v
        tail += float(window.max()) * delta * 2 * m
    return min(tail, 1.0)


def one_run_epsilon(m: int, r: int, v: int, delta: float, alpha: float = 0.05) -> float:
    """The largest eps the outcome (r guesses, v correct) rejects at level alpha (bisection).

    Returns ``eps`` with ``p_value(eps) < alpha`` (within 1e-6): with confidence
    ``1 - alpha`` the run is not (eps', delta)-DP for any eps' below it; 0 if none.
    """
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < alpha:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return math.inf
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        if one_run_p_value(m, r, v, mid, delta) < alpha:
            lo = mid
        else:
            hi = mid
    return lo
