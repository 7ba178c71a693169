"""One run: ``build_run(cfg)`` composes it, ``train_step(run)`` advances it by one step.

The trainer, ``scripts/bench.py`` and distributed training all use these two, so
the step that is timed is the step that trains.

Path of one step (the privacy policy is the account's: privacy/run_account.py)::

    account.admit(step): can the budget afford the plan's multiplier z?
    sample a Poisson batch (on the device)
    mechanism.step: per-example gradients, clipping, noise through ctx.noise (recorded)
    account.charge(records, z): refuse the step if the noise falls short (PrivacyError),
        else charge the ledgers   [secure mode: ledger persisted before the release leaves]
    optimizer.step   (post-processing of the release)
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dpsub.config import Settings, check_against_data, typed_group, validate
from dpsub.data import DatasetBundle, load_dataset
from dpsub.data.augment import build_augmult
from dpsub.data.aux import AuxData, build_aux
from dpsub.data.validation import carve_validation
from dpsub.errors import ConfigError, PrivacyError
from dpsub.grads import GradEngine, auto_microbatch, check_private_model
from dpsub.mechanisms import Mechanism, StepContext, StepResult, build_mechanism
from dpsub.models import build_model, count_parameters
from dpsub.privacy import Privatizer, SecureNoise, SeededNoise, simulate
from dpsub.privacy.run_account import PrivacyAccount
from dpsub.privacy.sampling import sample_rate, seeded_uniform
from dpsub.training.distributed import SINGLE, BroadcastNoise, Dist, broadcast_uniform, device_for
from dpsub.training.ema import EMA, build_ema
from dpsub.training.optim import build_optimizer, build_schedule
from dpsub.training.progress import Counter


def _of_account(name: str, settable: bool = False) -> property:
    """``run.<name>``: the attribute of ``run.account`` (read-only unless ``settable``)."""

    def setter(run: Run, value) -> None:
        setattr(run.account, name, value)

    return property(lambda run: getattr(run.account, name), setter if settable else None)


@dataclass
class Run:
    """Everything one training run holds; built by :func:`build_run`."""

    cfg: DictConfig | None  # as composed (config.yaml); None: made by the Python API
    settings: Settings | None  # the same, validated and typed: what the code reads
    device: torch.device
    data: DatasetBundle
    aux: AuxData | None
    model: torch.nn.Module
    engine: GradEngine
    mechanism: Mechanism
    account: PrivacyAccount  # sampler, plan, ledgers, policy, q, B, N
    total_steps: int
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler | None  # None: the caller's own
    privatizer: Privatizer
    rng: torch.Generator  # public randomness handed to the mechanism
    generators: dict[str, torch.Generator]  # seeded generators saved in checkpoints
    seed: int = 0  # the run seed (a clean resume reseeds its streams from it)
    fingerprint: str | None = None  # of the private training set (checked on resume)
    dist: Dist = SINGLE  # this process's rank (training/distributed.py)
    step: int = 0
    on_release: list[Callable[[Run], None]] = field(default_factory=list)
    #: why some output of the run is not covered by its epsilon (sticky: kept in checkpoints)
    uncovered: list[str] = field(default_factory=list)
    run_seconds: float = 0.0  # wall time of the training loops so far (checkpointed)
    #: the process's CPU time over the same loops (checkpointed): unlike run_seconds it does
    #: not grow while the process is paused or waits for a core another process holds;
    #: None: unknown (resumed from a checkpoint written before it was recorded)
    cpu_seconds: float | None = 0.0
    ema: EMA | None = None  # train.ema: the averaged weights evaluated and saved
    #: resumes from a light checkpoint: ``{"step", "dropped"}`` each (checkpointed)
    light_resumes: list[dict] = field(default_factory=list)
    #: the seeded streams were reseeded on resume (another device type): the trainer saves a
    #: checkpoint of the new streams before the first step (not checkpointed itself)
    reseeded: bool = False

    @property
    def secure(self) -> bool:
        return bool(self.privatizer.source.secure)

    # the account's parts, as the trainer, scripts and tests read them
    q = _of_account("q")
    z = _of_account("z")  # calibrated base multiplier (inf: non-private)
    plan = _of_account("plan")
    sampler = _of_account("sampler")
    budget_ledger = _of_account("budget_ledger")
    ledger = _of_account("ledger", settable=True)  # honest (a secure resume replaces it)
    nominal = _of_account("nominal", settable=True)


@dataclass
class StepOutcome:
    result: StepResult | None  # None: the budget stopped training before this step
    z_charged: float  # what the ledger was charged (inf: nothing private released)
    z_records: float  # the multiplier the noise records give
    stopped_by_budget: bool = False


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


_FEATURES_MEMO: dict[str, DatasetBundle] = {}  # the last featurized dataset of this process


def load_data(cfg: Settings | DictConfig) -> DatasetBundle:
    """The dataset of ``cfg`` (Settings, or any config with ``dataset``, ``data`` and
    ``seed``: the PATE one), before auxiliary or validation examples are taken from it;
    with ``features=<extractor>``, its frozen features (dpsub/features, cached on disk)."""
    raw = cfg.cfg if isinstance(cfg, Settings) else cfg
    f = raw.get("features")
    if f is None or f.name == "none":
        return load_images(cfg)
    # the jobs of one sweep process that use the same data share the bundle in memory
    # (nothing downstream writes into it)
    from dpsub.features import featurize

    opts = OmegaConf.to_container(f, resolve=True)
    d = OmegaConf.to_container(raw.dataset, resolve=True)
    seed = raw.seed if d.get("train_size") else None  # the subset is the seed's
    key = repr((d, opts, raw.data.root, seed))
    if key not in _FEATURES_MEMO:
        _FEATURES_MEMO.clear()
        counter = partial(Counter, enabled=bool(raw.get("train", {}).get("progress", True)))
        download = bool(raw.data.get("download", False))
        _FEATURES_MEMO[key] = featurize(load_images(cfg), opts, raw.data.root, download, counter)
    return _FEATURES_MEMO[key]


def load_images(cfg: Settings | DictConfig) -> DatasetBundle:
    """The dataset of ``cfg`` (Settings, or any config with ``dataset``, ``data`` and
    ``seed``: the PATE one), before auxiliary or validation examples are taken from it."""
    d, data = (
        (cfg.dataset, cfg.data)
        if isinstance(cfg, Settings)
        else (typed_group("dataset", cfg.dataset), typed_group("data", cfg.data))
    )
    return load_dataset(
        d.name,
        root=data.root,
        download=data.download,
        train_size=d.train_size,
        balanced=d.balanced,
        seed=int(cfg.seed),
        image_size=d.image_size,
        use_extra=d.use_extra,
        synthetic=OmegaConf.to_container(d.synthetic) if d.synthetic else None,
        user={
            "path": d.path,
            "num_classes": d.num_classes,
            "mean": d.mean,
            "std": d.std,
            "validation_size": d.validation_size,
        },  # fmt: skip
    )


def private_data(
    s: Settings, data: DatasetBundle | None = None
) -> tuple[AuxData | None, DatasetBundle]:
    """``(aux, data)``: the auxiliary set and the private training set of a run, on the CPU
    (auxiliary and validation examples taken out: N is ``len(data.train_y)``). ``data``:
    the loaded dataset, if already at hand."""
    data = load_data(s) if data is None else data
    aux, data = build_aux(s.aux, data, root=s.data.root, seed=s.seed)
    if s.dataset.validation_size:  # tuning: evaluate on held-out private examples
        d = s.dataset
        data = carve_validation(data, int(d.validation_size), s.seed, d.validation_pick)
    return aux, data


def plan_steps(cfg: Settings | DictConfig, n_train: int) -> tuple[float, int]:
    t = cfg.train if isinstance(cfg, Settings) else typed_group("train", cfg.train)
    q = sample_rate(t.batch_size, n_train)
    steps = max(1, round(t.epochs / q))
    if t.max_steps is not None:
        steps = min(steps, int(t.max_steps))
    return q, steps


def _account(s: Settings, mechanism: Mechanism, n: int, steps: int, uniform, device):
    """The run's privacy account for the mechanism's schedule and policy (and a simulated
    noise level, ``privacy.simulate``: not a guarantee)."""
    p = s.privacy
    sim = simulate.reference(
        p.simulate, batch_size=s.train.batch_size, n=n, steps=steps, phases_of=mechanism.phases,
        epsilon=p.epsilon, delta=p.delta, accountant=p.accountant,
    )  # fmt: skip
    return PrivacyAccount.open(
        n=n, batch_size=s.train.batch_size, steps=steps,
        phases=mechanism.phases(steps) if mechanism.private else None,
        policy=mechanism.accounting, epsilon=p.epsilon, delta=p.delta,
        accountant=p.accountant, noise_multiplier=p.noise_multiplier,
        sampling=p.sampling, uniform=uniform, device=device, simulation=sim,
    )  # fmt: skip


def planned_run_rdp(s: Settings, n: int) -> np.ndarray | None:
    """The RDP curve the plan of a run of ``s`` over ``n`` private examples charges (None:
    non-private), from the config alone, before anything trains (``dpsub-select`` bounds
    every run by it). A planned-policy run is charged exactly its plan, step by step."""
    mechanism = build_mechanism(s.mechanism_name, s.mechanism)
    _, steps = plan_steps(s, n)
    account = _account(s, mechanism, n, steps, uniform=None, device=None)
    if account.plan is not None and (account.simulation or not account.charges_plan):
        raise ConfigError(
            f"{s.mechanism_name}: its charge is not known before it runs (a simulated noise "
            "level, or accounting by the noise measured)"
        )
    return None if account.plan is None else account.plan.rdp()


def build_run(
    cfg: Settings | DictConfig,
    data: DatasetBundle | None = None,
    dist: Dist = SINGLE,
    say: Callable[[str], None] = lambda _: None,
) -> Run:
    """Compose data, model, engine, mechanism, privacy plan, ledger and optimizer.

    ``cfg``: the run's Settings (a composed config is validated first); ``data``: its
    dataset, already loaded. Raises ConfigError / DataError before anything is written
    anywhere. With ``dist`` (several ranks), rank 0 draws the sampling and noise randomness
    and every rank receives it; sensitive sums are all-reduced before noise
    (training/distributed.py). ``say``: told what takes time (the trainer logs it).
    """
    s = validate(cfg, usable=False)  # the trainer and the CLI checked usable=True
    device = pick_device(device_for(s.device, dist))
    torch.manual_seed(s.seed)
    say(f"setup: loading {s.dataset.name}")
    aux, data = private_data(s, data)
    n_train = int(data.train_y.shape[0])
    check_against_data(s, n_train)
    data = data.to(device)
    aux = aux.to(device) if aux is not None else None
    say(f"setup: building {s.model_name}, {s.mechanism_name} and the optimizer")
    try:
        model = build_model(s.model_name, data.in_shape, data.num_classes, **s.model)
    except ConfigError:  # a custom model's _target_, named already
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model: {e}") from None
    model = model.to(device)
    microbatch = s.grads.microbatch
    if microbatch == "auto":
        microbatch = auto_microbatch(count_parameters(model), s.train.batch_size, device)
    engine = GradEngine(model, microbatch, s.grads.backend, compile=s.grads.compile, dist=dist)
    engine.amp = torch.bfloat16 if s.train.amp == "bf16" else None
    mechanism = build_mechanism(s.mechanism_name, s.mechanism)
    if mechanism.private:
        check_private_model(model, s.grads.backend, say)
    try:
        mechanism.setup(engine, aux)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    _, total_steps = plan_steps(s, n_train)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, s.optim)
    schedule = build_schedule(optimizer, s.optim.schedule, total_steps)

    augment = s.train.augmult > 1
    gens, source, uniform = randomness(s.seed, s.privacy.rng == "secure", device, dist, augment)
    views = gens.pop(UNSAVED_AUGMENT, None) or gens.get("augment")
    engine.augmult = build_augmult(s.train.augmult, data.name, data.in_shape, views)
    if mechanism.private:
        say(f"setup: the privacy account, epsilon {s.privacy.epsilon} over {total_steps} steps")
    account = _account(s, mechanism, n_train, total_steps, uniform, device)
    run = assemble_run(
        data=data, aux=aux, model=model, engine=engine, mechanism=mechanism, account=account,
        total_steps=total_steps, optimizer=optimizer, schedule=schedule, noise_source=source,
        generators=gens, seed=s.seed, dist=dist, ema=build_ema(s.train.ema, model),
    )  # fmt: skip
    run.cfg, run.settings = s.cfg, s
    return run


def assemble_run(
    *, data, aux, model, engine, mechanism, account, total_steps, optimizer, schedule,
    noise_source, generators, seed: int, dist: Dist = SINGLE, ema=None,
) -> Run:  # fmt: skip
    """A :class:`Run` from its built parts: what :func:`build_run` (from a config) and the
    Python API (:mod:`dpsub.api`, from the caller's objects) both end with, so that the two
    release through the same privatizer, account and step."""
    privatizer = Privatizer(noise_source, reduce=dist.all_reduce if dist.active else None)
    return Run(
        cfg=None, settings=None, device=data.train_x.device, data=data, aux=aux, model=model,
        engine=engine, mechanism=mechanism, account=account, total_steps=total_steps,
        optimizer=optimizer, schedule=schedule, privatizer=privatizer, rng=generators["public"],
        generators=generators, seed=int(seed), dist=dist, ema=ema,
    )  # fmt: skip


#: secure mode's augmentation stream: handed to the views, never checkpointed
UNSAVED_AUGMENT = "augment (secure, unsaved)"


def randomness(seed: int, secure: bool, device, dist: Dist = SINGLE, augment: bool = False):
    """``(generators to checkpoint, noise source, uniform draws for sampling)``: seeded, or
    secret (``secure``, ``privacy.rng=secure``: never saved); under torchrun drawn by rank 0."""
    gens = {
        "sampler": torch.Generator(device=device).manual_seed(seed + 1),
        "noise": torch.Generator(device=device).manual_seed(seed + 2),
        "public": torch.Generator(device=device).manual_seed(seed + 3),
    }
    if augment:  # public crops and flips, their own stream (the noise's unchanged)
        gens["augment"] = torch.Generator(device=device).manual_seed(seed + 4)
    if secure:
        secure = SecureNoise()
        source, uniform = secure, (lambda n: secure.uniform(n, device))
        gens = {k: g for k, g in gens.items() if k == "public"}  # secret: unsaved
        if augment:  # its draws count the secret batches' examples: seeded by the OS, unsaved
            gens[UNSAVED_AUGMENT] = torch.Generator(device=device).manual_seed(secrets.randbits(63))
        draws = torch.float64
    else:
        source, uniform = SeededNoise(gens["noise"]), seeded_uniform(gens["sampler"], device)
        draws = torch.float32
    if dist.active:  # rank 0 draws, every rank receives
        source, uniform = (
            BroadcastNoise(source, dist),
            broadcast_uniform(uniform, dist, device, draws),
        )
    return gens, source, uniform


# ---------------------------------------------------------------------- step
def train_step(run: Run, idx: torch.Tensor | None = None, diagnostics: bool = False) -> StepOutcome:
    """Advance ``run`` by one step (``idx``: a given batch instead of a sampled one): the
    private release, then the optimizer's step on it (post-processing)."""
    out = release(run, idx, diagnostics)
    if out.result is not None:
        run.optimizer.step()
        if run.schedule is not None:
            run.schedule.step()
        if run.ema is not None:  # parameter averaging (post-processing)
            run.ema.update(run.model)
    return out


def release(run: Run, idx: torch.Tensor | None = None, diagnostics: bool = False) -> StepOutcome:
    """One private release: the batch ``idx`` (sampled if None) through the mechanism, the
    noise records charged, the released gradient written into the parameters' ``.grad``;
    the run's step counter advances. No optimizer step (:func:`train_step` makes it)."""
    acct, noise = run.account, run.privatizer
    z = acct.multiplier(run.step)
    if not acct.admit(run.step):
        return StepOutcome(None, z, z, stopped_by_budget=True)
    batch = acct.sampler.sample() if idx is None else idx
    idx = run.dist.shard(batch)
    ctx = StepContext(run.step, run.total_steps, acct.batch_size, z, noise, run.rng, diagnostics)
    noise.begin_step()
    x = run.data.train_x[idx]
    if run.engine.augmult is not None:  # (b, K, ...) views, averaged before clipping; every
        # rank draws the whole batch's (one stream, as one process: a rank's own draws left
        # its stream where rank 0's checkpoint did not, and a replay re-augmented its rows)
        x = run.dist.shard(run.engine.augmult.views(run.data.train_x[batch]))
    res = run.mechanism.step(x, run.data.train_y[idx], ctx)
    charged = acct.charge(noise.records, z, who=f"mechanism {run.mechanism.name}, step {run.step}")
    if charged is None:
        return StepOutcome(None, z, noise.effective_multiplier(), stopped_by_budget=True)
    if acct.private:
        for hook in run.on_release:  # secure mode: persist the ledger before anything leaves
            hook(run)
    if run.dist.active:  # every rank applies exactly rank 0's update
        res.grad = run.dist.broadcast(res.grad.contiguous())
        _reduce_stats(run, res)
    if acct.private and not bool(torch.isfinite(res.grad).all()):
        raise PrivacyError(
            f"mechanism {run.mechanism.name}, step {run.step}: the released gradient is not "
            "finite (charged, not applied): NaN hides the noise. Private rows are cleaned, "
            "so look at the public side: the auxiliary (anchor) data, the model's weights"
        )
    run.engine.set_grad(res.grad)
    run.step += 1
    return StepOutcome(res, charged, noise.effective_multiplier())


def _reduce_stats(run: Run, res: StepResult) -> None:
    """The private batch statistics over every rank's shard (diagnostics only)."""
    st = res.stats
    values = [st.loss_sum, st.correct, st.clip.n, st.clip.clipped, st.clip.nonfinite]
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=run.device) for v in values])
    t = run.dist.all_reduce(t).tolist()
    st.loss_sum, st.correct = t[0], int(t[1])
    st.clip.n, st.clip.clipped, st.clip.nonfinite = int(t[2]), int(t[3]), int(t[4])


