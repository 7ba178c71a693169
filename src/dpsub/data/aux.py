"""Auxiliary (public or non-sensitive) data for subspace methods.

``aux=none`` returns no auxiliary data and leaves the private data unchanged.
Sources that take their samples from the private dataset's splits remove them
from the private set or from the evaluation set, so an auxiliary example is never
trained on privately nor evaluated on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpsub.data.datasets import DatasetBundle

LABEL_MODES = ("random_per_step", "random_once", "true")


@dataclass
class AuxData:
    """m auxiliary examples in the private data's shape and normalization."""

    x: torch.Tensor  # (m, C, H, W) float32, normalized like the private data
    y: torch.Tensor | None  # true labels where the source has them (int64, (m,))
    num_classes: int
    source: str
    labels: str = "random_per_step"  # see LABEL_MODES
    fixed_labels: torch.Tensor | None = None  # drawn once (labels == "random_once")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def to(self, device) -> AuxData:
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return AuxData(mv(self.x), mv(self.y), self.num_classes, self.source, self.labels,
                       mv(self.fixed_labels))

    def batch_labels(self, generator: torch.Generator) -> torch.Tensor:
        """Labels for one use of the anchor set: fresh random (paper), fixed random
        (authors' code) or true."""
        if self.labels == "true":
            if self.y is None:
                raise ValueError(f"aux.labels=true but aux source {self.source!r} has no labels")
            return self.y
        if self.labels == "random_once":
            return self.fixed_labels
        return torch.randint(
            0, self.num_classes, (len(self),), generator=generator, device=self.x.device
        )


def build_aux(cfg, data: DatasetBundle, root: str, seed: int):
    """Return ``(aux, data)``: the auxiliary set (or None) and the possibly reduced data."""
    name = cfg.get("name", "none")
    if name == "none":
        return None, data
    raise ValueError(f"aux.name: unknown auxiliary data source {name!r}")
