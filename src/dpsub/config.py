"""Typed validation of the composed Hydra config, before anything trains.

Hydra already refuses overrides of keys that do not exist (struct mode). This
module adds the rest: types, allowed values and ranges, and keys added with
``+key=...`` that no code reads. Every error is a :class:`ConfigError` whose
message starts with the full key, e.g. ``privacy.epsilon: must be > 0, got -1``.
Mechanism, model and aux options are checked against the constructors that
consume them, so a config file and its class cannot drift apart silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpsub.errors import ConfigError

#: Per-example gradient backends (dpsub.grads.engine.BACKENDS; a test keeps them equal).
BACKENDS = ("vmap", "opacus", "ghost")

__all__ = ["ConfigError", "validate", "check_against_data"]


@dataclass
class DataSchema:
    root: str = "./data"
    download: bool = False


@dataclass
class DatasetSchema:
    name: str = "digits"
    train_size: int | None = None
    balanced: bool = True
    image_size: int | None = None
    use_extra: bool = False
    synthetic: dict[str, Any] | None = None
    validation_size: int | None = None


@dataclass
class PrivacySchema:
    epsilon: float = 2.0
    delta: float = 1e-5
    accountant: str = "rdp"
    sampling: str = "poisson"
    noise_multiplier: float | None = None
    rng: str = "seeded"
    private_diagnostics: bool = False


@dataclass
class ScheduleSchema:
    milestones: list[float] = field(default_factory=list)
    gamma: float = 0.1


@dataclass
class OptimSchema:
    name: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    schedule: ScheduleSchema = field(default_factory=ScheduleSchema)


@dataclass
class TrainSchema:
    epochs: float = 30
    batch_size: int = 256
    max_steps: int | None = None
    eval_every: int = 100
    eval_batch_size: int = 2048
    log_every: int = 10
    checkpoint_every: int = 100
    progress: bool = True


@dataclass
class GradsSchema:
    backend: str = "vmap"
    microbatch: Any = 256  # int >= 1, or "auto" (from available memory)
    compile: bool = False


@dataclass
class LoggerSchema:
    name: str = "wandb"
    mode: str = "auto"
    project: str = "dpsub"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class EvalSchema:
    mia: bool = False
    mia_examples: int | None = None


SCHEMAS = {
    "data": DataSchema,
    "dataset": DatasetSchema,
    "privacy": PrivacySchema,
    "optim": OptimSchema,
    "train": TrainSchema,
    "grads": GradsSchema,
    "logger": LoggerSchema,
    "eval": EvalSchema,
}
TOP_LEVEL = {
    "seed", "device", "resume", "run_name", "out_dir", "model", "mechanism", "aux", *SCHEMAS
}  # fmt: skip


def _typed(group: str, node: DictConfig) -> DictConfig:
    """Merge a group into its schema: wrong types and unknown keys raise ConfigError."""
    try:
        return OmegaConf.merge(OmegaConf.structured(SCHEMAS[group]), node)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or getattr(e, "key", None) or "?"
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{group}.{key}: {msg}") from None


def _require(cond: bool, key: str, msg: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}, got {value!r}")


def validate(cfg: DictConfig) -> DictConfig:
    """Check the whole config; return it unchanged (raises ConfigError).

    Imports nothing heavy (no torch): an invalid config fails in well under a second.
    Model options are checked when the model is built (before anything is written).
    """
    from dpsub.data.aux_options import check_aux_config
    from dpsub.data.names import DATASETS
    from dpsub.mechanisms.options import SPECS, parse_options
    from dpsub.models import MODELS

    for key in cfg:
        _require(key in TOP_LEVEL, str(key), "unknown top-level key", key)
    # a group a run saved by an older dpsub lacks (resume) takes the schema's defaults
    typed = {g: _typed(g, cfg.get(g) or {}) for g in SCHEMAS}

    p = typed["privacy"]
    _require(p.epsilon > 0, "privacy.epsilon", "must be > 0", p.epsilon)
    _require(0 < p.delta < 1, "privacy.delta", "must be in (0, 1)", p.delta)
    _require(
        p.accountant in ("rdp", "prv"), "privacy.accountant", "must be rdp or prv", p.accountant
    )
    _require(
        p.sampling in ("poisson", "shuffle"),
        "privacy.sampling",
        "must be poisson or shuffle",
        p.sampling,
    )
    if p.noise_multiplier is not None:
        _require(
            p.noise_multiplier > 0, "privacy.noise_multiplier", "must be > 0", p.noise_multiplier
        )
    _require(p.rng in ("seeded", "secure"), "privacy.rng", "must be seeded or secure", p.rng)

    t = typed["train"]
    _require(t.epochs > 0, "train.epochs", "must be > 0", t.epochs)
    _require(t.batch_size >= 1, "train.batch_size", "must be >= 1", t.batch_size)
    if t.max_steps is not None:
        _require(t.max_steps >= 1, "train.max_steps", "must be >= 1", t.max_steps)
    for k in ("eval_every", "log_every", "checkpoint_every"):
        _require(t[k] >= 0, f"train.{k}", "must be >= 0", t[k])
    m = typed["eval"].mia_examples
    _require(m is None or m >= 1, "eval.mia_examples", "must be >= 1 (or null)", m)
    _require(t.eval_batch_size >= 1, "train.eval_batch_size", "must be >= 1", t.eval_batch_size)

    g = typed["grads"]
    _require(g.backend in BACKENDS, "grads.backend", f"must be one of {BACKENDS}", g.backend)
    mb = g.microbatch
    ok = mb == "auto" or (isinstance(mb, int) and not isinstance(mb, bool) and mb >= 1)
    _require(ok, "grads.microbatch", "must be an integer >= 1 or auto", mb)

    o = typed["optim"]
    _require(o.name in ("sgd", "adam"), "optim.name", "must be sgd or adam", o.name)
    _require(o.lr > 0, "optim.lr", "must be > 0", o.lr)
    _require(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0", o.weight_decay)
    ms = list(o.schedule.milestones)
    _require(
        all(0 < m < 1 for m in ms) and ms == sorted(ms),
        "optim.schedule.milestones",
        "must be increasing fractions of training in (0, 1)",
        ms,
    )

    lg = typed["logger"]
    modes = ("auto", "offline", "online", "disabled")
    _require(lg.mode in modes, "logger.mode", f"must be one of {modes}", lg.mode)

    d = typed["dataset"]
    _require(
        d.name in DATASETS, "dataset.name", f"unknown dataset; choose from {list(DATASETS)}", d.name
    )
    if d.train_size is not None:
        _require(d.train_size >= 1, "dataset.train_size", "must be >= 1", d.train_size)
    if d.validation_size is not None:
        _require(
            d.validation_size >= 1, "dataset.validation_size", "must be >= 1", d.validation_size
        )

    _require(
        cfg.device == "auto" or str(cfg.device).startswith(("cpu", "cuda", "mps")),
        "device",
        "must be auto, cpu, cuda or cuda:N",
        cfg.device,
    )

    model = OmegaConf.to_container(cfg.model, resolve=True)
    name = model.get("name")
    _require(name in MODELS, "model.name", f"unknown model; choose from {sorted(MODELS)}", name)

    mech = OmegaConf.to_container(cfg.mechanism, resolve=True)
    name = mech.pop("name", None)
    parse_options(name, mech)
    check_aux_config(OmegaConf.to_container(cfg.aux, resolve=True))
    if SPECS[name].needs_aux and cfg.aux.name == "none":
        raise ConfigError(
            f"aux.name: mechanism {name!r} needs auxiliary data; choose e.g. aux=natural"
        )
    return cfg


def check_against_data(cfg: DictConfig, n_train: int) -> None:
    """Checks that need the dataset size."""
    b = cfg.train.batch_size
    _require(
        b <= n_train,
        "train.batch_size",
        f"is larger than the private training set ({n_train} examples)",
        b,
    )
