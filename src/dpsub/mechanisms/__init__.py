"""Mechanisms: how a batch's private gradients become one released gradient.

Every mechanism registers itself in :data:`MECHANISMS` under its config name.
"""

from dpsub.mechanisms import dpsgd, gep, nonprivate  # noqa: F401  (registration)
from dpsub.mechanisms.base import MECHANISMS, Mechanism, StepContext, StepResult, register


def build_mechanism(name: str, noise_multiplier: float, **params) -> Mechanism:
    if name not in MECHANISMS:
        raise ValueError(
            f"mechanism.name: unknown mechanism {name!r}; choose from {sorted(MECHANISMS)}"
        )
    return MECHANISMS[name](noise_multiplier=noise_multiplier, **params)


__all__ = ["MECHANISMS", "Mechanism", "StepContext", "StepResult", "build_mechanism", "register"]
