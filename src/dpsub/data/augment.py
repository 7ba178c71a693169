"""Augmentation multiplicity (``train.augmult=K``): K random views of every private example.

De et al. 2022 (after Hoffer et al. 2019 and Fort et al. 2021) train on K augmented views
of each example and average the K per-view gradients *before* clipping: an example still
contributes one clipped gradient, so the sensitivity stays the clip bound. The views are
made here, for a whole Poisson batch at once on its device: ``views(x)`` maps a batch
``(b, C, H, W)`` to ``(b, K, C, H, W)`` (the grads engine reads the second axis as the
views of one example, :meth:`dpsub.grads.GradEngine.views_of`).

A view is a random crop of the image padded by ``pad`` pixels on each side, the padding
mirroring the border (as jax_privacy's augmult pipeline pads), then, for natural images,
a horizontal flip with probability 1/2. Choices by data (documented in docs/recipe.md):
CIFAR-10 (32x32): pad 4 and flips; other images (digits: MNIST, Fashion-MNIST, SVHN, the
8x8 ``digits``): pad ``min(4, H // 14)`` or at least 1 (2 for 28x28), no flips. The crop
offsets and flips are public randomness drawn from their own generator (seeded from the
run seed, checkpointed): turning augmult on changes neither the sampling nor the noise
stream. ``K = 1`` is no augmentation at all (the batch as it is: today's runs, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dpsub.data.registry import REGISTRY


def view_padding(height: int) -> int:
    """Crop padding for images of ``height`` rows: 4 at 32x32 and above, 2 at 28x28, >= 1."""
    return 4 if height >= 32 else max(1, min(4, height // 14))


def _mirror(index: Tensor, size: int) -> Tensor:
    """Positions ``index`` in [-size, 2 size) folded back into [0, size) by mirroring at the
    border, the border pixel repeated (``[x1 x0 | x0 x1 ... xn | xn xn-1]``)."""
    index = torch.where(index < 0, -index - 1, index)
    return torch.where(index >= size, 2 * size - index - 1, index)


@dataclass
class Augmult:
    """K views per example: mirrored-padding random crops (and flips), from ``generator``."""

    k: int
    pad: int
    flip: bool
    generator: torch.Generator

    def views(self, x: Tensor) -> Tensor:
        """``(b, K, C, H, W)`` views of the batch ``x`` (b, C, H, W), made in two gathers."""
        b, c, h, w = x.shape
        g, dev = self.generator, x.device
        shift = torch.randint(0, 2 * self.pad + 1, (b, self.k, 2), generator=g, device=dev)
        flips = torch.randint(0, 2, (b, self.k), generator=g, device=dev).bool()
        rows = _mirror(shift[..., 0:1] - self.pad + torch.arange(h, device=dev), h)  # (b, K, H)
        cols = torch.arange(w, device=dev)
        if self.flip:
            cols = torch.where(flips[..., None], cols.flip(0), cols)
        cols = _mirror(shift[..., 1:2] - self.pad + cols, w)  # (b, K, W)
        full = (b, self.k, c, h, w)
        out = torch.gather(x[:, None].expand(full), 3, rows[:, :, None, :, None].expand(full))
        return torch.gather(out, 4, cols[:, :, None, None, :].expand(full))


def build_augmult(k: int, dataset: str, in_shape, generator: torch.Generator) -> Augmult | None:
    """The run's augmentation (None for ``k == 1``: no views). ``in_shape``: (C, H, W)."""
    if k == 1:
        return None
    return Augmult(int(k), view_padding(int(in_shape[1])), REGISTRY[dataset].flip, generator)
