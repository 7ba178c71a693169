"""``cifar100_resnet``: a small GroupNorm ResNet trained non-privately on public CIFAR-100.

The images are the genuine CIFAR-100 training images in ``features.pretrain_path``
(default the first 10,000 of torchvision's CIFAR-100 under data.root, or an npz of them:
``features/public.py``): public data here, never the private set. Trained once (a few CPU-minutes), its weights cached in ``features.cache_dir``
under a key of the training options and the file's hash; the extractor's identity carries
the hash of the weights themselves, so retrained weights never reuse stale features.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dpsub.features.extractors import file_hash, state_hash

log = logging.getLogger("dpsub.features")


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(8, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(8, cout)
        self.skip = None if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride)

    def forward(self, x):
        h = F.relu(self.n1(self.c1(x)))
        h = self.n2(self.c2(h))
        return F.relu(h + (x if self.skip is None else self.skip(x)))


class SmallResNet(nn.Module):
    """stem 3->w, three stages (w, 2w, 4w; strides 1, 2, 2), global average pool: 4w features."""

    def __init__(self, width: int = 32, num_classes: int = 100):
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.GroupNorm(8, w), nn.ReLU()
        )
        self.stages = nn.Sequential(Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2))
        self.fc = nn.Linear(4 * w, num_classes)

    def features(self, x):  # x: [0, 1] images, normalized inside with fixed constants
        x = (x - 0.5) / 0.25
        return F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1)

    def forward(self, x):
        return self.fc(self.features(x))


class FeaturesOf(nn.Module):
    def __init__(self, net: SmallResNet):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net.features(x)


def _train(net: SmallResNet, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    batches = max(1, len(x) // 128)  # fewer than 128 images: one batch of them all
    steps = epochs * batches
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    net.train()
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        total = 0.0
        for i in range(batches):
            idx = perm[i * 128 : (i + 1) * 128]
            xb = _augment(x[idx], g)
            loss = F.cross_entropy(net(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach())
        log.info(
            "cifar100_resnet pretraining: epoch %d/%d, loss %.3f",
            epoch + 1,
            epochs,
            total / batches,
        )
    net.eval()


def _augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random crop (pad 4) and horizontal flip."""
    n = len(x)
    padded = F.pad(x, (4, 4, 4, 4), mode="reflect")
    dx, dy = torch.randint(0, 9, (2,), generator=g).tolist()
    out = padded[:, :, dy : dy + 32, dx : dx + 32]
    flip = torch.rand(n, generator=g) < 0.5
    return torch.where(flip.view(n, 1, 1, 1), out.flip(3), out)


def _pretrain_data(path: Path, root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Images in [0, 1] (n, 3, 32, 32) and fine labels: all of an npz, or the first 10,000
    of torchvision's CIFAR-100 (what the npz default holds)."""
    from dpsub.errors import DataError
    from dpsub.features.public import PRETRAIN_IMAGES, read_public

    images, labels = read_public(path, root, None if path.suffix == ".npz" else PRETRAIN_IMAGES)
    if labels is None:
        raise DataError(f"features.pretrain_path: {path} has no 'labels' array (0-99)")
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(255.0)
    return x, torch.from_numpy(labels).long()


def load_or_train(opts: dict, root: Path, download: bool = False) -> tuple[nn.Module, dict]:
    """The pretrained body (images in [0, 1] -> (n, 4w)) and its identity; cached."""
    from dpsub.features.public import public_file

    path = public_file(opts, "pretrain_path", root, download)
    width, epochs, seed = (
        int(opts.get("width", 32)),
        int(opts.get("epochs", 15)),
        int(opts.get("seed", 0)),
    )
    spec = {"width": width, "epochs": epochs, "seed": seed, "data": file_hash(path)}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    weights = Path(str(opts["cache_dir"])).expanduser() / f"cifar100_resnet-{key}.pt"
    net = SmallResNet(width)
    if weights.is_file():
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    else:
        x, y = _pretrain_data(path, root)
        torch.manual_seed(seed)
        net = SmallResNet(width)
        _train(net, x.contiguous(), y, epochs, seed)
        weights.parent.mkdir(parents=True, exist_ok=True)
        tmp = weights.with_suffix(f".{os.getpid()}.tmp")  # (two runs may train it at once)
        torch.save(net.state_dict(), tmp)
        tmp.replace(weights)
    net.eval()
    ident = {"name": "cifar100_resnet", **spec, "weights": state_hash(net)}
    return FeaturesOf(net), ident
