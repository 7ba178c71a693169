"""Mechanisms: how a batch's private gradients become one released gradient.

Every mechanism declares its options in :mod:`dpsub.mechanisms.options` (torch-free,
read by the config validator) and registers its class in :data:`MECHANISMS` under the
same name. The implementations (and torch) are imported on first use of anything
but ``options`` (PEP 562), so ``import dpsub.mechanisms.options`` stays light.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

_BASE = ("MECHANISMS", "Mechanism", "Phase", "Refit", "StepContext", "StepResult", "register")

__all__ = [*_BASE, "build_mechanism"]


def _load() -> Any:
    """Import every implementation module of this package (each registers its classes)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in ("base", "options") and not info.name.startswith("_"):
            importlib.import_module(f"dpsub.mechanisms.{info.name}")
    return importlib.import_module("dpsub.mechanisms.base")


def build_mechanism(name: str, parsed: Any = None, /, **options):
    """The mechanism ``name`` with its options: ``parsed`` (the declared options object,
    as in Settings.mechanism) or keyword ``options`` (parsed and checked here)."""
    registry = _load().MECHANISMS
    if name not in registry:
        raise ValueError(
            f"mechanism.name: unknown mechanism {name!r}; choose from {sorted(registry)}"
        )
    return registry[name](parsed, **options)


def __getattr__(name: str) -> Any:
    if name in _BASE:
        return getattr(_load(), name)
    raise AttributeError(f"module 'dpsub.mechanisms' has no attribute {name!r}")
