"""Small models shared by the unit and e2e suites."""

from __future__ import annotations

import torch
from torch import nn


class ConvGN(nn.Module):
    """A conv + affine GroupNorm model (the Opacus backend's hard case)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.head = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


class TinyNet(nn.Module):
    def __init__(self, d=12, h=16, c=4):
        super().__init__()
        self.body = nn.Linear(d, h)
        self.head = nn.Linear(h, c)

    def forward(self, x):
        return self.head(torch.relu(self.body(x.flatten(1))))


class GNConvNet(nn.Module):
    """A user's model for ``model=custom`` (tests/integration/test_custom_model.py): conv,
    GroupNorm, pooled head; built from ``in_shape`` / ``num_classes`` and a keyword."""

    def __init__(self, in_shape, num_classes, width=4):
        super().__init__()
        self.conv = nn.Conv2d(in_shape[0], width, 3, padding=1)
        self.norm = nn.GroupNorm(2, width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


class BNConvNet(GNConvNet):
    """:class:`GNConvNet` with BatchNorm: refused for private training."""

    def __init__(self, in_shape, num_classes, width=4):
        super().__init__(in_shape, num_classes, width)
        self.norm = nn.BatchNorm2d(width)


def gn_convnet(num_classes, width=4, **kwargs):
    """A factory function for ``model=custom`` (as torchvision's ``resnet18``): it names
    ``num_classes`` and passes its ``**kwargs`` on (it gets no ``in_shape``)."""
    return GNConvNet((1, 28, 28), num_classes, width, **kwargs)


def not_a_model(num_classes):
    return {"num_classes": num_classes}
