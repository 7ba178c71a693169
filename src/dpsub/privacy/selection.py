"""Private selection: the cost of releasing the best of a random number of private runs.

Hyper-parameter tuning on private data leaks through the choice it makes (Papernot and
Steinke, "Hyperparameter tuning with Renyi differential privacy", ICLR 2022). Their
remedy, implemented here: run a private algorithm M a **random** number of times K, each
run on hyper-parameters drawn independently of the data, and release only the run with the
best *private* score. If M is (lambda, eps(lambda))-RDP, the selection is RDP with

- K ~ truncated negative binomial (shape eta >= 0; eta = 1 geometric, eta = 0
  logarithmic), their Theorem 2, for every lambda > 1 and any order lambda_hat >= 1:
  ``eps(lambda) + (1 + eta)(1 - 1/lambda_hat) eps(lambda_hat)
  + (1 + eta) log(1/gamma) / lambda_hat + log E[K] / (lambda - 1)``;
- K ~ Poisson(mu), their Theorem 6: ``eps(lambda) + mu * delta_hat + log mu / (lambda - 1)``,
  where M is (eps_hat, delta_hat)-DP at ``exp(eps_hat) = 1 + 1 / (lambda - 1)``.

A fixed number of runs (the usual grid) has no such bound: it costs K-fold composition,
and only if every run's score is private. M here is "train privately, then score the
model with Gaussian noise on a count" (:func:`gaussian_rdp`), composed. RDP grows with
the order, so each order's bound is also capped by the bounds of higher orders.
The numbers are checked against an independent implementation's (tests/unit/
test_selection.py) and against the exact Renyi divergence of small selections.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dpsub.privacy.accountants import DEFAULT_ORDERS, rdp_to_epsilon

__all__ = [
    "Repetitions",
    "gaussian_rdp",
    "rdp_to_delta",
    "repeat_and_select_rdp",
    "selection_epsilon",
]


@dataclass(frozen=True)
class Repetitions:
    """The law of the number of runs K: Poisson (``shape=inf``) or the truncated negative
    binomial of shape ``eta >= 0`` (1: geometric, 0: logarithmic), given by its mean
    (>= 1). ``gamma``: the truncated negative binomial's stopping probability."""

    mean: float
    shape: float = math.inf

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and self.mean >= 1):
            raise ValueError(f"repetitions.mean: must be a finite number >= 1, got {self.mean}")
        if math.isnan(self.shape) or self.shape < 0:
            raise ValueError(f"repetitions.shape: must be >= 0 or inf, got {self.shape}")

    @property
    def poisson(self) -> bool:
        return math.isinf(self.shape)

    @cached_property
    def gamma(self) -> float:
        """The stopping probability whose mean is at least ``mean`` (bisection; the
        analysis and the sampler use this gamma and its own mean, :meth:`expected`)."""
        if self.poisson:
            raise ValueError("repetitions: a Poisson law has no gamma")
        if self.shape == 1:
            return 1 / self.mean
        lo, hi = 0.0, 1.0  # mean(lo) = inf >= mean >= mean(hi) = 1
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _tnb_mean(mid, self.shape) >= self.mean else (lo, mid)
        return lo

    def expected(self) -> float:
        """E[K] of the law actually sampled."""
        return self.mean if self.poisson else _tnb_mean(self.gamma, self.shape)

    def pmf(self, k: int) -> float:
        if self.poisson:
            return math.exp(k * math.log(self.mean) - self.mean - math.lgamma(k + 1))
        if k < 1:
            return 0.0
        g, eta = self.gamma, self.shape
        if g >= 1:  # mean 1: one run
            return float(k == 1)
        if eta == 0:  # logarithmic
            return math.exp(k * math.log1p(-g) - math.log(k * math.log(1 / g)))
        # (1 - g)^k / (g^-eta - 1) * prod_{j < k} (j + eta) / (j + 1)
        log_p = k * math.log1p(-g) - math.log(g**-eta - 1)
        return math.exp(log_p + math.lgamma(k + eta) - math.lgamma(eta) - math.lgamma(k + 1))

    def sample(self, u: float) -> int:
        """K from one uniform ``u`` in [0, 1) (inverse CDF; where rounding leaves the
        summed pmf short of ``u``, the draw stops once the remaining mass is below 1e-30)."""
        k, cdf = (0, 0.0) if self.poisson else (1, 0.0)
        while True:
            p = self.pmf(k)
            cdf += p
            if u < cdf or (k > self.expected() and p < 1e-30):
                return k
            k += 1


