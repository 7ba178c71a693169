"""Typed validation of the composed Hydra config, before anything trains.

Hydra already refuses overrides of keys that do not exist (struct mode). This
module adds the rest: types, allowed values and ranges, and keys added with
``+key=...`` that no code reads. Every error is a :class:`ConfigError` whose
message starts with the full key, e.g. ``privacy.epsilon: must be > 0, got -1``.
Mechanism, model and aux options are checked against the constructors that
consume them, so a config file and its class cannot drift apart silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpsub.choices import ACCOUNTANTS, BACKENDS, RNGS, SAMPLINGS
from dpsub.errors import ConfigError

__all__ = ["ConfigError", "check_against_data", "check_environment", "compose", "validate"]


def compose(
    overrides: Sequence[str] = (),
    *,
    config_name: str = "config",
    return_hydra_config: bool = False,
) -> DictConfig:
    """``conf/<config_name>.yaml`` (``config``: training, ``dpsub_audit``: audits) composed
    with Hydra ``overrides``, as the command line composes it.

    The one place scripts and tests compose a config (not validated: see :func:`validate`).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dpsub.paths import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return hydra_compose(
            config_name=config_name,
            overrides=list(overrides),
            return_hydra_config=return_hydra_config,
        )


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
    amp: str | None = None  # bf16: autocast of the forward/backward (docs/gpu.md)


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


def _one_of(values: tuple[str, ...]) -> str:
    return f"must be one of {values}"


def validate(cfg: DictConfig) -> DictConfig:
    """Check the whole config; return it unchanged (raises ConfigError).

    Imports nothing heavy (no torch): an invalid config fails in well under a second.
    Model option names are checked here (``dpsub.models.MODEL_OPTIONS``), their values
    when the model is built (before anything is written).
    """
    from dpsub.data.aux_options import check_aux_config
    from dpsub.data.names import DATASETS
    from dpsub.mechanisms.options import SPECS, parse_options
    from dpsub.models import MODEL_OPTIONS, MODELS

    for key in cfg:
        _require(key in TOP_LEVEL, str(key), "unknown top-level key", key)
    # a group a run saved by an older dpsub lacks (resume) takes the schema's defaults
    typed = {g: _typed(g, cfg.get(g) or {}) for g in SCHEMAS}

    p = typed["privacy"]
    _require(p.epsilon > 0, "privacy.epsilon", "must be > 0", p.epsilon)
    _require(0 < p.delta < 1, "privacy.delta", "must be in (0, 1)", p.delta)
    _require(p.accountant in ACCOUNTANTS, "privacy.accountant", _one_of(ACCOUNTANTS), p.accountant)
    _require(p.sampling in SAMPLINGS, "privacy.sampling", _one_of(SAMPLINGS), p.sampling)
    if p.noise_multiplier is not None:
        _require(
            p.noise_multiplier > 0, "privacy.noise_multiplier", "must be > 0", p.noise_multiplier
        )
    _require(p.rng in RNGS, "privacy.rng", _one_of(RNGS), p.rng)

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
    _require(g.backend in BACKENDS, "grads.backend", _one_of(BACKENDS), g.backend)
    _require(t.amp in (None, "bf16"), "train.amp", "must be null or bf16", t.amp)
    _require(
        t.amp is None or g.backend == "vmap",
        "train.amp",
        "bf16 needs grads.backend=vmap (ghost and opacus would take clipping norms from bf16 "
        f"activations), got grads.backend={g.backend}",
        t.amp,
    )
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
    for key in model:
        options = MODEL_OPTIONS[name]
        if key != "name" and key not in options:
            near = difflib.get_close_matches(key, options, n=3, cutoff=0.6)
            hint = f"closest: {', '.join(near)}" if near else f"its options: {', '.join(options)}"
            raise ConfigError(f"model.{key}: not an option of model {name}; {hint}")

    mech = OmegaConf.to_container(cfg.mechanism, resolve=True)
    name = mech.pop("name", None)
    _check_measured(name, parse_options(name, mech), p)
    check_aux_config(OmegaConf.to_container(cfg.aux, resolve=True))
    if SPECS[name].needs_aux and cfg.aux.name == "none":
        raise ConfigError(
            f"aux.name: mechanism {name!r} needs auxiliary data; choose e.g. aux=natural"
        )
    return cfg


def _check_measured(name: str, options: Any, p: DictConfig) -> None:
    """A measured-accounting mechanism (DP-Hero) needs a fixed noise multiplier.

    Calibrating the multiplier to ``privacy.epsilon`` plans the paper's nominal epsilon,
    but the budget is enforced on the honest one, whose least noisy direction gets far less
    noise: the budget is spent within a step or two and the run ends untrained (exit 0).
    """
    if getattr(options, "accounting", None) != "measured" or p.noise_multiplier is not None:
        return
    raise ConfigError(
        f"privacy.noise_multiplier: mechanism={name} needs a fixed noise multiplier: calibrated "
        "to privacy.epsilon it spends that budget in its first steps (the budget holds its "
        "honest epsilon, from its least noisy direction: docs/dphero.md), so it would stop "
        f"untrained; run experiment=dphero_mnist_lenet (or dphero_cifar10), or set "
        "privacy.noise_multiplier=SIGMA privacy.epsilon=1e12 as it does, or use "
        f"mechanism={name}_floor or mechanism.accounting=nominal (not a guarantee)"
    )


def check_environment(cfg: DictConfig) -> None:
    """Checks of this machine for a valid config: the data files (DatasetNotFoundError),
    W&B credentials for ``logger.mode=online`` and the device (ConfigError). Only the
    device check imports torch, and only for a cuda or mps device."""
    from dpsub.data.files import check_files
    from dpsub.logging.run_logger import has_wandb_key

    check_files(cfg)
    if cfg.logger.mode == "online" and not has_wandb_key():
        raise ConfigError(
            "logger.mode: online needs a W&B API key (WANDB_API_KEY or `wandb login`) and "
            "none is set; use logger.mode=offline (upload later with `wandb sync`) or "
            "logger=disabled"
        )
    _check_device(str(cfg.device))


def _check_device(device: str) -> None:
    if not device.startswith(("cuda", "mps")):
        return
    if device.startswith("cuda") and not _gpu_driver_present():  # no torch import needed
        raise ConfigError(
            f"device: {device} but this machine has no GPU driver (no libcuda, no ROCm "
            "/dev/kfd); use device=auto or device=cpu"
        )
    import torch

    if device == "mps":
        _require(torch.backends.mps.is_available(), "device", "MPS is not available here", device)
        return
    _require(
        torch.cuda.is_available(),
        "device",
        f"CUDA is not available here (torch {torch.__version__}, CUDA build "
        f"{torch.version.cuda}); use device=auto or device=cpu",
        device,
    )
    index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
    _require(index < count, "device", f"this machine has {count} CUDA device(s)", device)


def _gpu_driver_present() -> bool:
    """An NVIDIA driver library (CUDA) or the ROCm device node: without either, torch
    cannot see a GPU, and saying so does not need torch's 10 s import."""
    import ctypes
    import os

    if os.path.exists("/dev/kfd"):
        return True
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(lib)
            return True
        except OSError:
            continue
    return False


def check_against_data(cfg: DictConfig, n_train: int) -> None:
    """Checks that need the dataset size."""
    b = cfg.train.batch_size
    _require(
        b <= n_train,
        "train.batch_size",
        f"is larger than the private training set ({n_train} examples)",
        b,
    )
