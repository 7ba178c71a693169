"""The auxiliary data sources and their options, declared once (no torch, no numpy).

Each source of the ``aux`` config group is one :class:`AuxSource` in
:data:`AUX_SOURCES`: its options with their defaults, whether it has labels, the
number of classes of its own labels and a one-line summary. The loaders in
:mod:`dpsub.data.aux` register under these names (a loader for an undeclared name
is refused), and :func:`check_aux_config` validates a config against them, so the
config check, ``--help`` text and tooling can use the declarations without
importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dpsub.errors import ConfigError

__all__ = [
    "AUX_SOURCES",
    "LABEL_MODES",
    "NATURAL_DEFAULT_FILE",
    "AuxSource",
    "aux_options",
    "check_aux_config",
    "label_mode",
]

#: ``random_per_step``: fresh random labels at every use (GEP paper); ``random_once``:
#: random labels drawn once from the seed (GEP's code); ``true``: the source's labels.
LABEL_MODES = ("random_per_step", "random_once", "true")
NATURAL_DEFAULT_FILE = "aux/tinyimagenet_val_32x32.npz"  # relative to data.root


@dataclass(frozen=True)
class AuxSource:
    """One auxiliary data source: its name, options and labels."""

    name: str
    #: every option (``name`` aside) with its default
    defaults: Mapping[str, Any]
    #: whether ``aux.labels=true`` is possible
    has_labels: bool
    #: classes of the source's own labels, where not the private data's (None)
    num_classes: int | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))


#: num_samples: m, drawn without replacement (deterministic in the seed); labels: one of
#: LABEL_MODES; seed: the selection (or noise) seed, None: the run seed. ``path`` and
#: ``download``: see each source. These are the only defaults: conf/aux/<name>.yaml takes them.
_COMMON = {"num_samples": 2000, "labels": "random_per_step", "seed": None}

#: The declared sources, ``none`` (no auxiliary data) aside.
AUX_SOURCES: Mapping[str, AuxSource] = MappingProxyType({s.name: s for s in (
    AuxSource(
        "natural", {**_COMMON, "path": None}, has_labels=False,
        summary="natural images from an .npz of uint8 RGB images (aux.path; default "
        f"<data.root>/{NATURAL_DEFAULT_FILE}), GEP's public data",
    ),
    AuxSource(
        "cifar100", {**_COMMON, "path": None, "download": False}, has_labels=True,
        num_classes=100,
        summary="CIFAR-100 training images (<data.root>/cifar-100-python/train, or aux.path: "
        "an .npz with 'images' and, for labels=true, 'labels' 0-99)",
    ),
    AuxSource(
        "heldout_test", _COMMON, has_labels=True,
        summary="m examples of the private test split, removed from the evaluation set",
    ),
    AuxSource(
        "public_train", {**_COMMON, "num_samples": 100, "labels": "true", "pick": "hash"},
        has_labels=True,
        summary="about m examples of the private train split, each by a hash of its own "
        "bytes, removed from it (PDP-SGD: m=100; pick=balanced: exactly m, class-balanced, "
        "chosen with every private label: not covered by epsilon)",
    ),
    AuxSource(
        "gaussian", _COMMON, has_labels=False,
        summary="N(0, 1) noise images in the private shape (a sanity baseline)",
    ),
)})  # fmt: skip


def aux_options(options: Any) -> dict[str, Any]:
    """A plain dict from a dict or an OmegaConf node (interpolations resolved)."""
    from omegaconf import DictConfig, OmegaConf

    if options is None:
        return {"name": "none"}
    if isinstance(options, DictConfig):
        return dict(OmegaConf.to_container(options, resolve=True))
    if isinstance(options, Mapping):
        return dict(options)
    raise TypeError(f"aux config must be a mapping, got {type(options).__name__}")


def label_mode(value: Any) -> Any:
    """YAML and Hydra turn ``labels: true`` into the boolean True: map it back."""
    return "true" if value is True else value


def check_aux_config(options: Any) -> None:
    """Validate the options of the ``aux`` group; raise ``ConfigError`` naming the key.

    Checks the source name, unknown options, ``num_samples``, ``labels`` (``true``
    only for sources with labels), ``seed`` and the source-specific options. Checks
    that need the data (sizes, class counts) happen in :func:`dpsub.data.aux.build_aux`.
    """
    opts = aux_options(options)
    name = opts.get("name", "none")
    if name == "none":
        extra = sorted(k for k in opts if k != "name")
        if extra:
            raise ConfigError(
                f"aux.{extra[0]}: unknown option for aux source none; valid options: ['name']"
            )
        return
    if name not in AUX_SOURCES:
        raise ConfigError(
            f"aux.name: unknown auxiliary data source {name!r}; "
            f"choose from {['none', *AUX_SOURCES]}"
        )
    source = AUX_SOURCES[name]
    valid = ["name", *source.defaults]
    for key in opts:
        if key not in valid:
            raise ConfigError(
                f"aux.{key}: unknown option for aux source {name}; valid options: {sorted(valid)}"
            )
    o = {**source.defaults, **opts}
    _check_num_samples(o["num_samples"])
    _check_labels(o["labels"], source)
    _check_seed(o["seed"])
    if "path" in o:
        _check_path(o["path"])
    if "pick" in o and o["pick"] not in ("hash", "balanced"):
        raise ConfigError(f"aux.pick: must be hash or balanced, got {o['pick']!r}")
    if "download" in o and not isinstance(o["download"], bool):
        raise ConfigError(f"aux.download: must be true or false, got {o['download']!r}")


def _check_num_samples(m: Any) -> None:
    if isinstance(m, bool) or not isinstance(m, int):
        raise ConfigError(f"aux.num_samples: must be an integer >= 1, got {m!r}")
    if m < 1:
        raise ConfigError(f"aux.num_samples: must be >= 1, got {m!r}")


def _check_labels(value: Any, source: AuxSource) -> None:
    labels = label_mode(value)
    if labels not in LABEL_MODES:
        raise ConfigError(f"aux.labels: must be one of {LABEL_MODES}, got {value!r}")
    if labels == "true" and not source.has_labels:
        raise ConfigError(
            f"aux.labels: 'true' needs labels, but aux source {source.name} has none; "
            "use random_per_step (GEP paper) or random_once (GEP code)"
        )


def _check_seed(seed: Any) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"aux.seed: must be an integer or null, got {seed!r}")


def _check_path(path: Any) -> None:
    if path is not None and (not isinstance(path, (str, Path)) or not str(path)):
        raise ConfigError(f"aux.path: must be a file path or null, got {path!r}")
