"""Typed validation of the composed Hydra config, before anything trains.

Hydra already refuses overrides of keys that do not exist (struct mode). This
module adds the rest: types, allowed values and ranges, and keys added with
``+key=...`` that no code reads. Every error is a :class:`ConfigError` whose
message starts with the full key, e.g. ``privacy.epsilon: must be > 0, got -1``.
Mechanism, model and aux options are checked against the constructors that
consume them, so a config file and its class cannot drift apart silently.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpsub.choices import (
    ACCOUNTANTS,
    BACKENDS,
    FEATURE_NORMS,
    FEATURES,
    MODEL_FILES,
    RNGS,
    SAMPLINGS,
)
from dpsub.data.registry import REGISTRY
from dpsub.declare import check_declared, opt
from dpsub.errors import ConfigError
from dpsub.overrides import compose, config_context, declare_defaults  # Hydra, one place

__all__ = [
    "ConfigError",
    "Settings",
    "check_against_data",
    "check_environment",
    "compose",
    "config_context",
    "declared_defaults",
    "typed_group",
    "validate",
]


@dataclass
class DataSchema:
    root: str = "./data"
    download: bool = False


@dataclass
class DatasetSchema:
    name: str = opt("digits", choices=tuple(REGISTRY))
    train_size: int | None = opt(None, ge=1)  # e.g. 10000: a class-balanced subset
    balanced: bool = True
    image_size: int | None = opt(None, ge=1)  # resize every image to this
    use_extra: bool = False  # SVHN: train + the 531k 'extra' split, as GEP does
    synthetic: dict[str, Any] | None = None
    # N: tune on N examples held out of the private set, not on the test set
    validation_size: int | None = opt(None, ge=1)
    # how the N are picked: class-balanced (the papers' tuning), uniform (positions drawn by
    # the seed alone), or hash: each example by a keyed hash of its own bytes, so one added
    # or removed example moves no other (what dpsub-select needs: docs/api.md)
    validation_pick: str = opt("balanced", choices=("balanced", "uniform", "hash"))
    # your own data (dataset=npz / imagefolder; docs/usage.md "Your own data")
    path: str | None = None  # the .npz file, or the folder holding train/ and test/ (required)
    num_classes: int | None = opt(None, ge=2)  # npz: else its 'classes' array gives them
    mean: list[float] | None = None  # per channel; null: 0.5 (pixels [0, 1] -> [-1, 1])
    std: list[float] | None = None  # constants you choose, never statistics of the data


@dataclass
class SimulateSchema:
    """``privacy.simulate``: noise-matched simulation, NOT a privacy guarantee
    (dpsub.privacy.simulate): the run draws the mean-gradient noise of a reference batch."""

    batch_size: int | None = opt(None, ge=1, help="B_ref: the batch whose noise level is simulated")
    noise_multiplier: float | None = opt(None, gt=0, help="z_ref, given (else calibrated)")
    epsilon: float | None = opt(
        None, gt=0, help="the reference's epsilon (default privacy.epsilon)"
    )
    delta: float | None = opt(
        None, gt=0, lt=1, help="the reference's delta (default privacy.delta)"
    )
    dataset_size: int | None = opt(None, ge=1, help="N_ref (default the run's N)")
    steps: int | None = opt(None, ge=1, help="the reference's steps (default the run's)")


@dataclass
class PrivacySchema:
    epsilon: float = opt(2.0, gt=0)
    delta: float = opt(1e-5, gt=0, lt=1)
    accountant: str = opt("rdp", choices=ACCOUNTANTS)
    sampling: str = opt("poisson", choices=SAMPLINGS)
    noise_multiplier: float | None = opt(None, gt=0)
    rng: str = opt("seeded", choices=RNGS)
    private_diagnostics: bool = False
    simulate: SimulateSchema = field(default_factory=SimulateSchema)


@dataclass
class ScheduleSchema:
    milestones: list[float] = field(default_factory=list)
    gamma: float = opt(0.1, gt=0)


@dataclass
class OptimSchema:
    name: str = opt("sgd", choices=("sgd", "adam"))
    lr: float = opt(0.1, gt=0)
    momentum: float = opt(0.0, ge=0)
    weight_decay: float = opt(0.0, ge=0)
    nesterov: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    schedule: ScheduleSchema = field(default_factory=ScheduleSchema)


@dataclass
class TrainSchema:
    epochs: float = opt(30.0, gt=0)
    batch_size: int = opt(256, ge=1)
    max_steps: int | None = opt(None, ge=1)
    eval_every: int = opt(100, ge=0)
    eval_batch_size: int = opt(2048, ge=1)
    log_every: int = opt(10, ge=0)
    checkpoint_every: int = opt(100, ge=0)
    progress: bool = True
    # bf16: autocast of the forward/backward (docs/gpu.md)
    amp: str | None = opt(None, choices=(None, "bf16"))
    # K views per example, gradients averaged before clipping (docs/recipe.md); 1: none
    augmult: int = opt(1, ge=1)
    # parameter averaging: decay of the weights' EMA, evaluated and saved (null or 0: off)
    ema: float | None = opt(None, ge=0, lt=1)
    # with train.ema: evaluate the averaged weights, or both (the raw ones under <split>/raw_*)
    ema_eval: str = opt("ema", choices=("ema", "both"))


@dataclass
class GradsSchema:
    backend: str = opt("vmap", choices=BACKENDS)
    microbatch: Any = 256  # int >= 1, or "auto" (from available memory)
    compile: bool = False


@dataclass
class LoggerSchema:
    name: str = "wandb"
    mode: str = opt("auto", choices=("auto", "offline", "online", "disabled"))
    project: str = "dpsub"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class EvalSchema:
    mia: bool = False
    mia_examples: int | None = opt(None, ge=1)


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
    "seed", "device", "resume", "run_name", "out_dir", "model", "mechanism", "aux", "features",
    *SCHEMAS,
}  # fmt: skip

#: ``features.*`` keys each extractor reads (conf/features/<name>.yaml, dpsub/features)
_FEATURE_COMMON = (
    "name",
    "norm",
    "groups",
    "norm_path",
    "norm_samples",
    "batch_size",
    "image_size",
    "cache_dir",
)
FEATURE_OPTIONS = {
    "none": ("name",),
    "scatternet": (*_FEATURE_COMMON, "J", "L", "pool"),
    "cifar100_resnet": (*_FEATURE_COMMON, "width", "epochs", "seed", "pretrain_path"),
    **{n: (*_FEATURE_COMMON, "path", "input_mean", "input_std") for n in MODEL_FILES},
    **{f"efficientnet_lite{i}": (*_FEATURE_COMMON, "input_mean", "input_std") for i in range(3)},
}
#: aux sources that are drawn from the private dataset's own (featurized) tensors
_FEATURE_AUX = ("none", "heldout_test", "public_train", "gaussian")


def _check_features(cfg: DictConfig) -> None:
    """``features.*``: a known extractor, its own keys, and an aux source that is featurized."""
    f = cfg.get("features")
    if f is None:
        return
    f = OmegaConf.to_container(f, resolve=False)
    name = f.get("name")
    _require(name in FEATURES, "features.name", f"must be one of {FEATURES}", name)
    for key in f:
        _require(key in FEATURE_OPTIONS[name], f"features.{key}", f"not an option of {name}", key)
    if name == "none":
        return
    _require(
        f.get("norm") in FEATURE_NORMS,
        "features.norm",
        f"must be one of {FEATURE_NORMS}",
        f.get("norm"),
    )
    _require(int(f.get("groups") or 0) >= 1, "features.groups", "must be >= 1", f.get("groups"))
    if name in MODEL_FILES:
        _require(
            f.get("path") not in (None, "???"),
            "features.path",
            f"set the model's file (saved by {MODEL_FILES[name]})",
            f.get("path"),
        )
    aux = cfg.aux.name if cfg.get("aux") is not None else "none"
    _require(
        aux in _FEATURE_AUX, "aux.name",
        f"with features={name} the anchors must come from the featurized data; "
        f"choose one of {_FEATURE_AUX} (GEP Appendix A: aux=heldout_test aux.num_samples=500)", aux,
    )  # fmt: skip


def _defaults(cls: type) -> dict[str, Any]:
    """A dataclass's declared defaults, field by field (None where it has a factory)."""
    return {
        f.name: None if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }


