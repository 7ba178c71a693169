"""Every mechanism's declaration: its options, their ranges, and what it needs.

This module imports nothing heavy (no torch), so the config validator can check a
mechanism's options in well under a second, before anything is created. Each
mechanism class is linked to its declaration by name (``@register(name)`` in
:mod:`dpsub.mechanisms.base`). The defaults are written here only: ``conf/mechanism/<name>.yaml``
takes them (``- /declared/mechanism/<name>@_here_``, registered by :mod:`dpsub.config`) and
sets only what differs (tests/unit/test_declared_once.py).

To declare a mechanism::

    @declare("mine", needs_aux=True)
    @dataclass
    class MineOptions:
        clip: float = opt(1.0, gt=0, help="C: per-example gradient norm bound")
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dpsub.declare import check_value, opt
from dpsub.errors import ConfigError

__all__ = ["SPECS", "MechanismSpec", "declare", "opt", "parse_options"]


@dataclass(frozen=True)
class MechanismSpec:
    name: str
    options: type
    private: bool = True
    needs_aux: bool = False
    summary: str = ""

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.options))


SPECS: dict[str, MechanismSpec] = {}


def declare(name: str, *, private: bool = True, needs_aux: bool = False):
    def deco(cls: type) -> type:
        doc = (cls.__doc__ or "").strip().splitlines()
        SPECS[name] = MechanismSpec(name, cls, private, needs_aux, doc[0] if doc else "")
        return cls

    return deco


def parse_options(name: str, options: dict[str, Any], prefix: str = "mechanism") -> Any:
    """The declared options object of mechanism ``name``; ConfigError naming a bad key."""
    if name not in SPECS:
        raise ConfigError(f"{prefix}.name: unknown mechanism {name!r}; choose from {sorted(SPECS)}")
    spec = SPECS[name]
    fields = {f.name: f for f in dataclasses.fields(spec.options)}
    values = {}
    for key, value in options.items():
        if key not in fields:
            raise ConfigError(
                f"{prefix}.{key}: unknown option for mechanism {name}; valid options: "
                f"{sorted(fields)}"
            )
        values[key] = check_value(f"{prefix}.{key}", value, fields[key])
    return spec.options(**values)


# ------------------------------------------------------------------ mechanisms
@declare("nonprivate", private=False)
@dataclass
class NonPrivateOptions:
    """Ordinary SGD on the mean gradient: no clipping, no noise, epsilon = inf."""


@declare("dpsgd")
@dataclass
class DPSGDOptions:
    """DP-SGD: clip each example's gradient to C, sum, add N(0, z^2 C^2 I)."""

    clip: float = opt(1.0, gt=0, help="C: per-example gradient norm bound")


GROUPINGS = ("stages", "chunks", "tensors", "flat")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
ANCHOR_PRECISIONS = ("fp32", "bf16")
RESIDUALS = ("bookkeeping", "materialize")


@declare("bgep", needs_aux=True)
@dataclass
class BGEPOptions:
    """B-GEP: release only the noisy anchor-subspace embedding (std z S1)."""

    num_bases: int = opt(
        1000,
        ge=1,
        help="k, split over groups by sqrt(group size) (paper: 500-2000; halve for MNIST)",
    )
    clip_embedding: float = opt(10.0, gt=0, help="S1 (paper 10; official code 5)")
    power_iters: int = opt(1, ge=1, help="t, power iterations per subspace")
    grouping: str = opt(
        "stages",
        choices=GROUPINGS,
        help="parameter groups, one basis each: stages (paper: one per top-level module) | chunks "
        "(official code) | tensors | flat",
    )
    num_groups: int = opt(3, ge=1, help="groups of grouping=chunks (official code: 3)")
    precision: str = opt("fp32", choices=PRECISIONS, help="power-iteration matmul precision")
    subspace_every: int = opt(
        1, ge=1, help="recompute the anchor subspace every N steps (paper: 1)"
    )
    warm_start: bool = opt(
        False, help="start each recomputation from the previous basis (tracking; paper: random)"
    )
    refresh_every: int = opt(
        0, ge=0, help="with warm_start: a random start every N steps (0: only the first)"
    )
    anchor_precision: str = opt(
        "fp32", choices=ANCHOR_PRECISIONS, help="anchor gradients: fp32 | bf16 (autocast)"
    )
    diagnostics_every: int = opt(
        50,
        ge=0,
        help="steps between projection-error / stable-rank logs (0: off; privacy.private_diagnostics "
        "only: the private batch, not privatized)",
    )


@declare("gep", needs_aux=True)
@dataclass
class GEPOptions(BGEPOptions):
    """GEP: noisy embedding (std z sqrt2 S1) and noisy residual (std z sqrt2 S2)."""

    clip_residual: float = opt(2.0, gt=0, help="S2")
    residual: str = opt(
        "bookkeeping",
        choices=RESIDUALS,
        help="bookkeeping: clip r_i by ||g_i||^2 - ||w_i||^2 (with a rounding margin) | materialize: "
        "form R = G - W B",
    )


