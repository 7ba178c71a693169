"""Datasets as normalized in-memory tensors.

The names below are imported on first use, so that the torch-free modules of this
package (:mod:`dpsub.data.aux_options`) can be imported without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LOADERS", "DatasetBundle", "DatasetNotFoundError", "load_dataset"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("dpsub.data.datasets"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
