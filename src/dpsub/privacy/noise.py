"""Noise is the only way out: every private release of a step goes through a Privatizer.

A mechanism never adds noise itself. It hands the privatizer a :class:`Sensitive`
value (a sum of clipped per-example terms, carrying the L2 sensitivity that its
clipping function guarantees) and the noise it wants; the privatizer draws that
noise from its source, adds it, and keeps a :class:`NoiseRecord` of the release:
its sensitivity and the *smallest* standard deviation of the noise actually added
over all directions (isotropic noise: the std; noise shaped by a matrix L, i.e.
``L @ N(0, std^2 I)``: ``std * sigma_min(L)``, the direction with the least noise).

The step's effective noise multiplier follows from the records alone. Releases of
one step use the same Poisson sample, and together they are one Gaussian mechanism
on the concatenation ``[v_1 / std_1, v_2 / std_2, ...]`` (unit noise), whose L2
sensitivity is ``sqrt(sum_j (Delta_j / std_j)^2)``. So

    z_eff = 1 / sqrt(sum_j (Delta_j / std_j)^2)

(GEP: embedding and residual, ``std_j = z sqrt(2) S_j``, give exactly z). The
trainer compares z_eff with the multiplier the privacy plan charges for the step
and refuses the step when the noise falls short (:class:`~dpsub.errors.PrivacyError`).

Noise sources: :class:`SeededNoise` (a torch generator: reproducible, restorable on
resume, *not* secret: anyone with the config can regenerate the noise; for
research) and :class:`SecureNoise` (``os.urandom``, a cryptographically secure
source: secret and not restorable).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "NoiseBlock",
    "NoiseRecord",
    "Privatizer",
    "SecureNoise",
    "SeededNoise",
    "Sensitive",
    "effective_multiplier",
    "noise_std",
]


@dataclass(frozen=True)
class Sensitive:
    """A value computed from private data with its L2 sensitivity.

    ``sensitivity`` bounds ``||value(D) - value(D')||_2`` for datasets differing in one
    example (add/remove). Only clipping functions create it (``dpsub.grads.clip``),
    so the bound travels with the function that guarantees it. (``inf``: clipping
    turned off, as in tests; any noise then gives multiplier 0, which the trainer refuses.)
    """

    value: Tensor
    sensitivity: float

    def __post_init__(self) -> None:
        if not self.sensitivity > 0:
            raise ValueError(f"sensitivity must be > 0, got {self.sensitivity}")


@dataclass(frozen=True)
class NoiseRecord:
    """One release: its sensitivity and the smallest noise std over all directions."""

    name: str
    sensitivity: float
    std: float


@dataclass(frozen=True)
class NoiseBlock:
    """Matrix-shaped noise on a block of the released vector.

    The block ``value[start : start + rows * cols]``, read as a (rows, cols) matrix (a
    weight matrix, out x in*kh*kw), receives ``left @ N(0, std^2 I_{rows x cols})``:
    every column gets Gaussian noise with covariance ``std^2 left left^T``. Its least
    noisy direction has std ``std * sigma_min(left)``, and 0 when ``left`` has fewer
    columns than rows (some direction gets no noise at all).
    """

    start: int
    rows: int
    cols: int
    left: Tensor  # (rows, k)

    def __post_init__(self) -> None:
        if self.left.dim() != 2 or self.left.shape[0] != self.rows:
            raise ValueError(f"left must be ({self.rows}, k), got {tuple(self.left.shape)}")

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def smallest_singular_value(self) -> float:
        if self.left.shape[1] < self.rows:
            return 0.0
        return float(torch.linalg.svdvals(self.left.double()).min())


def effective_multiplier(records: Sequence[NoiseRecord]) -> float:
    """``1 / sqrt(sum (sensitivity_j / std_j)^2)``; inf without records, 0 if a std is 0."""
    total = 0.0
    for r in records:
        if r.std <= 0 or math.isinf(r.sensitivity):
            return 0.0
        total += (r.sensitivity / r.std) ** 2
    return math.inf if total == 0 else 1.0 / math.sqrt(total)


def noise_std(z: float, scale: float) -> float:
    """``z * scale``, the std of multiplier ``z`` on a sensitivity (or clip bound) ``scale``.

    ``z = 0`` (noise off, as in tests) gives 0 even for an infinite scale (clipping off
    too), where ``0 * inf`` would be NaN; mechanisms never special-case it themselves.
    """
    return 0.0 if z == 0 else z * scale


# ---------------------------------------------------------------- sources
class SeededNoise:
    """Standard normal noise from a seeded torch generator (reproducible, not secret)."""

    secure = False

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def normal(self, shape: Sequence[int], device) -> Tensor:
        return torch.randn(tuple(shape), generator=self.generator, device=device)

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"].cpu())  # a checkpoint loaded onto a GPU


class SecureNoise:
    """Standard normal noise from ``os.urandom`` (Box-Muller on 53-bit uniforms, float64).

    Secret and not restorable: a resumed run draws fresh noise. (Floating-point
    Gaussian samplers have known subtle weaknesses, Mironov 2012; this source removes
    the far larger one of a published seed.)
    """

    secure = True

    def normal(self, shape: Sequence[int], device) -> Tensor:
        n = int(np.prod(tuple(shape), dtype=np.int64))
        if n == 0:
            return torch.zeros(tuple(shape), device=device)
        m = (n + 1) // 2
        bits = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(2, m)
        u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
        r = np.sqrt(-2.0 * np.log(u[0]))
        theta = 2.0 * np.pi * u[1]
        z = np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]
        return torch.from_numpy(z).to(device=device, dtype=torch.float32).reshape(tuple(shape))

    def uniform(self, n: int, device) -> Tensor:
        """n uniforms in [0, 1) (for secret Poisson sampling)."""
        bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        u = (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return torch.from_numpy(u).to(device)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


# ------------------------------------------------------------- privatizer
@dataclass
class Privatizer:
    """Adds noise to sensitive values and records every release of the current step.

    Args:
        source: where standard normal noise comes from (:class:`SeededNoise` or
            :class:`SecureNoise`).
        reduce: applied to a sensitive value before the noise is added; the identity in
            one process, an all-reduce over ranks in distributed training (so the noise
            is added once to the global sum).
    """

    source: SeededNoise | SecureNoise
    reduce: Callable[[Tensor], Tensor] | None = None
    records: list[NoiseRecord] = field(default_factory=list)

    std = staticmethod(noise_std)  # ``ctx.noise.std(z, clip)``: the std to ask for

    def begin_step(self) -> None:
        self.records = []

    def release(self, s: Sensitive, z: float, name: str = "release") -> tuple[Tensor, float]:
        """The Gaussian mechanism at multiplier ``z``: ``(s + N(0, (z * sensitivity)^2 I), std)``,
        the std taken from the sensitivity the clipped value carries (the bound given once)."""
        std = noise_std(z, s.sensitivity)
        return self.gaussian(s, std, name), std

    def _sum(self, s: Sensitive) -> Tensor:
        if not isinstance(s, Sensitive):
            raise TypeError("the privatizer only takes Sensitive values (from a clipping function)")
        return s.value if self.reduce is None else self.reduce(s.value)

    def gaussian(self, s: Sensitive, std: float, name: str = "release") -> Tensor:
        """``s.value + N(0, std^2 I)``, recorded."""
        std = float(std)
        if not std >= 0:
            raise ValueError(f"noise std must be >= 0, got {std}")
        value = self._sum(s)
        self.records.append(NoiseRecord(name, s.sensitivity, std))
        if std == 0:
            return value.clone()
        return value + std * self.source.normal(value.shape, value.device).to(value.dtype)

    def shaped(
        self, s: Sensitive, std: float, blocks: Sequence[NoiseBlock], name: str = "release"
    ) -> Tensor:
        """``s.value`` plus matrix-shaped noise on ``blocks`` and ``N(0, std^2)`` elsewhere.

        Recorded with the smallest std over all directions: ``std * min_b sigma_min(left_b)``
        (and ``std`` itself if some coordinates lie in no block).
        """
        std = float(std)
        value = self._sum(s)
        if value.dim() != 1:
            raise ValueError("shaped noise needs a flat (p,) value")
        noise = std * self.source.normal(value.shape, value.device).to(value.dtype)
        covered = 0
        smallest = math.inf
        for b in sorted(blocks, key=lambda b: b.start):
            if b.start < covered or b.start + b.size > value.numel():
                raise ValueError("noise blocks overlap or run past the value")
            base = noise[b.start : b.start + b.size].view(b.rows, b.cols)
            if b.left.shape[1] != b.rows:  # (rows, k): draw k x cols fresh
                base = std * self.source.normal((b.left.shape[1], b.cols), value.device)
            noise[b.start : b.start + b.size] = (b.left.to(value) @ base).reshape(-1)
            smallest = min(smallest, b.smallest_singular_value())
            covered = b.start + b.size
        if sum(b.size for b in blocks) < value.numel():
            smallest = min(smallest, 1.0)
        self.records.append(NoiseRecord(name, s.sensitivity, std * smallest))
        return value + noise

    def effective_multiplier(self) -> float:
        return effective_multiplier(self.records)
