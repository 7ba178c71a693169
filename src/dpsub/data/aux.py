"""Auxiliary (public or non-sensitive) data for subspace methods.

``aux=none`` returns no auxiliary data and leaves the private data unchanged.
Sources that take their samples from the private dataset's splits remove them
from the private set or from the evaluation set, so an auxiliary example is never
trained on privately nor evaluated on.
"""

from __future__ import annotations

from dpsub.data.datasets import DatasetBundle


def build_aux(cfg, data: DatasetBundle, root: str, seed: int):
    """Return ``(aux, data)``: the auxiliary set (or None) and the possibly reduced data."""
    name = cfg.get("name", "none")
    if name == "none":
        return None, data
    raise ValueError(f"aux.name: unknown auxiliary data source {name!r}")