_HELD_OUT = ("validation_size", "validation_pick")  # keys every dataset has


def declared_defaults() -> dict[str, dict[str, dict[str, Any]]]:
    """Each option of the mechanism, dataset and aux groups: its keys with their declared
    defaults, ``name`` first. The one place these defaults are written is the declaration
    (``dpsub.mechanisms.options``, :class:`DatasetSchema` with the keys each dataset of
    ``dpsub.data.registry`` has, ``dpsub.data.aux_options``); ``conf/<group>/<option>.yaml``
    takes them (``- /declared/<group>/<option>@_here_``) and sets only what differs."""
    from dpsub.data.aux_options import AUX_SOURCES
    from dpsub.mechanisms.options import SPECS

    dataset = _defaults(DatasetSchema)
    return {
        "mechanism": {n: {"name": n, **_defaults(s.options)} for n, s in SPECS.items()},
        "dataset": {
            n: {"name": n, **{k: dataset[k] for k in (*s.options, *_HELD_OUT)}}
            for n, s in REGISTRY.items()
        },
        "aux": {n: {"name": n, **s.defaults} for n, s in AUX_SOURCES.items()},
    }


for _group, _nodes in declared_defaults().items():  # before anything composes (dpsub.overrides)
    declare_defaults(_group, _nodes)


