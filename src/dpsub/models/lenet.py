"""LeNet-5 style CNN (LeCun et al., "Gradient-Based Learning Applied to Document
Recognition", Proc. IEEE 1998), in the common modern variant with ReLU and max-pooling:

    Conv(C->6, 5x5)  - ReLU - MaxPool(2)
    Conv(6->16, 5x5) - ReLU - MaxPool(2)
    flatten - Linear(->120) - ReLU - Linear(120->84) - ReLU - Linear(84->num_classes)

For 28x28 inputs the first conv uses ``padding=2`` (28 -> 28, as in the classic
MNIST LeNet-5 that pads MNIST to 32x32); for any other size no padding is used
(so 32x32 CIFAR inputs give the original 32 -> 28 map).  In both cases the
flattened size is 16*5*5 = 400; it is computed from ``in_shape`` by a dummy
forward pass.  No BatchNorm, no in-place ops (``torch.func`` / vmap friendly).
"""

from __future__ import annotations

from math import gcd

import torch
from torch import nn

from .mnist_cnn import conv_norm

__all__ = ["LeNet"]


class LeNet(nn.Module):
    """LeNet-5 style network.

    Args:
        in_shape: ``(C, H, W)`` of one input example.
        num_classes: number of output logits.
        norm: ``"none"`` or ``"group"`` (``GroupNorm(gn_groups, channels)`` after each
            conv, before the ReLU).  Note that with ``norm="group"`` the 6-channel
            first conv needs ``gn_groups`` dividing 6; the value used there is
            ``gcd(gn_groups, 6)`` (2 for the default ``gn_groups=4``).
        gn_groups: number of GroupNorm groups when ``norm="group"``.
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int] = (1, 28, 28),
        num_classes: int = 10,
        norm: str = "none",
        gn_groups: int = 4,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        padding = 2 if (h, w) == (28, 28) else 0
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, kernel_size=5, padding=padding),
            conv_norm(norm, 6, gcd(gn_groups, 6)),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            conv_norm(norm, 16, gn_groups),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.flat_dim = int(self.features(torch.zeros(1, c, h, w)).shape[1])
        self.classifier = nn.Sequential(
            nn.Linear(self.flat_dim, 120),
            nn.ReLU(inplace=False),
            nn.Linear(120, 84),
            nn.ReLU(inplace=False),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