# ----------------------------------------------------------- PDP-SGD, RPDP-SGD
@declare("rpdpsgd")
@dataclass
class RPDPSGDOptions:
    """RPDP-SGD: DP-SGD's noisy gradient projected onto a random k-dim subspace."""

    clip: float = opt(1.0, gt=0, help="C: per-example gradient norm bound")
    num_bases: int = opt(50, ge=1, help="k, dimension of the subspace (MNIST 50, F-MNIST 70)")
    subspace_every: int = opt(1, ge=1, help="s: recompute the subspace every s steps")
    start_step: int = opt(
        0, ge=0, help="plain DP-SGD steps before projecting (epochs x N/B; F-MNIST: 14 x 40)"
    )
    diagnostics_every: int = opt(
        50, ge=0, help="steps between private diagnostics (privacy.private_diagnostics only)"
    )


@declare("pdpsgd", needs_aux=True)
@dataclass
class PDPSGDOptions(RPDPSGDOptions):
    """PDP-SGD: DP-SGD's noisy gradient projected onto the top-k public gradient subspace."""

    eigensolver: str = opt(
        "gram", choices=("gram", "power"), help="exact via the m x m Gram matrix, or power method"
    )
    power_iters: int = opt(20, ge=1, help="iterations of eigensolver=power")


# -------------------------------------------------- RGP, RGP-random, DP-PowerSGD
RGP_UPDATES = ("full", "left")
RGP_SOURCES = ("historical", "weights")
RGP_HEADS = ("reparam", "full")


@dataclass
class _CarrierOptions:
    clip: float = opt(1.0, gt=0, help="C: norm bound of all carrier gradients of one example")
    rank: int = opt(16, ge=1, help="r per weight, capped at min(out, in*kh*kw) (paper: 1-16)")
    update: str = opt(
        "full", choices=RGP_UPDATES, help="full: Corollary 2.1.1 (paper); left: frozen R, (dL) R"
    )
    carriers_every: int = opt(1, ge=1, help="recompute the carriers every N steps (paper: 1)")
    diagnostics_every: int = opt(
        50, ge=0, help="steps between projection-residual logs (privacy.private_diagnostics only)"
    )
    head: str = opt(
        "reparam",
        choices=RGP_HEADS,
        help="classification layer: reparam (carriers, as every layer) or full (its full "
        "per-example gradient, times head_scale, clipped jointly with the carriers: authors' code)",
    )
    head_scale: float = opt(
        1.0, gt=0, help="with head=full: factor on the head's per-example gradient (authors: 0.01)"
    )


@declare("rgp_random")
@dataclass
class RGPRandomOptions(_CarrierOptions):
    """RGP-random: RGP with random orthonormal gradient carriers (public randomness)."""


@declare("rgp")
@dataclass
class RGPOptions(_CarrierOptions):
    """RGP: perturb low-rank gradient carriers from the historical update, reconstruct."""

    power_iters: int = opt(1, ge=1, help="K: power iterations per carrier pair (paper: 1)")
    source: str = opt(
        "historical", choices=RGP_SOURCES, help="historical: W_t - W_0 (paper); weights: W_t"
    )
    warmup_steps: int = opt(50, ge=1, help="first steps decomposing W_t itself (source=historical)")


@declare("dppowersgd")
@dataclass
class DPPowerSGDOptions:
    """DP-PowerSGD: DP-SGD's noisy gradient, each weight matrix compressed to rank r."""

    clip: float = opt(1.0, gt=0, help="C: per-example gradient norm bound")
    rank: int = opt(16, ge=1, help="r per weight matrix, capped at min(out, in*kh*kw)")
    error_feedback: bool = opt(
        True, help="add the last compression error before compressing (PowerSGD; false: plain)"
    )


# ------------------------------------------------------------- DP-Hero
HERO_ACCOUNTING = ("measured", "nominal")


@declare("dphero")
@dataclass
class DPHeroOptions:
    """DP-Hero: DP-SGD noise reshaped per layer by the PCA of W W^T (honest epsilon logged)."""

    clip: float = opt(1.0, gt=0, help="C: per-example gradient norm bound")
    accounting: str = opt(
        "measured",
        choices=HERO_ACCOUNTING,
        help="budget on the honest epsilon (measured) or on the paper's nominal one (nominal)",
    )


@declare("dphero_floor")
@dataclass
class DPHeroFloorOptions:
    """DP-Hero with every direction floored at DP-SGD's noise: its nominal epsilon is honest."""

    clip: float = opt(1.0, gt=0, help="C: per-example gradient norm bound")
