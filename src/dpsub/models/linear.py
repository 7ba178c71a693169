"""Models on frozen features (docs/features.md).

* :class:`Linear`: a linear classifier on the flattened input, ``p = (C H W + 1) K``
  (GEP's Appendix A and Tramer & Boneh's "ScatterNet + linear").
* :class:`MLP`: one hidden ReLU layer on the flattened input (a small head on frozen
  features, e.g. the non-private ceiling beside the linear probe).
* :class:`ScatterCNN`: Tramer & Boneh's small CNN on ScatterNet features (ICLR 2021,
  Table 9 layout for CIFAR-10: conv 3x3 -> tanh -> max-pool 2 -> conv 3x3 -> tanh ->
  linear; no normalization layer: the features are normalized before they get here).
"""

from __future__ import annotations

import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        c, h, w = in_shape
        self.fc = nn.Linear(c * h * w, num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


class MLP(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, hidden: int = 256):
        super().__init__()
        c, h, w = in_shape
        self.fc1 = nn.Linear(c * h * w, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class ScatterCNN(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, channels: int = 64):
        super().__init__()
        c, h, w = in_shape
        if h < 2 or w < 2:
            raise ValueError(f"scatter_cnn needs feature maps of at least 2x2, got {h}x{w}")
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 3, padding=1), nn.Tanh(),
        )  # fmt: skip
        self.fc = nn.Linear(channels * (h // 2) * (w // 2), num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))
