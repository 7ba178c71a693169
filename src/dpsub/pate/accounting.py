"""PATE's privacy accounting: the data-independent RDP (the run's epsilon) and the
data-dependent bound of "Scalable Private Learning with PATE" (Papernot et al. 2018).

Data-independent (a guarantee). A query is charged from its noise records
(:class:`~dpsub.pate.aggregators.VoteNoise`) alone:

* gaussian (L2 sensitivity D, std s): RDP ``alpha D^2 / (2 s^2)``; GNMax (D = sqrt 2)
  gives ``alpha / sigma^2`` (the paper's Proposition 8), the Confident-GNMax threshold
  check (D = 1, the largest count) ``alpha / (2 sigma1^2)``, charged on *every* query,
  answered or not;
* laplace (L1 sensitivity D, scale b): pure ``eps0 = D / b``-DP, i.e. RDP
  ``min(eps0, alpha eps0^2 / 2)`` (Bun & Steinke 2016).

Queries compose by adding RDP curves; (eps, delta) is the project's conversion
(:func:`dpsub.privacy.accountants.rdp_to_epsilon`, Opacus' improved bound) over
:data:`ORDERS`. The budget is a filter: a query is asked only if its worst-case charge
keeps the data-independent epsilon within the target.

Data-dependent (NOT a guarantee). For each answered GNMax query, Proposition 7 bounds
``q = Pr[answer != argmax]`` from the vote gaps, and Theorem 6 turns q into an RDP bound,
taken as the minimum with the data-independent one (the paper's rule). Being a function
of the private votes, this number may itself leak: reported as it is
(``epsilon_data_dependent``, on request) the run is not covered; the 2018 paper's release
with smooth sensitivity (:mod:`dpsub.pate.smooth`, ``pate.release``) publishes it with
noise instead, and that release's own cost is reserved in the ledger (``rdp_reserved``)
from the start: in every epsilon and in the budget. It is never used for the budget.
The threshold check is charged data-independently in this bound too (the paper also has
a data-dependent bound for it; not implemented).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special, stats

from dpsub.pate.aggregators import HIST_L2, VoteNoise
from dpsub.privacy.accountants import DEFAULT_ORDERS, rdp_to_epsilon

#: Renyi orders: the project's, plus large ones where the data-dependent bound pays
ORDERS = np.array(sorted(set(DEFAULT_ORDERS) | {80.0, 100.0, 128.0, 200.0, 256.0, 512.0}))


def record_rdp(record: VoteNoise, orders: np.ndarray = ORDERS) -> np.ndarray:
    """The data-independent RDP curve of one noisy release."""
    orders = np.asarray(orders, dtype=np.float64)
    if record.kind == "gaussian":
        return orders * record.sensitivity**2 / (2.0 * record.scale**2)
    if record.kind == "laplace":
        eps0 = record.sensitivity / record.scale
        return np.minimum(eps0, orders * eps0**2 / 2.0)
    raise ValueError(f"unknown noise kind {record.kind!r}")


def log_q_gnmax(counts: np.ndarray, sigma: float) -> float:
    """Proposition 7: ln of an upper bound on Pr[GNMax(sigma) != argmax counts].

    ``q <= sum_{i != i*} Pr[N(0, 2 sigma^2) >= n_i* - n_i] = 1/2 sum erfc(gap / (2 sigma))``,
    capped at ``1 - 1/K`` (the paper's code: beyond it the bound carries no information).
    """
    counts = np.asarray(counts, dtype=np.float64)
    return float(min(log_q_sums(counts[None], sigma)[0], math.log1p(-1.0 / len(counts))))


def log_q_sums(counts: np.ndarray, sigma: float) -> np.ndarray:
    """ln of Proposition 7's sum (not capped) for every row of ``counts`` (Q, K)."""
    counts = np.asarray(counts, dtype=np.float64)
    terms = stats.norm.logsf(counts.max(1, keepdims=True) - counts, scale=math.sqrt(2.0) * sigma)
    terms[np.arange(len(counts)), counts.argmax(1)] = -np.inf  # the plurality itself
    return special.logsumexp(terms, axis=1)


def _log1mexp(x: float) -> float:
    """ln(1 - e^x) for x < 0."""
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


def rdp_gnmax_data_dependent(log_q: float, sigma: float, orders: np.ndarray = ORDERS):
    """Theorem 6 with the paper's choice ``mu2 = sigma sqrt(ln 1/q)``, ``mu1 = mu2 + 1``,
    ``eps_i = mu_i / sigma^2``; the minimum with the data-independent ``alpha / sigma^2``.

    ``eps_alpha <= 1/(alpha-1) ln((1-q) A^(alpha-1) + q B^(alpha-1))`` with
    ``A = (1-q) / (1 - (q e^eps2)^((mu2-1)/mu2))`` and ``B = e^eps1 / q^(1/(mu1-1))``, valid
    for ``alpha < mu1`` when ``q <= e^((mu2-1) eps2) / (mu1/(mu1-1) mu2/(mu2-1))^mu2``.
    """
    orders = np.asarray(orders, dtype=np.float64)
    var = sigma**2
    out = orders / var
    if log_q >= 0:
        return out
    mu2 = math.sqrt(var * -log_q)
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / var, mu2 / var
    mask = (orders < mu1) & (mu2 > 1.0)
    if not mask.any() or -log_q <= eps2:
        return out
    limit = (mu2 - 1) * eps2 - mu2 * (math.log(mu1 / (mu1 - 1)) + math.log(mu2 / (mu2 - 1)))
    if log_q > limit:
        return out
    log_1mq = _log1mexp(log_q)
    log_a = log_1mq - _log1mexp((log_q + eps2) * (1.0 - 1.0 / mu2))
    log_b = eps1 - log_q / (mu1 - 1.0)
    lam = orders[mask] - 1.0
    log_s = np.logaddexp(log_1mq + lam * log_a, log_q + lam * log_b)
    out[mask] = np.minimum(out[mask], log_s / lam)
    return out


@dataclass
class PateLedger:
    """The queries' composed RDP, data-independent (the guarantee) and data-dependent."""

    delta: float
    budget: float = math.inf
    queries: int = 0
    answered: int = 0
    rdp: np.ndarray = field(default_factory=lambda: np.zeros(len(ORDERS)))
    rdp_data_dependent: np.ndarray = field(default_factory=lambda: np.zeros(len(ORDERS)))
    #: releases made after the queries (the smooth-sensitivity release of the data-dependent
    #: cost, :mod:`dpsub.pate.smooth`): charged from the start, in every epsilon and the budget
    rdp_reserved: np.ndarray = field(default_factory=lambda: np.zeros(len(ORDERS)))

    def _charge(self, records) -> np.ndarray:
        return sum((record_rdp(r) for r in records), np.zeros(len(ORDERS)))

    def can_ask(self, worst_case: tuple[VoteNoise, ...]) -> bool:
        """Would a query charged ``worst_case`` keep the data-independent epsilon in budget?"""
        if not math.isfinite(self.budget):
            return True
        after = self.rdp + self.rdp_reserved + self._charge(worst_case)
        return rdp_to_epsilon(after, self.delta, ORDERS) <= self.budget + 1e-9

    def record(self, records: tuple[VoteNoise, ...], counts: np.ndarray, answered: bool) -> None:
        """Charge one query; ``counts`` (private) only feed the data-dependent bound."""
        self.queries += 1
        self.answered += int(answered)
        self.rdp = self.rdp + self._charge(records)
        for r in records:
            curve = record_rdp(r)
            if r.name == "votes" and r.kind == "gaussian":
                sigma = r.scale * HIST_L2 / r.sensitivity  # the paper's sigma (sensitivity sqrt 2)
                curve = np.minimum(
                    curve, rdp_gnmax_data_dependent(log_q_gnmax(counts, sigma), sigma)
                )
            self.rdp_data_dependent = self.rdp_data_dependent + curve

    def epsilon(self) -> float:
        return rdp_to_epsilon(self.rdp + self.rdp_reserved, self.delta, ORDERS)

    def epsilon_data_dependent(self) -> float:
        """NOT a guarantee: a function of the private votes (see the module docstring)."""
        return rdp_to_epsilon(self.rdp_data_dependent + self.rdp_reserved, self.delta, ORDERS)

    def state_dict(self) -> dict:
        return {
            "delta": self.delta,
            "budget": self.budget,
            "queries": self.queries,
            "answered": self.answered,
            "rdp": self.rdp.tolist(),
            "rdp_data_dependent": self.rdp_data_dependent.tolist(),
            "rdp_reserved": self.rdp_reserved.tolist(),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> PateLedger:
        return cls(
            delta=float(state["delta"]),
            budget=float(state["budget"]),
            queries=int(state["queries"]),
            answered=int(state["answered"]),
            rdp=np.asarray(state["rdp"], dtype=np.float64),
            rdp_data_dependent=np.asarray(state["rdp_data_dependent"], dtype=np.float64),
            rdp_reserved=np.asarray(state.get("rdp_reserved", np.zeros(len(ORDERS))), float),
        )
