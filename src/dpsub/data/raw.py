"""What a dataset loader returns (:mod:`dpsub.data.datasets`, :mod:`dpsub.data.user`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class _Raw:
    """What a loader returns: unnormalized images, uint8 or float."""

    train_x: torch.Tensor  # (N, C, H, W) uint8 in [0, 255], or float
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list[str] | None
    num_classes: int
    mean: tuple[float, ...]  # per-channel normalization: constants, not data statistics
    std: tuple[float, ...]
    default_size: int | None = None  # resize to this when image_size is not given
