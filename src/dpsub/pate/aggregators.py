"""Noisy aggregators of teacher votes (torch-free).

* ``lnmax``: argmax of the counts plus Laplace(b) noise (PATE 2017).
* ``gnmax``: argmax of the counts plus N(0, sigma^2) noise (PATE 2018).
* ``confident``: Confident-GNMax (PATE 2018, Algorithm 1): answer only when the largest
  count plus N(0, sigma1^2) reaches the threshold T, and then with GNMax(sigma2).

Every draw leaves a :class:`VoteNoise` record (kind, sensitivity, scale of the noise
actually drawn), like the training privatizer's noise records: the accountant charges a
query from its records alone (:mod:`dpsub.pate.accounting`), so the cost follows the
noise drawn. Sensitivities follow from :mod:`dpsub.pate.votes`: the histogram moves by
L2 sqrt(2) / L1 2, its maximum by 1.

Noise comes from a seeded ``numpy.random.Generator`` (reproducible and restorable on
resume, *not* secret), as ``privacy.rng=seeded`` in training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HIST_L2 = math.sqrt(2.0)  # one teacher's vote moves: -1 in one class, +1 in another
HIST_L1 = 2.0
MAX_SENS = 1.0  # the largest count moves by at most 1


@dataclass(frozen=True)
class VoteNoise:
    """One noisy release: ``kind`` gaussian (scale = std, L2 sensitivity) or laplace
    (scale = b, L1 sensitivity)."""

    name: str
    kind: str
    sensitivity: float
    scale: float


@dataclass(frozen=True)
class Answer:
    """A query's outcome: the label (None: not answered) and the noise records it drew."""

    label: int | None
    records: tuple[VoteNoise, ...]


def _check_counts(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1:
        raise ValueError(f"one query's vote counts must be 1-D, got shape {counts.shape}")
    return counts


@dataclass(frozen=True)
class LNMax:
    """Laplace noisy max: ``argmax_j n_j + Lap(b)`` (b = 1/gamma of the 2017 paper)."""

    scale: float
    name: str = "lnmax"

    def worst_case(self) -> tuple[VoteNoise, ...]:
        return (VoteNoise("votes", "laplace", HIST_L1, self.scale),)

    def __call__(self, counts: np.ndarray, rng: np.random.Generator) -> Answer:
        counts = _check_counts(counts)
        noisy = counts + rng.laplace(0.0, self.scale, size=counts.shape)
        return Answer(int(np.argmax(noisy)), self.worst_case())


@dataclass(frozen=True)
class GNMax:
    """Gaussian noisy max: ``argmax_j n_j + N(0, sigma^2)``."""

    sigma: float
    name: str = "gnmax"

    def worst_case(self) -> tuple[VoteNoise, ...]:
        return (VoteNoise("votes", "gaussian", HIST_L2, self.sigma),)

    def noisy_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return counts + rng.normal(0.0, self.sigma, size=counts.shape)

    def __call__(self, counts: np.ndarray, rng: np.random.Generator) -> Answer:
        noisy = self.noisy_counts(_check_counts(counts), rng)
        return Answer(int(np.argmax(noisy)), self.worst_case())


@dataclass(frozen=True)
class ConfidentGNMax:
    """Answer with GNMax(sigma2) only if ``max_j n_j + N(0, sigma1^2) >= threshold``."""

    sigma1: float
    sigma2: float
    threshold: float
    name: str = "confident"

    def check_record(self) -> VoteNoise:
        return VoteNoise("threshold", "gaussian", MAX_SENS, self.sigma1)

    def worst_case(self) -> tuple[VoteNoise, ...]:
        return (self.check_record(), *GNMax(self.sigma2).worst_case())

    def __call__(self, counts: np.ndarray, rng: np.random.Generator) -> Answer:
        counts = _check_counts(counts)
        if counts.max() + rng.normal(0.0, self.sigma1) < self.threshold:
            return Answer(None, (self.check_record(),))
        gnmax = GNMax(self.sigma2)
        return Answer(int(np.argmax(gnmax.noisy_counts(counts, rng))), self.worst_case())


def build_aggregator(opts) -> LNMax | GNMax | ConfidentGNMax:
    """The aggregator named by ``opts.aggregator`` (``pate.*`` of the config)."""
    name = opts["aggregator"]
    if name == "lnmax":
        return LNMax(float(opts["laplace_scale"]))
    if name == "gnmax":
        return GNMax(float(opts["sigma2"]))
    if name == "confident":
        return ConfidentGNMax(
            float(opts["sigma1"]), float(opts["sigma2"]), float(opts["threshold"])
        )
    raise ValueError(f"pate.aggregator: must be one of {AGGREGATORS}, got {name!r}")


AGGREGATORS = ("lnmax", "gnmax", "confident")
