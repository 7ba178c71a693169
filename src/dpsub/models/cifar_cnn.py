"""The CIFAR-10 CNN of Abadi et al. (2016), used by DP-Hero (Zheng et al., Section V-A2):

    Conv(C->64, 5x5, padding 2) - ReLU - MaxPool(2)
    Conv(64->64, 5x5, padding 2) - ReLU - MaxPool(2)
    flatten - Linear(->384) - ReLU - Linear(384->384) - ReLU - Linear(384->num_classes)

The DP-Hero paper gives the kernel size, the ReLU, the 2x2 max-pooling and the two fully
connected layers of 384 units; the 64 channels and the "same" padding come from Abadi et
al. ("the first convolution outputs a 64 x 24 x 24 tensor" for 24 x 24 crops). On 3x32x32
inputs the flattened size is 64*8*8 = 4096 and the network has 1,832,266 parameters with
10 classes (the flatten size is computed from ``in_shape``, so 1x28x28 inputs work too).
No BatchNorm, no in-place operations (``torch.func`` / vmap friendly).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CifarCNN"]


class CifarCNN(nn.Module):
    """Two 5x5 conv + max-pool blocks, two fully connected layers of ``hidden`` units.

    Args:
        in_shape: ``(C, H, W)`` of one input example.
        num_classes: number of output logits.
        channels: output channels of both convolutions (Abadi et al.: 64).
        hidden: units of both fully connected layers (384).
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int] = (3, 32, 32),
        num_classes: int = 10,
        channels: int = 64,
        hidden: int = 384,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, kernel_size=5, padding=2),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, kernel_size=5, padding=2),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.flat_dim = int(self.features(torch.zeros(1, c, h, w)).shape[1])
        self.classifier = nn.Sequential(
            nn.Linear(self.flat_dim, hidden),
            nn.ReLU(inplace=False),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=False),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
