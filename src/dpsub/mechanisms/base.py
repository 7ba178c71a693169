"""The one interface every mechanism implements.

A mechanism receives the logical batch of private examples (already Poisson
sampled) and returns the released gradient, a flat vector the optimizer applies
(post-processing). It also states, *before* the step runs, what the step costs:
the effective noise multiplier ``z_eff`` of one Poisson-subsampled Gaussian
mechanism (noise std divided by the L2 sensitivity of everything the step
releases). The trainer refuses a step whose cost would exceed the budget, then
records it in the :class:`~dpsub.privacy.PrivacyLedger`.

To add a mechanism: subclass :class:`Mechanism`, implement ``step`` and
``effective_noise_multiplier``, register it with ``@register("name")`` and add
``conf/mechanism/<name>.yaml`` whose keys are the constructor's keyword arguments.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from dpsub.grads import GradEngine, clipped_sum

MECHANISMS: dict[str, type[Mechanism]] = {}


def register(name: str):
    def deco(cls: type[Mechanism]) -> type[Mechanism]:
        cls.name = name
        MECHANISMS[name] = cls
        return cls

    return deco


@dataclass
class StepResult:
    grad: torch.Tensor  # (p,) released gradient, already divided by the expected batch size
    z_eff: float  # effective noise multiplier of this step (inf: nothing private released)
    loss_sum: float  # training-loss sum over the batch (NOT private: for monitoring only)
    correct: int
    n: int  # realized batch size
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class StepContext:
    step: int
    total_steps: int
    expected_batch_size: float  # B = qN: every noisy sum is divided by this
    generator: torch.Generator  # the noise RNG, on the training device


class Mechanism(ABC):
    """Base class. ``noise_multiplier`` is the calibrated z of the run."""

    name: ClassVar[str] = "base"
    private: ClassVar[bool] = True
    needs_aux: ClassVar[bool] = False

    def __init__(self, noise_multiplier: float, **params: Any):
        if params:
            raise TypeError(f"mechanism {self.name!r} got unknown options {sorted(params)}")
        self.noise_multiplier = float(noise_multiplier)
        self.engine: GradEngine | None = None

    def setup(self, engine: GradEngine, aux: Any | None = None) -> None:
        """Called once with the gradient engine (and auxiliary data if ``needs_aux``)."""
        self.engine = engine
        self.aux = aux

    @abstractmethod
    def effective_noise_multiplier(self) -> float:
        """z_eff of the next step, as one Poisson-subsampled Gaussian mechanism."""

    @abstractmethod
    def step(self, x: torch.Tensor, y: torch.Tensor, ctx: StepContext) -> StepResult:
        """Release the gradient for the sampled batch (x, y)."""

    # State that must survive a restart (e.g. a subspace kept across steps).
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027  (optional hook)
        """Restore what :meth:`state_dict` saved (stateless mechanisms: nothing)."""

    @staticmethod
    def gaussian(shape, std: float, ctx: StepContext, device) -> torch.Tensor:
        """Noise ``N(0, std^2 I)`` from the run's noise generator."""
        return torch.randn(shape, generator=ctx.generator, device=device) * std


class ClippedSumMixin:
    """Shared loop: stream per-example gradients, clip each row to C, sum."""

    def clipped_gradient_sum(self, x, y, clip: float):
        engine: GradEngine = self.engine
        total = torch.zeros(engine.dim, device=x.device)
        loss_sum, correct, clipped = 0.0, 0, 0
        for chunk in engine.per_example(x, y):
            s, mask = clipped_sum(chunk.grads, clip)
            total += s
            loss_sum += float(chunk.loss.sum())
            correct += int(chunk.correct.sum())
            clipped += int(mask.sum())
        return total, loss_sum, correct, clipped


def check_positive(name: str, value: float) -> float:
    if not (value > 0) or math.isnan(value):
        raise ValueError(f"mechanism.{name} must be > 0, got {value}")
    return float(value)
