"""A user's model, named by ``model=custom model._target_=my_pkg.MyNet`` (Hydra style).

``_target_`` is an ``nn.Module`` class or a function that returns a module (a factory such
as ``torchvision.models.resnet18``). The other ``model.*`` keys are its keyword arguments
(``+model.width=32`` on the command line, since ``conf/model/custom.yaml`` does not declare
them). It also receives ``in_shape=(C, H, W)`` and ``num_classes=K`` of the dataset, as
keywords, when its signature names them; a class that takes ``**kwargs`` gets them too, a
function does not (factories pass their ``**kwargs`` on to classes that may not take them).
A name that cannot be imported, that is neither, or a function that returns no module is a
:class:`~dpsub.errors.ConfigError` naming ``model._target_``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from torch import nn

from dpsub.errors import ConfigError

__all__ = ["build_custom", "model_maker"]

KEY = "model._target_"


def model_maker(target: object) -> type[nn.Module] | Callable[..., nn.Module]:
    """The ``nn.Module`` subclass or the function ``target`` (``"package.module.Name"``)
    names."""
    if not isinstance(target, str) or "." not in target:
        raise ConfigError(f"{KEY}: name the model class, as package.module.Class, got {target!r}")
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{KEY}: cannot import {target!r} ({type(e).__name__}: {e})") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) or inspect.isfunction(cls)):
        raise ConfigError(
            f"{KEY}: {target!r} is neither an nn.Module class nor a function (got {cls!r})"
        )
    return cls


def build_custom(in_shape, num_classes: int, _target_: object = None, **kwargs) -> nn.Module:
    """``target(**kwargs)``, with ``in_shape`` / ``num_classes`` where it takes them."""
    make = model_maker(_target_)
    params = inspect.signature(make).parameters
    any_kw = isinstance(make, type) and any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    given = {"in_shape": tuple(in_shape), "num_classes": int(num_classes)}
    for name, value in given.items():
        if (name in params or any_kw) and name not in kwargs:
            kwargs[name] = value
    model = make(**kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{KEY}: {_target_!r} returned {type(model).__name__}, not an nn.Module")
    return model
