"""Batch samplers that run on the training device.

``poisson`` (the default, and what every accountant assumes): each example joins
the batch independently with probability q, so the batch size is random with
mean B = qN. ``shuffle``: fixed-size batches from a random permutation per
epoch, as some papers' code does; its epsilon is still computed as if sampling
were Poisson, which the run records (``privacy.sampling`` in the saved config
and a warning at start).

The randomness comes from a ``uniform(n) -> (n,) tensor in [0, 1)`` source: a seeded
torch generator (research mode, restorable) or ``os.urandom`` (``privacy.rng=secure``:
which examples were sampled stays secret, which the amplification by subsampling in
the accountant relies on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dpsub.choices import SAMPLINGS

Uniform = Callable[[int], torch.Tensor]


def sample_rate(batch_size: int, n: int) -> float:
    """``q = B / N``: the Poisson rate of an expected batch of B out of N examples (the one
    definition: the plan, the sampler and the step count all use it)."""
    return batch_size / n


@dataclass
class SeededUniform:
    """Uniforms from a seeded generator: an object, not a closure, so that a copied session
    (``copy.deepcopy``) samples from its own copy of the generator."""

    generator: torch.Generator
    device: torch.device | str | None

    def __call__(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, device=self.device)


def seeded_uniform(generator: torch.Generator, device) -> Uniform:
    return SeededUniform(generator, device)


class PoissonSampler:
    def __init__(self, n: int, q: float, uniform: Uniform):
        if not 0 < q <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {q}")
        self.n, self.q, self.uniform = n, q, uniform

    def sample(self) -> torch.Tensor:
        return (self.uniform(self.n) < self.q).nonzero().squeeze(1)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ShuffleSampler:
    def __init__(self, n: int, batch_size: int, uniform: Uniform, device=None):
        self.n, self.batch_size, self.uniform, self.device = n, batch_size, uniform, device
        self.perm: torch.Tensor | None = None
        self.pos = 0

    def sample(self) -> torch.Tensor:
        if self.perm is None or self.pos + self.batch_size > self.n:
            self.perm = self.uniform(self.n).argsort()  # a uniformly random permutation
            self.pos = 0
        idx = self.perm[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx

    def state_dict(self) -> dict:
        return {"perm": None if self.perm is None else self.perm.cpu(), "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        perm = state.get("perm")
        self.perm = None if perm is None else perm.to(self.device)
        self.pos = int(state.get("pos", 0))


def build_sampler(kind: str, n: int, batch_size: int, uniform: Uniform, device=None):
    if kind == "poisson":
        return PoissonSampler(n, sample_rate(batch_size, n), uniform)
    if kind == "shuffle":
        return ShuffleSampler(n, batch_size, uniform, device)
    raise ValueError(f"privacy.sampling must be one of {SAMPLINGS}, got {kind!r}")
