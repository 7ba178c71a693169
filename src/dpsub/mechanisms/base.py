"""The one interface every mechanism implements.

A mechanism receives the logical batch of private examples (already Poisson
sampled) and returns the released gradient, a flat vector the optimizer applies
(post-processing). It never states its own privacy cost: every noisy release goes
through ``ctx.noise`` (a :class:`~dpsub.privacy.noise.Privatizer`), which records the
sensitivity and the noise actually drawn, and the trainer derives the step's
effective noise multiplier from those records and compares it with the plan.

What a mechanism declares:

* its options (:mod:`dpsub.mechanisms.options`, torch-free, checked by the config
  validator) -- available as ``self.opts``;
* its privacy *schedule*, :meth:`Mechanism.phases`: (steps, scale) phases whose noise
  multiplier is ``scale * z``; calibration solves for z over the whole schedule, and
  each step gets its multiplier as ``ctx.z``;
* ``accounting``: ``"planned"`` (the default: the step is charged the planned z and
  refused if the records show less noise) or ``"measured"`` (charged what the records
  show, e.g. noise shaped by the model's weights).

To add a mechanism: declare its options in ``options.py``, subclass
:class:`Mechanism` with ``@register("name")``, implement :meth:`Mechanism.step`, and add
``conf/mechanism/<name>.yaml`` taking the declared defaults
(``- /declared/mechanism/<name>@_here_``; docs/architecture.md "Where a default lives").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from dpsub.grads import BatchStats, GradEngine
from dpsub.mechanisms.options import SPECS, MechanismSpec, parse_options
from dpsub.privacy.noise import Privatizer

MECHANISMS: dict[str, type[Mechanism]] = {}


def register(name: str):
    """Link a mechanism class to its declaration in ``options.py`` and register it."""

    def deco(cls: type[Mechanism]) -> type[Mechanism]:
        if name not in SPECS:
            raise KeyError(f"mechanism {name!r} has no declaration in dpsub/mechanisms/options.py")
        cls.name = name
        cls.spec = SPECS[name]
        cls.private = SPECS[name].private
        cls.needs_aux = SPECS[name].needs_aux
        MECHANISMS[name] = cls
        return cls

    return deco


@dataclass
class Refit:
    """When a public quantity kept across steps (a basis, carriers) is recomputed.

    Due at the first step (nothing fitted yet), then whenever ``every`` steps have passed
    since the last fit (``every=0``: never again). ``last`` is the step of the last fit
    (-1: none), saved in the mechanism's state.
    """

    every: int
    last: int = -1

    def due(self, step: int, current: object | None) -> bool:
        return current is None or (self.every > 0 and step - self.last >= self.every)

    def mark(self, step: int) -> None:
        self.last = int(step)


@dataclass(frozen=True)
class Phase:
    """``steps`` steps whose noise multiplier is ``scale`` times the calibrated z."""

    steps: int
    scale: float = 1.0


@dataclass
class StepContext:
    step: int
    total_steps: int
    expected_batch_size: float  # B = qN: every noisy sum is divided by this
    z: float  # noise multiplier the plan charges for this step (inf: non-private)
    noise: Privatizer  # the only way to add noise; records every release
    rng: torch.Generator  # public randomness (subspace starts, random labels), restorable
    diagnostics: bool = False  # compute private diagnostics (privacy.private_diagnostics)


@dataclass
class StepResult:
    grad: Tensor  # (p,) released gradient, already divided by the expected batch size
    stats: BatchStats = field(default_factory=BatchStats)  # private: loss, accuracy, clipping
    metrics: dict[str, float] = field(default_factory=dict)  # public: from releases / config
    private_metrics: dict[str, float] = field(default_factory=dict)  # from private data


class Mechanism(ABC):
    """Base class; ``self.opts`` holds the declared options."""

    name: ClassVar[str] = "base"
    spec: ClassVar[MechanismSpec]
    private: ClassVar[bool] = True
    needs_aux: ClassVar[bool] = False
    accounting: str = "planned"  # "planned" | "measured" (see the module docstring)
    #: Keys of :meth:`state_dict` computed from public data and the public generator only
    #: (e.g. a subspace fitted on auxiliary data). A light checkpoint may leave them out
    #: (``training/checkpoint.py``: :func:`light_copy`); :meth:`load_state_dict` then gets
    #: ``None`` for them and the mechanism must recompute them.
    recomputable: ClassVar[tuple[str, ...]] = ()

    def __init__(self, parsed: Any = None, /, **options: Any):
        """``parsed``: the options object the config validator made (Settings.mechanism),
        used as it is; else the keyword ``options`` are parsed and checked here."""
        if parsed is None:
            parsed = parse_options(self.name, options)
        elif options or type(parsed) is not self.spec.options:
            raise TypeError(
                f"{self.name}: give either a {self.spec.options.__name__} or keyword options"
            )
        self.opts = parsed
        self.engine: GradEngine | None = None
        self.aux = None

    def setup(self, engine: GradEngine, aux: Any | None = None) -> None:
        """Called once with the gradient engine (and auxiliary data if ``needs_aux``)."""
        if self.needs_aux and aux is None:
            raise ValueError(
                f"mechanism={self.name} needs auxiliary data: choose an aux source, e.g. aux=natural"
            )
        self.engine = engine
        self.aux = aux

    def phases(self, total_steps: int) -> list[Phase]:
        """The privacy schedule: one phase at the calibrated z unless overridden."""
        return [Phase(total_steps)]

    @abstractmethod
    def step(self, x: Tensor, y: Tensor, ctx: StepContext) -> StepResult:
        """Release the gradient for the sampled batch (x, y)."""

    # State that must survive a restart (e.g. a subspace kept across steps).
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027  (optional hook)
        """Restore what :meth:`state_dict` saved (stateless mechanisms: nothing)."""
