"""Private hyper-parameter selection around your own private runs (docs/api.md).

::

    bound = dpsub.planned_rdp(noise_multiplier=z, sample_rate=q, steps=T)  # every run's
    chosen = dpsub.select_privately(
        grid, train, repetitions=Repetitions(mean=10, shape=1), run_rdp=bound,
        score_sigma=20.0, delta=1e-5,
    )
    chosen.candidate, chosen.result, chosen.epsilon  # epsilon covers the whole search

``train(candidate)`` trains privately (e.g. with :func:`~dpsub.api.make_private`) and
returns ``(result, correct, ledger)``: what to keep, how many examples of a held-out part
of the private data its model classifies correctly, and the run's ledger. Only the best
run by a noisy count is released, and the number of runs is random
(:mod:`dpsub.privacy.selection` has the theorems and their conditions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsub.errors import PrivacyError
from dpsub.privacy.accountants import DEFAULT_ORDERS, PrivacyLedger
from dpsub.privacy.noise import SecureNoise
from dpsub.privacy.selection import Repetitions, selection_epsilon

__all__ = ["Selection", "select_privately"]

Train = Callable[[Any], tuple[Any, float, PrivacyLedger]]


@dataclass(frozen=True)
class Selection:
    """The released outcome: the best run's candidate, result and noisy score (all None
    when K = 0, possible under a Poisson law) and the epsilon of the whole search. K is
    not in it: the bound holds because K stays secret (published, K would leave the cost
    of a fixed number of runs), and so do the other runs and their scores."""

    candidate: Any | None
    result: Any | None
    score: float | None
    epsilon: float
    delta: float


def select_privately(
    candidates: Sequence[Any],
    train: Train,
    *,
    repetitions: Repetitions,
    run_rdp,
    score_sigma: float,
    delta: float,
    seed: int | None = None,
    secure: bool = False,
) -> Selection:
    """Run ``train`` on K ~ ``repetitions`` candidates drawn uniformly at random and keep
    the one whose count of correct held-out examples, plus Gaussian noise of std
    ``score_sigma``, is highest. ``run_rdp``: the RDP curve over ``DEFAULT_ORDERS`` that
    every run stays under, fixed before any run (:func:`planned_rdp`); a run whose ledger
    exceeds it raises :class:`~dpsub.errors.PrivacyError`. ``secure``: K, the draws and
    the score noise from the operating system's randomness (``seed`` is then ignored)."""
    if not candidates:
        raise ValueError("candidates: give at least one")
    if not 0 < delta < 1:
        raise ValueError(f"delta: must be in (0, 1), got {delta}")
    bound = np.asarray(run_rdp, dtype=np.float64)
    if bound.shape != (len(DEFAULT_ORDERS),) or not np.all(bound >= 0):
        raise ValueError(f"run_rdp: {len(DEFAULT_ORDERS)} non-negative values (DEFAULT_ORDERS)")
    epsilon = selection_epsilon(bound, repetitions, delta, score_sigma)
    uniform, normal = _draws(seed, secure)
    best: tuple[float, Any, Any] | None = None
    runs = repetitions.sample(uniform())
    for _ in range(runs):
        candidate = candidates[min(int(uniform() * len(candidates)), len(candidates) - 1)]
        result, correct, ledger = train(candidate)
        _check_run(ledger, bound)
        score = float(correct) + score_sigma * normal()
        if best is None or score > best[0]:
            best = (score, candidate, result)
    score, candidate, result = best if best is not None else (None, None, None)
    return Selection(candidate, result, score, epsilon, delta)


def _check_run(ledger: PrivacyLedger, bound: np.ndarray) -> None:
    spent = ledger.rdp()
    over = spent > bound * (1 + 1e-9) + 1e-12
    if np.any(over):
        order = DEFAULT_ORDERS[int(np.flatnonzero(over)[0])]
        raise PrivacyError(
            f"select_privately: a run spent more than run_rdp (order {order}: "
            f"{spent[over][0]:.6g} > {bound[over][0]:.6g}); the selection's epsilon assumes it"
        )


def _draws(seed: int | None, secure: bool) -> tuple[Callable[[], float], Callable[[], float]]:
    """``(uniform in [0, 1), standard normal)``: seeded, or secret."""
    if secure:
        source = SecureNoise()
        return (lambda: float(source.uniform(1, "cpu")[0]),
                lambda: float(source.normal((1,), "cpu")[0]))  # fmt: skip
    rng = np.random.default_rng(seed)
    return (lambda: float(rng.random())), (lambda: float(rng.standard_normal()))
