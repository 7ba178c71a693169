"""Model zoo for ``dpsub``.

All models are free of BatchNorm and in-place operations, so per-example gradients can
be computed with ``torch.func.vmap(grad(functional_call(model, params, x.unsqueeze(0))))``.

Registry (``MODELS``), each entry called as ``ctor(in_shape, num_classes, **kwargs)``:

* ``"mnist_cnn"`` -- :class:`~dpsub.models.mnist_cnn.MnistCNN`, the PDP-SGD / Opacus
  MNIST CNN (26,010 params on 1x28x28).  kwargs: ``norm`` ("none" | "group"), ``gn_groups``.
* ``"lenet"`` -- :class:`~dpsub.models.lenet.LeNet`, LeNet-5 style.  kwargs: ``norm``, ``gn_groups``.
* ``"resnet20"`` -- :func:`~dpsub.models.resnet.resnet20`, GEP's GroupNorm ResNet-20
  (268,346 params on CIFAR-10).  kwargs: ``gn_groups`` (default 4), ``ws`` (False:
  weight-standardized convolutions, :class:`~dpsub.models.resnet.WSConv2d`).
* ``"wrn"`` -- :func:`~dpsub.models.wrn.wrn`, RGP's pre-activation GroupNorm WRN.
  kwargs: ``depth`` (28), ``width`` (4), ``gn_groups`` (32), ``ws`` (False).
* ``"cifar_cnn"`` -- :class:`~dpsub.models.cifar_cnn.CifarCNN`, Abadi et al.'s CIFAR-10 CNN
  (DP-Hero's; 1,832,266 params on CIFAR-10).  kwargs: ``channels`` (64), ``hidden`` (384).
* ``"linear"`` -- :class:`~dpsub.models.linear.Linear`, a linear classifier (frozen features).
* ``"scatter_cnn"`` -- :class:`~dpsub.models.linear.ScatterCNN`, Tramer & Boneh's CNN on
  ScatterNet features.  kwargs: ``channels`` (64).
* ``"mlp"`` -- :class:`~dpsub.models.linear.MLP`, one hidden ReLU layer (frozen features).
  kwargs: ``hidden`` (256).
* ``"custom"`` -- :func:`~dpsub.models.custom.build_custom`, a user's ``nn.Module`` class
  named by ``_target_`` (``model=custom model._target_=my_pkg.MyNet``); every other kwarg
  is the class's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODELS", "MODEL_OPTIONS", "build_model", "count_parameters", "model_class"]

#: name -> "module:constructor". Imported only when a model is built, so that the config
#: validator can check names without importing torch's model code.
MODELS: dict[str, str] = {
    "mnist_cnn": "dpsub.models.mnist_cnn:MnistCNN",
    "lenet": "dpsub.models.lenet:LeNet",
    "resnet20": "dpsub.models.resnet:resnet20",
    "wrn": "dpsub.models.wrn:wrn_for_shape",
    "cifar_cnn": "dpsub.models.cifar_cnn:CifarCNN",
    "linear": "dpsub.models.linear:Linear",
    "scatter_cnn": "dpsub.models.linear:ScatterCNN",
    "mlp": "dpsub.models.linear:MLP",
    "custom": "dpsub.models.custom:build_custom",
}

#: name -> the keyword options its constructor takes (besides in_shape and num_classes),
#: so the validator can refuse an unknown ``model.*`` key without importing torch; a test
#: keeps them equal to the constructors' signatures.
MODEL_OPTIONS: dict[str, tuple[str, ...]] = {
    "mnist_cnn": ("norm", "gn_groups"),
    "lenet": ("norm", "gn_groups"),
    "resnet20": ("gn_groups", "ws"),
    "wrn": ("depth", "width", "gn_groups", "ws"),
    "cifar_cnn": ("channels", "hidden"),
    "linear": (),
    "scatter_cnn": ("channels",),
    "mlp": ("hidden",),
    "custom": ("_target_",),  # and any keyword its class takes (dpsub.models.custom)
}


def model_class(name: str) -> Callable[..., nn.Module]:
    """The constructor registered as ``name``, called as ``ctor(in_shape, num_classes, **kw)``."""
    if name not in MODELS:
        raise ValueError(f"Unknown model {name!r}; valid names are: {', '.join(sorted(MODELS))}")
    module, attr = MODELS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int, **kwargs) -> nn.Module:
    """Instantiate the registered model ``name`` for inputs of shape ``in_shape = (C, H, W)``.

    Extra ``kwargs`` are forwarded to the model constructor.

    Raises:
        ValueError: if ``name`` is not registered (the message lists the valid names)
            or ``in_shape`` is not a 3-tuple.
    """
    ctor = model_class(name)
    in_shape = tuple(int(s) for s in in_shape)
    if len(in_shape) != 3:
        raise ValueError(f"in_shape must be (C, H, W), got {in_shape}")
    return ctor(in_shape, num_classes, **kwargs)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable, by default) parameter scalars in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