def typed_group(group: str, node: DictConfig | dict | None) -> DictConfig:
    """A group merged into its schema (its defaults fill what the node lacks: an older
    run's config, the PATE config's dataset); wrong types and unknown keys raise
    ConfigError."""
    try:
        return OmegaConf.merge(OmegaConf.structured(SCHEMAS[group]), node or {})
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or getattr(e, "key", None) or "?"
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{group}.{key}: {msg}") from None


def _require(cond: bool, key: str, msg: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}, got {value!r}")


@dataclass(frozen=True)
class Settings:
    """A validated config, typed: what :func:`dpsub.training.build.build_run`, the trainer and
    every mechanism read (never the raw config with defaults of their own).

    Each group is its schema's structured node (every key present, typed, in range); the
    model, mechanism and aux options are parsed once, here. ``cfg`` is the config as
    composed (what ``config.yaml`` saves).
    """

    cfg: DictConfig
    data: DataSchema
    dataset: DatasetSchema
    privacy: PrivacySchema
    optim: OptimSchema
    train: TrainSchema
    grads: GradsSchema
    logger: LoggerSchema
    eval: EvalSchema
    seed: int
    device: str
    model_name: str
    model: dict[str, Any]  # the model's options (``name`` aside)
    mechanism_name: str
    mechanism: Any  # the declared options object (dpsub.mechanisms.options)
    aux: dict[str, Any]  # the aux group, checked (dpsub.data.aux_options)


def validate(cfg: DictConfig | Settings, usable: bool = True) -> Settings:
    """Check the whole config; return its :class:`Settings` (raises ConfigError).

    Ranges and allowed values are declared beside each default (``opt()``); what spans
    several keys is checked below. Imports nothing heavy (no torch): an invalid config fails
    in well under a second. Model option names are checked here
    (``dpsub.models.MODEL_OPTIONS``), their values when the model is built (before anything
    is written). Settings given back are returned as they are. ``usable=False`` skips the
    checks of settings that are valid but would stop untrained (:func:`_check_measured`):
    ``build_run`` builds what a test asks for; the command line and the trainer refuse it.
    """
    if isinstance(cfg, Settings):
        return cfg
    for key in cfg:
        _require(key in TOP_LEVEL, str(key), "unknown top-level key", key)
    # a group a run saved by an older dpsub lacks (resume) takes the schema's defaults
    typed = {g: typed_group(g, cfg.get(g)) for g in SCHEMAS}
    for g, node in typed.items():
        check_declared(node, SCHEMAS[g], g)
    _check_combinations(typed)
    _check_features(cfg)
    features = (cfg.get("features") or {}).get("name", "none")
    _require(
        typed["train"].augmult == 1 or features == "none",
        "train.augmult",
        f"augments images; features={features} trains on fixed feature vectors (use 1)",
        typed["train"].augmult,
    )
    _require(
        cfg.device == "auto" or str(cfg.device).startswith(("cpu", "cuda", "mps")),
        "device",
        "must be auto, cpu, cuda or cuda:N",
        cfg.device,
    )
    model_name, model = _model_options(cfg)
    mechanism_name, mechanism, aux = _mechanism_options(cfg, typed["privacy"], usable)
    return Settings(
        cfg=cfg, **typed, seed=int(cfg.seed), device=str(cfg.device), model_name=model_name,
        model=model, mechanism_name=mechanism_name, mechanism=mechanism, aux=aux,
    )  # fmt: skip


