"""ResNet-20 with GroupNorm, exactly as in the official GEP code.

Reference: Da Yu, Huishuai Zhang, Wei Chen, Tie-Yan Liu, "Do Not Let Privacy
Overbill Utility: Gradient Embedding Perturbation for Private Learning" (ICLR 2021),
code: https://github.com/dayu11/Gradient-Embedding-Perturbation
(``models/resnet_cifar.py``; also ``vision/GEP`` in
https://github.com/dayu11/Differentially-Private-Deep-Learning).

Architecture (CIFAR ResNet of He et al. 2016 with BatchNorm replaced by
``GroupNorm(4, C, affine=False)``):

* stem: conv3x3(C_in -> 16, no bias) - GN - ReLU
* 3 stages x 3 ``BasicBlock`` with widths 16 / 32 / 64 and strides 1 / 2 / 2;
  ``BasicBlock`` = conv3x3 - GN - ReLU - conv3x3 - GN, plus shortcut, then ReLU
* downsampling shortcut is parameter-free: ``AvgPool2d(1, stride=2)`` (a strided
  subsample) - ``GroupNorm(4, in_planes, affine=False)`` - concatenation with zeros
  to double the channel count (option "A" of He et al. with a GN)
* ``AdaptiveAvgPool2d(1)`` - ``Linear(64 -> num_classes)`` (with bias)
* conv weights ~ N(0, 2 / (k*k*out_channels)); the linear layer keeps PyTorch's default init.

Trainable parameters for 3x32x32 inputs and 10 classes: 268,346 (all GroupNorms are
parameter-free).  The number of input channels is taken from ``in_shape`` so 1x28x28
inputs also work.  No BatchNorm and no in-place ops, so per-example gradients via
``torch.func.vmap(grad(functional_call(...)))`` work.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BasicBlock", "ParameterFreeShortcut", "ResNetGN", "WSConv2d", "conv3x3", "resnet20",
]  # fmt: skip


class WSConv2d(nn.Conv2d):
    """A convolution of standardized weights (``model.ws=true``; De et al. 2022, after Qiao
    et al. 2019 and Brock et al. 2021's scaled form, as jax_privacy's ``WSConv2D``):

        w_hat[o] = gain[o] (w[o] - mean(w[o])) / sqrt(max(fan_in var(w[o]), eps)),

    mean and (biased) variance over each output channel's ``fan_in = C_in kh kw`` weights,
    ``gain`` a trainable per-channel scale (ones at first), ``eps = 1e-4``. A reparametrized
    convolution: per-example gradients reach ``weight`` through the standardization, so
    ghost clipping materializes them by its exact fallback (vmap of vjp), not a conv rule.
    """

    def __init__(self, *args, eps: float = 1e-4, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(self.out_channels))

    def standardized_weight(self) -> torch.Tensor:
        w = self.weight
        var, mean = torch.var_mean(w, dim=(1, 2, 3), correction=0, keepdim=True)
        scale = torch.rsqrt(torch.clamp(var * w[0].numel(), min=self.eps))
        return (w - mean) * scale * self.gain.view(-1, 1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.standardized_weight(), self.bias)


def conv3x3(in_planes: int, out_planes: int, stride: int = 1, ws: bool = False) -> nn.Conv2d:
    """3x3 convolution, padding 1, no bias (``ws``: of standardized weights)."""
    cls = WSConv2d if ws else nn.Conv2d
    return cls(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class ParameterFreeShortcut(nn.Module):
    """Shortcut for a change of shape without parameters.

    ``AvgPool2d(1, stride)`` (strided subsampling) followed by
    ``GroupNorm(groups, in_planes, affine=False)`` and zero channels appended so that
    the output has ``out_planes`` channels.  When ``out_planes == 2 * in_planes`` this
    is exactly the GEP/RGP ``torch.cat((s, torch.zeros_like(s)), 1)``; otherwise the
    missing ``out_planes - in_planes`` channels are zero-padded.
    """

    def __init__(self, in_planes: int, out_planes: int, stride: int, groups: int) -> None:
        super().__init__()
        if out_planes < in_planes:
            raise ValueError(
                f"parameter-free shortcut cannot reduce channels ({in_planes} -> {out_planes})"
            )
        self.in_planes = in_planes
        self.out_planes = out_planes
        self.pool = nn.AvgPool2d(1, stride=stride)
        self.norm = nn.GroupNorm(groups, in_planes, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.norm(self.pool(x))
        extra = self.out_planes - self.in_planes
        if extra == 0:
            return s
        if extra == self.in_planes:
            return torch.cat((s, torch.zeros_like(s)), dim=1)
        # Pad the channel dimension (dim 1) with zeros at the end.
        return F.pad(s, (0, 0, 0, 0, 0, extra))

    def extra_repr(self) -> str:
        return f"{self.in_planes} -> {self.out_planes}"


class BasicBlock(nn.Module):
    """GEP post-activation basic block: conv-GN-ReLU-conv-GN (+ shortcut) - ReLU."""

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, gn_groups: int = 4, ws: bool = False
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_planes, planes, stride, ws)
        self.gn1 = nn.GroupNorm(gn_groups, planes, affine=False)
        self.relu = nn.ReLU(inplace=False)
        self.conv2 = conv3x3(planes, planes, ws=ws)
        self.gn2 = nn.GroupNorm(gn_groups, planes, affine=False)
        # As in the GEP code, only strided blocks get a (parameter-free) downsample;
        # every strided block of resnet20 also doubles the width.
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.downsample = ParameterFreeShortcut(in_planes, planes, stride, gn_groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNetGN(nn.Module):
    """CIFAR-style ResNet with GroupNorm (GEP code).  ``layers`` = blocks per stage."""

    def __init__(
        self,
        layers: tuple[int, int, int] = (3, 3, 3),
        in_channels: int = 3,
        num_classes: int = 10,
        gn_groups: int = 4,
        ws: bool = False,
    ) -> None:
        super().__init__()
        self.in_planes, self.ws = 16, ws
        self.conv1 = conv3x3(in_channels, 16, ws=ws)
        self.gn1 = nn.GroupNorm(gn_groups, 16, affine=False)
        self.relu = nn.ReLU(inplace=False)
        self.layer1 = self._make_layer(16, layers[0], 1, gn_groups)
        self.layer2 = self._make_layer(32, layers[1], 2, gn_groups)
        self.layer3 = self._make_layer(64, layers[2], 2, gn_groups)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))

    def _make_layer(self, planes: int, blocks: int, stride: int, gn_groups: int) -> nn.Sequential:
        layers = [BasicBlock(self.in_planes, planes, stride, gn_groups, self.ws)]
        self.in_planes = planes
        layers.extend(BasicBlock(planes, planes, 1, gn_groups, self.ws) for _ in range(1, blocks))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.gn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet20(
    in_shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    gn_groups: int = 4,
    ws: bool = False,
) -> ResNetGN:
    """ResNet-20 (3 blocks per stage) of the GEP code; 268,346 parameters on CIFAR-10
    (``ws``: weight-standardized convolutions, one gain per output channel more)."""
    return ResNetGN(
        (3, 3, 3), in_channels=in_shape[0], num_classes=num_classes, gn_groups=gn_groups, ws=ws
    )
