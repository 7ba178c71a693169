"""Batch samplers that run on the training device.

``poisson`` (the default, and what every accountant assumes): each example joins
the batch independently with probability q, so the batch size is random with
mean B = qN. ``shuffle``: fixed-size batches from a random permutation per
epoch, as some papers' code does; its epsilon is still computed as if sampling
were Poisson, which the run records (``privacy.sampling`` in the saved config
and a warning at start).
"""

from __future__ import annotations

import torch

SAMPLINGS = ("poisson", "shuffle")


class PoissonSampler:
    def __init__(self, n: int, q: float, generator: torch.Generator, device):
        if not 0 < q <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {q}")
        self.n, self.q, self.generator, self.device = n, q, generator, device

    def sample(self) -> torch.Tensor:
        mask = torch.rand(self.n, generator=self.generator, device=self.device) < self.q
        return mask.nonzero().squeeze(1)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ShuffleSampler:
    def __init__(self, n: int, batch_size: int, generator: torch.Generator, device):
        self.n, self.batch_size, self.generator, self.device = n, batch_size, generator, device
        self.perm: torch.Tensor | None = None
        self.pos = 0

    def sample(self) -> torch.Tensor:
        if self.perm is None or self.pos + self.batch_size > self.n:
            self.perm = torch.randperm(self.n, generator=self.generator, device=self.device)
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


def build_sampler(kind: str, n: int, batch_size: int, generator, device):
    if kind == "poisson":
        return PoissonSampler(n, batch_size / n, generator, device)
    if kind == "shuffle":
        return ShuffleSampler(n, batch_size, generator, device)
    raise ValueError(f"privacy.sampling must be one of {SAMPLINGS}, got {kind!r}")