# --------------------------------------------------------------------- state
def run_state(run: Run) -> dict:
    """Everything a checkpoint needs to continue ``run`` (see training/checkpoint.py)."""
    from dpsub.training.checkpoint import rng_state

    return {
        "step": run.step,
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "schedule": run.schedule.state_dict() if run.schedule is not None else None,
        **run.account.state_dict(),  # ledger, nominal, sampler
        # secure mode: a shuffle's permutation is drawn from the OS and secret (a resume draws
        # a new one); Poisson's sampler holds nothing
        **({"sampler": None} if run.secure else {}),
        "mechanism": run.mechanism.state_dict(),
        "recomputable": [f"mechanism.{k}" for k in run.mechanism.recomputable],
        "light_resumes": list(run.light_resumes),
        "rng": rng_state(run.generators),
        "noise_source": run.privatizer.source.state_dict(),
        "noise_multiplier": run.z,
        "secure": run.secure,
        "uncovered": list(run.uncovered),
        **({} if run.secure else {"run_seconds": run.run_seconds, "cpu_seconds": run.cpu_seconds}),
        **({"ema": run.ema.state_dict()} if run.ema is not None else {}),
    }


def load_run_state(run: Run, state: dict) -> None:
    from dpsub.training.checkpoint import restore_rng

    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if run.schedule is not None:
        run.schedule.load_state_dict(state["schedule"])
    run.account.load_state_dict(state)
    run.mechanism.load_state_dict(state["mechanism"])
    clean, reseed = bool(state.get("clean", False)), f"{run.seed}:{int(state['step'])}"
    run.reseeded = restore_rng(run.generators, state["rng"], clean=clean, reseed=reseed)
    if not run.reseeded:
        run.privatizer.source.load_state_dict(state["noise_source"])
    run.step = int(state["step"])
    run.uncovered = list(state.get("uncovered", []))
    run.light_resumes = list(state.get("light_resumes", []))
    if state.get("dropped"):  # a light checkpoint: the mechanism recomputes what it lacks
        run.light_resumes.append({"step": run.step, "dropped": list(state["dropped"])})
    run.run_seconds = float(state.get("run_seconds", 0.0))
    cpu = state.get("cpu_seconds")  # a checkpoint older than it: the part before is unknown
    run.cpu_seconds = float(cpu) if cpu is not None else (None if run.run_seconds > 0 else 0.0)
    if run.ema is not None:
        run.ema.load_state_dict(state["ema"])


