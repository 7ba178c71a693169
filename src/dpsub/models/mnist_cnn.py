"""Small CNN for MNIST-like data used by the PDP-SGD authors.

The architecture is the 4-layer "tanh/ReLU CNN" popularised by Papernot et al.,
"Tempered Sigmoid Activations for Deep Learning with Differential Privacy"
(AAAI 2021) and the Opacus MNIST example, and used (with ReLU) by Zhou, Wu &
Banerjee, "Bypassing the Ambient Dimension: Private SGD with Gradient Subspace
Identification" (PDP-SGD, ICLR 2021) for their MNIST / Fashion-MNIST experiments:

    Conv(C->16, 8x8, stride 2, padding 3) - ReLU - MaxPool(2, stride 1)
    Conv(16->32, 4x4, stride 2)           - ReLU - MaxPool(2, stride 1)
    flatten - Linear(-> 32) - ReLU - Linear(32 -> num_classes)

For a 1x28x28 input the flattened feature size is 32*4*4 = 512 and the network
has 26,010 parameters with 10 classes.  The flatten size is computed from
``in_shape`` by a dummy forward pass, so e.g. 3x32x32 inputs also work.

The model contains no BatchNorm and no in-place operations, so per-example
gradients can be computed with ``torch.func.vmap(grad(functional_call(...)))``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MnistCNN", "conv_norm"]


def conv_norm(norm: str, channels: int, gn_groups: int) -> nn.Module:
    """Return the normalisation layer placed after a conv (``Identity`` for ``"none"``)."""
    if norm == "none":
        return nn.Identity()
    if norm == "group":
        if channels % gn_groups != 0:
            raise ValueError(
                f"gn_groups={gn_groups} must divide the number of channels ({channels})"
            )
        return nn.GroupNorm(gn_groups, channels)
    raise ValueError(f"Unknown norm {norm!r}; expected 'none' or 'group'")


class MnistCNN(nn.Module):
    """The PDP-SGD / Opacus MNIST CNN (26,010 parameters on 1x28x28, 10 classes).

    Args:
        in_shape: ``(C, H, W)`` of one input example.
        num_classes: number of output logits.
        norm: ``"none"`` (paper architecture) or ``"group"`` to insert
            ``GroupNorm(gn_groups, channels)`` (affine) after each conv, before the ReLU.
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
        self.features = nn.Sequential(
            nn.Conv2d(c, 16, kernel_size=8, stride=2, padding=3),
            conv_norm(norm, 16, gn_groups),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(2, stride=1),
            nn.Conv2d(16, 32, kernel_size=4, stride=2),
            conv_norm(norm, 32, gn_groups),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(2, stride=1),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.flat_dim = int(self.features(torch.zeros(1, c, h, w)).shape[1])
        self.classifier = nn.Sequential(
            nn.Linear(self.flat_dim, 32),
            nn.ReLU(inplace=False),
            nn.Linear(32, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
