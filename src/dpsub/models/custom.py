"""A user's model class, named by ``model=custom model._target_=my_pkg.MyNet`` (Hydra style).

The other ``model.*`` keys are the class's keyword arguments (``+model.width=32`` on the
command line, since ``conf/model/custom.yaml`` does not declare them). The class also
receives ``in_shape=(C, H, W)`` and ``num_classes=K`` of the dataset, as keywords, when its
signature names them (or takes ``**kwargs``); a class that does not name them is built from
its keyword arguments alone. A name that cannot be imported, or that is not an
``nn.Module`` subclass, is a :class:`~dpsub.errors.ConfigError` naming ``model._target_``.
"""

from __future__ import annotations

import importlib
import inspect

from torch import nn

from dpsub.errors import ConfigError

__all__ = ["build_custom", "target_class"]

KEY = "model._target_"


def target_class(target: object) -> type[nn.Module]:
    """The ``nn.Module`` subclass ``target`` (``"package.module.Class"``) names."""
    if not isinstance(target, str) or "." not in target:
        raise ConfigError(f"{KEY}: give the class as package.module.Class, got {target!r}")
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{KEY}: cannot import {target!r} ({type(e).__name__}: {e})") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigError(f"{KEY}: {target!r} is not an nn.Module class (got {cls!r})")
    return cls


def build_custom(in_shape, num_classes: int, _target_: object = None, **kwargs) -> nn.Module:
    """``cls(**kwargs)``, with ``in_shape`` / ``num_classes`` where its signature takes them."""
    cls = target_class(_target_)
    params = inspect.signature(cls).parameters
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = {"in_shape": tuple(in_shape), "num_classes": int(num_classes)}
    for name, value in given.items():
        if (name in params or any_kw) and name not in kwargs:
            kwargs[name] = value
    return cls(**kwargs)