def _tnb_mean(gamma: float, eta: float) -> float:
    if gamma >= 1:
        return 1.0
    if gamma <= 0:
        return math.inf
    if eta == 0:  # logarithmic
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 / gamma - 1) / (1 - gamma**eta)


def gaussian_rdp(sigma: float, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of one Gaussian release of a sensitivity-1 statistic (a count of held-out
    examples the model classifies correctly) with noise std ``sigma``."""
    if not sigma > 0:
        raise ValueError(f"score_sigma: must be > 0, got {sigma}")
    return np.asarray(orders, dtype=np.float64) / (2 * sigma**2)


def rdp_to_delta(rdp, epsilon: float, orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    """delta at ``epsilon`` of an RDP curve: the smaller of the conversion that
    :func:`rdp_to_epsilon` inverts (Canonne, Kamath and Steinke 2020) and
    Bretagnolle-Huber's bound on total variation, ``sqrt(1 - exp(-D_KL))``."""
    best = 0.0  # log(1)
    for a, r in zip(orders, np.asarray(rdp, dtype=np.float64), strict=True):
        if a <= 1 or not math.isfinite(r):
            continue
        log_d = (a - 1) * (r - epsilon + math.log1p(-1 / a)) - math.log(a)
        if r < 700:
            log_d = min(log_d, 0.5 * math.log1p(-math.exp(-r)) if r > 0 else -math.inf)
        best = min(best, log_d)
    return math.exp(best)


def repeat_and_select_rdp(
    rdp, repetitions: Repetitions, orders: Sequence[float] = DEFAULT_ORDERS, capped: bool = True
) -> np.ndarray:
    """RDP of releasing the best of K runs of a mechanism with RDP curve ``rdp``
    (over ``orders``), K drawn from ``repetitions`` (the module's docstring); ``capped``:
    each order's bound also capped by the higher orders' (:func:`_monotone`)."""
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"rdp: {r.shape[0]} values for {a.shape[0]} orders")
    out = np.full_like(a, np.inf)
    live = a > 1
    log_mean = math.log(repetitions.expected())
    if repetitions.poisson:
        for i in np.flatnonzero(live):
            d_hat = rdp_to_delta(r, math.log1p(1 / (a[i] - 1)), a)
            out[i] = r[i] + repetitions.mean * d_hat + log_mean / (a[i] - 1)
    else:
        eta, gamma = repetitions.shape, repetitions.gamma
        usable = a >= 1
        const = (1 + eta) * np.min((1 - 1 / a[usable]) * r[usable] - math.log(gamma) / a[usable])
        out[live] = r[live] + log_mean / (a[live] - 1) + const
    return out if not capped else _monotone(a, out)


def _monotone(orders: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """RDP is non-decreasing in the order (van Erven and Harremoes 2014, Theorem 3): each
    order's bound is also bounded by every higher order's."""
    order = np.argsort(orders)
    capped = np.minimum.accumulate(bound[order][::-1])[::-1]
    out = np.empty_like(bound)
    out[order] = capped
    return out


def selection_epsilon(
    run_rdp, repetitions: Repetitions, delta: float, score_sigma: float,
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> float:  # fmt: skip
    """epsilon at ``delta`` of the best of K private runs, each a training run with RDP
    curve ``run_rdp`` followed by a Gaussian score of noise ``score_sigma``."""
    base = np.asarray(run_rdp, dtype=np.float64) + gaussian_rdp(score_sigma, orders)
    return rdp_to_epsilon(repeat_and_select_rdp(base, repetitions, orders), delta, orders)