def load_finished_run(run_dir, data_root: str | None = None) -> Run:
    """A run dir's run rebuilt from its ``config.yaml`` and restored from its checkpoint
    (model, optimizer, ledgers, mechanism state): what tools evaluate after training.

    ``data_root``: where the data is on this machine (the saved paths move with it).
    Raises :class:`~dpsub.rundir.RunError` naming the missing file, or when the rebuilt
    private training set is not the one the run trained on; ConfigError / DataError from
    rebuilding the run.
    """
    from dpsub.rundir import CHECKPOINT, CONFIG, RunDir, RunError
    from dpsub.training.checkpoint import fingerprint_matches, load_checkpoint

    rd = RunDir(run_dir)
    rd.require(CONFIG, CHECKPOINT)
    run = build_run(rd.config_on(data_root) if data_root else rd.config())
    ckpt = load_checkpoint(rd.path, map_location=run.device)
    fp = ckpt.get("data_fingerprint")
    if fingerprint_matches(ckpt, rd.path, run.data.train_x, run.data.train_y) is False:
        raise RunError(
            f"{rd.path}: the rebuilt private training set differs from the one the run trained "
            "on (data fingerprint mismatch); check --data-root"
        )
    load_run_state(run, ckpt["state"])
    if run.ema is not None:  # the released model: the averaged weights
        run.ema.copy_to(run.model)
    run.fingerprint = fp
    return run
