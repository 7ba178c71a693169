"""Declared options: ``opt()`` gives a dataclass field its default, range, allowed values
and one-line help; :func:`check_value` checks a value against that declaration.

Torch-free. The config schemas (:mod:`dpsub.config`) and every mechanism's options
(:mod:`dpsub.mechanisms.options`) declare their ranges this way, so a range is written
once, beside the default, and the validator and ``--help`` read it from there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from dpsub.errors import ConfigError

__all__ = ["check_declared", "check_value", "opt"]


def opt(default: Any, *, gt=None, ge=None, lt=None, le=None, choices=None, help: str = ""):
    """A declared option: default, range (gt/ge/lt/le), allowed values and a one-line help.

    A default of None makes the option optional: None is then always accepted.
    """
    meta = {"gt": gt, "ge": ge, "lt": lt, "le": le, "choices": choices, "help": help}
    return field(default=default, metadata=meta)


def check_value(key: str, value: Any, f: dataclasses.Field, typed: bool = False) -> Any:
    """``value`` checked against the declaration ``f`` (ConfigError naming ``key``).

    ``typed``: the type was checked already (an OmegaConf structured node): ranges only.
    """
    m = f.metadata
    if value is None and f.default is None:
        return value
    if f.default is not None and not typed:
        expected = type(f.default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
            raise ConfigError(f"{key}: must be of type {expected.__name__}, got {value!r}")
    if m.get("choices") is not None and value not in m["choices"]:
        raise ConfigError(f"{key}: must be one of {list(m['choices'])}, got {value!r}")
    for bound, ok in (
        ("gt", lambda v, b: v > b),
        ("ge", lambda v, b: v >= b),
        ("lt", lambda v, b: v < b),
        ("le", lambda v, b: v <= b),
    ):
        b = m.get(bound)
        if b is not None and not ok(value, b):
            sign = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[bound]
            raise ConfigError(f"{key}: must be {sign} {b}, got {value!r}")
    return value


def check_declared(node: Any, cls: type, prefix: str) -> None:
    """Check every declared field of the typed ``node`` (a structured OmegaConf node of the
    dataclass ``cls``), nested dataclasses included."""
    for f in dataclasses.fields(cls):
        value = node[f.name]
        if dataclasses.is_dataclass(f.type) or (
            isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
        ):
            check_declared(value, f.default_factory, f"{prefix}.{f.name}")
        elif f.metadata:
            check_value(f"{prefix}.{f.name}", value, f, typed=True)