def _check_combinations(typed: dict[str, DictConfig]) -> None:
    """What one key's declaration cannot say."""
    t, g, o, d = typed["train"], typed["grads"], typed["optim"], typed["dataset"]
    user = REGISTRY[d.name].user_path is not None
    for key in ("path", "num_classes", "mean", "std"):
        _require(user or d[key] is None, f"dataset.{key}",
                 f"is for your own data (dataset=npz or imagefolder), not dataset={d.name}",
                 d[key])  # fmt: skip
    _require((d.mean is None) == (d.std is None), "dataset.mean",
             "set dataset.mean and dataset.std together (one constant per channel each)",
             d.mean)  # fmt: skip
    _require(d.std is None or all(v > 0 for v in d.std), "dataset.std", "must be > 0", d.std)
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
    ms = list(o.schedule.milestones)
    _require(
        all(0 < m < 1 for m in ms) and ms == sorted(ms),
        "optim.schedule.milestones",
        "must be increasing fractions of training in (0, 1)",
        ms,
    )


def _model_options(cfg: DictConfig) -> tuple[str, dict[str, Any]]:
    from dpsub.models import MODEL_OPTIONS, MODELS

    model = OmegaConf.to_container(cfg.model, resolve=True)
    name = model.pop("name", None)
    _require(name in MODELS, "model.name", f"unknown model; choose from {sorted(MODELS)}", name)
    if name == "custom":  # a user's class: its keywords are checked when it is built
        target = model.get("_target_")
        ok = isinstance(target, str) and "." in target
        _require(ok, "model._target_", "name the model class, as package.module.Class", target)
        return name, model
    for key in model:
        options = MODEL_OPTIONS[name]
        if key not in options:
            near = difflib.get_close_matches(key, options, n=3, cutoff=0.6)
            hint = f"closest: {', '.join(near)}" if near else f"its options: {', '.join(options)}"
            raise ConfigError(f"model.{key}: not an option of model {name}; {hint}")
    return name, model


def _mechanism_options(
    cfg: DictConfig, p: DictConfig, usable: bool
) -> tuple[str, Any, dict[str, Any]]:
    from dpsub.data.aux_options import aux_options, check_aux_config
    from dpsub.mechanisms.options import SPECS, parse_options

    mech = OmegaConf.to_container(cfg.mechanism, resolve=True)
    name = mech.pop("name", None)
    options = parse_options(name, mech)
    if usable:
        _check_measured(name, options, p)
    _check_simulate(name, p)
    aux = aux_options(cfg.aux)
    check_aux_config(aux)
    if SPECS[name].needs_aux and aux.get("name") == "none":
        raise ConfigError(
            f"aux.name: mechanism {name!r} needs auxiliary data; choose e.g. aux=natural"
        )
    return name, options, aux


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


def _check_simulate(name: str, p: DictConfig) -> None:
    """``privacy.simulate``: a reference batch, one way to set its multiplier, a private
    mechanism (one charged its planned noise: PrivacyAccount.open checks the policy)."""
    sim = p.simulate
    if sim.batch_size is None:
        for k in ("noise_multiplier", "epsilon", "delta", "dataset_size", "steps"):
            _require(sim[k] is None, f"privacy.simulate.{k}",
                     "describes a reference batch; set privacy.simulate.batch_size too", sim[k])  # fmt: skip
        return
    _require(
        p.noise_multiplier is None, "privacy.noise_multiplier",
        "cannot be fixed in a simulated run (privacy.simulate.batch_size): it draws "
        "z_ref * batch / privacy.simulate.batch_size; give z_ref as "
        "privacy.simulate.noise_multiplier", p.noise_multiplier,
    )  # fmt: skip
    _require(
        sim.noise_multiplier is None or sim.epsilon is None, "privacy.simulate.epsilon",
        "set either privacy.simulate.noise_multiplier (z_ref given) or the reference's "
        "epsilon (z_ref calibrated), not both", sim.epsilon,
    )  # fmt: skip
    from dpsub.mechanisms.options import SPECS

    _require(
        SPECS[name].private, "privacy.simulate.batch_size",
        f"mechanism {name} draws no noise; there is no noise level to simulate", sim.batch_size,
    )  # fmt: skip


def check_environment(cfg: DictConfig) -> None:
    """Checks of this machine for a valid config: the data files (DatasetNotFoundError),
    W&B credentials for ``logger.mode=online`` and the device (ConfigError). Only the
    device check imports torch, and only for a cuda or mps device."""
    from dpsub.data.files import check_files
    from dpsub.tracking.run_logger import has_wandb_key

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
