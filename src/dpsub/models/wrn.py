"""Pre-activation wide ResNet with GroupNorm, following the RGP authors' code.

Reference: Da Yu, Huishuai Zhang, Wei Chen, Jian Yin, Tie-Yan Liu, "Large Scale
Private Learning via Low-rank Reparametrization" (RGP, ICML 2021), code:
https://github.com/dayu11/Differentially-Private-Deep-Learning
(``vision/RGP/models/resnet_cifar.py``, ``resnet28``).  This is the plain network,
without RGP's low-rank gradient-carrier reparametrisation (that lives in the RGP
mechanism, not the model).  Architecture (WRN of Zagoruyko & Komodakis 2016):

* stem: conv3x3(C_in -> 16k, no bias), no norm/activation (pre-activation net)
* 3 stages of n = (depth - 4) / 6 pre-activation blocks with widths 16k / 32k / 64k
  and strides 1 / 2 / 2; block = GN - ReLU - conv3x3 - GN - ReLU - conv3x3 (no bias)
  plus shortcut (no activation after the addition)
* shortcut: identity, or when the shape changes the parameter-free
  ``AvgPool2d(1, stride)`` - ``GroupNorm(affine=False)`` applied to the block input,
  with zero channels appended (concat with zeros when the width doubles, zero-padding
  of the missing channels otherwise)
* head: GN - ReLU - global average pool - ``Linear(64k -> num_classes, bias=False)``
* every GroupNorm is ``affine=False`` with ``min(gn_groups, channels)`` groups
  (``gn_groups=32`` as in the RGP code; if that does not divide the channel count,
  ``gcd(gn_groups, channels)`` is used)
* conv weights ~ N(0, 2 / (k*k*out_channels)).

Parameter counts for 3x32x32 inputs and 10 classes: WRN-28-4 (widths 64/128/256)
has 5,828,800 parameters; WRN-28-2 has 1,458,272 -- the "~1.5M" quoted for
"WRN28-4" in the RGP paper matches width 2, so ``width`` is an explicit kwarg.
No BatchNorm and no in-place ops (``torch.func`` / vmap friendly).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .resnet import ParameterFreeShortcut, conv3x3

__all__ = ["PreActBlock", "WideResNetGN", "gn_num_groups", "wrn"]


def gn_num_groups(channels: int, max_groups: int = 32) -> int:
    """``min(max_groups, channels)`` if it divides ``channels``, else ``gcd(max_groups, channels)``."""
    g = min(max_groups, channels)
    return g if channels % g == 0 else math.gcd(max_groups, channels)


class PreActBlock(nn.Module):
    """Pre-activation block: GN-ReLU-conv-GN-ReLU-conv + shortcut(x)."""

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, gn_groups: int = 32, ws: bool = False
    ) -> None:
        super().__init__()
        self.gn1 = nn.GroupNorm(gn_num_groups(in_planes, gn_groups), in_planes, affine=False)
        self.conv1 = conv3x3(in_planes, planes, stride, ws)
        self.gn2 = nn.GroupNorm(gn_num_groups(planes, gn_groups), planes, affine=False)
        self.conv2 = conv3x3(planes, planes, ws=ws)
        self.relu = nn.ReLU(inplace=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = ParameterFreeShortcut(
                in_planes, planes, stride, gn_num_groups(in_planes, gn_groups)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.relu(self.gn1(x)))
        out = self.conv2(self.relu(self.gn2(out)))
        identity = x if self.shortcut is None else self.shortcut(x)
        return out + identity


class WideResNetGN(nn.Module):
    """Pre-activation WRN-``depth``-``width`` with parameter-free GroupNorm (RGP code)."""

    def __init__(
        self,
        depth: int = 28,
        width: int = 4,
        num_classes: int = 10,
        in_channels: int = 3,
        gn_groups: int = 32,
        ws: bool = False,
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"WRN depth must be 6n+4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        k = width
        widths = (16 * k, 32 * k, 64 * k)
        self.depth, self.width = depth, width
        self.conv1 = conv3x3(in_channels, widths[0], ws=ws)
        in_planes = widths[0]
        stages = []
        for planes, stride in zip(widths, (1, 2, 2), strict=True):
            blocks = [PreActBlock(in_planes, planes, stride, gn_groups, ws)]
            blocks.extend(PreActBlock(planes, planes, 1, gn_groups, ws) for _ in range(1, n))
            stages.append(nn.Sequential(*blocks))
            in_planes = planes
        self.layer1, self.layer2, self.layer3 = stages
        self.gn = nn.GroupNorm(gn_num_groups(widths[2], gn_groups), widths[2], affine=False)
        self.relu = nn.ReLU(inplace=False)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[2], num_classes, bias=False)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n_fan = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n_fan))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.relu(self.gn(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def wrn(
    depth: int = 28,
    width: int = 4,
    num_classes: int = 10,
    in_channels: int = 3,
    gn_groups: int = 32,
    ws: bool = False,
) -> WideResNetGN:
    """Build a pre-activation WRN-``depth``-``width`` (RGP code); see module docstring
    (``ws``: weight-standardized convolutions, :class:`~dpsub.models.resnet.WSConv2d`)."""
    return WideResNetGN(
        depth=depth,
        width=width,
        num_classes=num_classes,
        in_channels=in_channels,
        gn_groups=gn_groups,
        ws=ws,
    )


def wrn_for_shape(in_shape: tuple[int, int, int], num_classes: int, **kwargs) -> WideResNetGN:
    """The registry's constructor: ``wrn`` for inputs of shape ``in_shape``."""
    return wrn(num_classes=num_classes, in_channels=in_shape[0], **kwargs)
