"""Datasets as normalized in-memory tensors, auxiliary data, and batch sampling.

The loaders (and torch) are imported on first use of an attribute (PEP 562), so that the
torch-free modules here (``names``, ``aux_options``) stay light for the config validator.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"LOADERS", "DatasetBundle", "DatasetNotFoundError", "load_dataset"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module("dpsub.data.datasets"), name)
    raise AttributeError(f"module 'dpsub.data' has no attribute {name!r}")
