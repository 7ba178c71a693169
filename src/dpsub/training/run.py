"""One run: ``build_run(cfg)`` composes it, ``train_step(run)`` advances it by one step.

The trainer, ``scripts/bench.py`` and distributed training all use these two, so
the step that is timed is the step that trains.

Path of one step::

    plan: multiplier z of this step  ->  (planned accounting) can the ledger afford it?
    sample a Poisson batch (on the device)
    mechanism.step: per-example gradients, clipping, noise through ctx.noise (recorded)
    records -> effective multiplier z_rec; refuse the step if z_rec < z (PrivacyError)
    ledger.step(z)   [secure mode: ledger persisted before the release can leave]
    optimizer.step   (post-processing of the release)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf

from dpsub.config import check_against_data
from dpsub.data import DatasetBundle, load_dataset
from dpsub.data.aux import AuxData, build_aux
from dpsub.data.sampling import build_sampler, seeded_uniform
from dpsub.data.validation import carve_validation
from dpsub.errors import ConfigError, PrivacyError
from dpsub.grads import GradEngine, auto_microbatch, check_private_model
from dpsub.mechanisms import Mechanism, StepContext, StepResult, build_mechanism
from dpsub.models import build_model, count_parameters
from dpsub.privacy import (
    PrivacyLedger,
    PrivacyPlan,
    Privatizer,
    SecureNoise,
    SeededNoise,
    calibrate_plan,
    fixed_plan,
)
from dpsub.training.distributed import SINGLE, BroadcastNoise, Dist, broadcast_uniform, device_for
from dpsub.training.optim import build_optimizer, build_schedule

#: Relative slack when comparing the records' multiplier with the plan (float rounding).
REL_TOL = 1e-9


@dataclass
class Run:
    """Everything one training run holds; built by :func:`build_run`."""

    cfg: DictConfig
    device: torch.device
    data: DatasetBundle
    aux: AuxData | None
    model: torch.nn.Module
    engine: GradEngine
    mechanism: Mechanism
    q: float
    total_steps: int
    z: float  # calibrated base multiplier (inf: non-private)
    plan: PrivacyPlan | None
    ledger: PrivacyLedger | None  # what the run is charged (honest)
    nominal: PrivacyLedger | None  # measured-accounting mechanisms: the planned multipliers
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    sampler: object
    privatizer: Privatizer
    rng: torch.Generator  # public randomness handed to the mechanism
    generators: dict[str, torch.Generator]  # seeded generators saved in checkpoints
    fingerprint: str | None = None  # of the private training set (checked on resume)
    dist: Dist = SINGLE  # this process's rank (training/distributed.py)
    step: int = 0
    on_release: list[Callable[[Run], None]] = field(default_factory=list)
    #: why some output of the run is not covered by its epsilon (sticky: kept in checkpoints)
    uncovered: list[str] = field(default_factory=list)
    run_seconds: float = 0.0  # wall time of the training loops so far (checkpointed)

    @property
    def secure(self) -> bool:
        return bool(self.privatizer.source.secure)

    @property
    def budget_ledger(self) -> PrivacyLedger | None:
        """The ledger the budget is enforced on."""
        return self.nominal if self.mechanism.accounting == "nominal" else self.ledger


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


def load_data(cfg: DictConfig) -> DatasetBundle:
    d = cfg.dataset
    return load_dataset(
        d.name,
        root=cfg.data.root,
        download=cfg.data.download,
        train_size=d.get("train_size"),
        balanced=d.get("balanced", True),
        seed=cfg.seed,
        image_size=d.get("image_size"),
        use_extra=d.get("use_extra", False),
        synthetic=OmegaConf.to_container(d.synthetic) if d.get("synthetic") else None,
    )


def plan_steps(cfg: DictConfig, n_train: int) -> tuple[float, int]:
    q = cfg.train.batch_size / n_train
    steps = max(1, round(cfg.train.epochs / q))
    if cfg.train.max_steps is not None:
        steps = min(steps, int(cfg.train.max_steps))
    return q, steps


def _mechanism(cfg: DictConfig) -> Mechanism:
    options = OmegaConf.to_container(cfg.mechanism, resolve=True)
    return build_mechanism(options.pop("name"), **options)


def _privacy(cfg: DictConfig, mechanism: Mechanism, q: float, steps: int):
    """(z, plan, ledger, nominal ledger) for the mechanism's schedule."""
    p = cfg.privacy
    if not mechanism.private:
        return math.inf, None, None, None
    phases = mechanism.phases(steps)
    if p.noise_multiplier is not None:
        z, plan = float(p.noise_multiplier), fixed_plan(float(p.noise_multiplier), q, phases)
    else:
        z, plan = calibrate_plan(p.epsilon, p.delta, q, phases, p.accountant)
    honest_budget = math.inf if mechanism.accounting == "nominal" else p.epsilon
    ledger = PrivacyLedger(p.delta, p.accountant, honest_budget, plan)
    nominal = None
    if mechanism.accounting != "planned":
        nominal_budget = p.epsilon if mechanism.accounting == "nominal" else math.inf
        nominal = PrivacyLedger(p.delta, p.accountant, nominal_budget, plan)
    return z, plan, ledger, nominal


def build_run(cfg: DictConfig, data: DatasetBundle | None = None, dist: Dist = SINGLE) -> Run:
    """Compose data, model, engine, mechanism, privacy plan, ledger and optimizer.

    Raises ConfigError / DataError before anything is written anywhere. With ``dist``
    (several ranks), rank 0 draws the sampling and noise randomness and every rank
    receives it; sensitive sums are all-reduced before noise (training/distributed.py).
    """
    device = pick_device(device_for(cfg.device, dist))
    torch.manual_seed(cfg.seed)
    data = load_data(cfg) if data is None else data
    aux, data = build_aux(cfg.aux, data, root=cfg.data.root, seed=cfg.seed)
    if cfg.dataset.get("validation_size"):  # tuning: evaluate on held-out private examples
        data = carve_validation(data, int(cfg.dataset.validation_size), cfg.seed)
    n_train = int(data.train_y.shape[0])
    check_against_data(cfg, n_train)
    data = data.to(device)
    aux = aux.to(device) if aux is not None else None

    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    try:
        model = build_model(mcfg.pop("name"), data.in_shape, data.num_classes, **mcfg)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model: {e}") from None
    model = model.to(device)
    microbatch = cfg.grads.microbatch
    if microbatch == "auto":
        microbatch = auto_microbatch(count_parameters(model), cfg.train.batch_size, device)
    engine = GradEngine(
        model, microbatch, cfg.grads.backend, compile=cfg.grads.get("compile", False)
    )
    engine.dist = dist if dist.active else None
    engine.amp = torch.bfloat16 if cfg.train.get("amp") == "bf16" else None
    mechanism = _mechanism(cfg)
    if mechanism.private:
        check_private_model(model)
    try:
        mechanism.setup(engine, aux)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    q, total_steps = plan_steps(cfg, n_train)
    z, plan, ledger, nominal = _privacy(cfg, mechanism, q, total_steps)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, cfg.optim)
    schedule = build_schedule(optimizer, cfg.optim.schedule, total_steps)

    gens = {
        "sampler": torch.Generator(device=device).manual_seed(cfg.seed + 1),
        "noise": torch.Generator(device=device).manual_seed(cfg.seed + 2),
        "public": torch.Generator(device=device).manual_seed(cfg.seed + 3),
    }
    if cfg.privacy.rng == "secure":
        secure = SecureNoise()
        source, uniform = secure, (lambda n: secure.uniform(n, device))
        gens = {"public": gens["public"]}  # the secret streams are never saved
        draws = torch.float64
    else:
        source, uniform = SeededNoise(gens["noise"]), seeded_uniform(gens["sampler"], device)
        draws = torch.float32
    if dist.active:  # rank 0 draws, every rank receives
        source, uniform = (
            BroadcastNoise(source, dist),
            broadcast_uniform(uniform, dist, device, draws),
        )
    sampler = build_sampler(cfg.privacy.sampling, n_train, cfg.train.batch_size, uniform, device)
    privatizer = Privatizer(source, reduce=dist.all_reduce if dist.active else None)
    return Run(
        cfg=cfg, device=device, data=data, aux=aux, model=model, engine=engine,
        mechanism=mechanism, q=q, total_steps=total_steps, z=z, plan=plan, ledger=ledger,
        nominal=nominal, optimizer=optimizer, schedule=schedule, sampler=sampler,
        privatizer=privatizer, rng=gens["public"], generators=gens, dist=dist,
    )  # fmt: skip


# ---------------------------------------------------------------------- step
def _charge(run: Run, z: float, z_rec: float) -> float | None:
    """What the ledger is charged for this step; None if the budget refuses it."""
    mech = run.mechanism
    if not run.privatizer.records:
        raise PrivacyError(
            f"mechanism {mech.name}: released a gradient without drawing noise through ctx.noise"
        )
    if mech.accounting == "planned":
        if not z_rec >= z * (1 - REL_TOL):
            raise PrivacyError(
                f"mechanism {mech.name}, step {run.step}: the noise drawn gives multiplier "
                f"{z_rec:.6g}, less than the {z:.6g} the privacy plan charges; nothing was released"
            )
        return z
    if not z_rec > 0:
        raise PrivacyError(
            f"mechanism {mech.name}, step {run.step}: some direction of the release got no noise"
        )
    z_budget = z if mech.accounting == "nominal" else z_rec
    return z_rec if run.budget_ledger.can_step(z_budget, run.q) else None


def train_step(run: Run, idx: torch.Tensor | None = None, diagnostics: bool = False) -> StepOutcome:
    """Advance ``run`` by one step (``idx``: a given batch instead of a sampled one)."""
    mech = run.mechanism
    z = run.plan.multiplier_at(run.step) if run.plan is not None else math.inf
    if mech.private and mech.accounting == "planned" and not run.ledger.can_step(z, run.q):
        return StepOutcome(None, z, z, stopped_by_budget=True)
    idx = run.dist.shard(run.sampler.sample() if idx is None else idx)
    expected = run.cfg.train.batch_size
    ctx = StepContext(run.step, run.total_steps, expected, z, run.privatizer, run.rng, diagnostics)
    run.privatizer.begin_step()
    res = mech.step(run.data.train_x[idx], run.data.train_y[idx], ctx)
    z_rec = run.privatizer.effective_multiplier()
    charged = math.inf
    if mech.private:
        charged = _charge(run, z, z_rec)
        if charged is None:
            return StepOutcome(None, z, z_rec, stopped_by_budget=True)
        run.ledger.step(charged, run.q)
        if run.nominal is not None:
            run.nominal.step(z, run.q)
        for hook in run.on_release:  # secure mode: persist the ledger before anything leaves
            hook(run)
    if run.dist.active:  # every rank applies exactly rank 0's update
        res.grad = run.dist.broadcast(res.grad.contiguous())
        _reduce_stats(run, res)
    run.engine.set_grad(res.grad)
    run.optimizer.step()
    run.schedule.step()
    run.step += 1
    return StepOutcome(res, charged, z_rec)


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
        "schedule": run.schedule.state_dict(),
        "ledger": None if run.ledger is None else run.ledger.state_dict(),
        "nominal": None if run.nominal is None else run.nominal.state_dict(),
        "sampler": run.sampler.state_dict(),
        "mechanism": run.mechanism.state_dict(),
        "rng": rng_state(run.generators),
        "noise_source": run.privatizer.source.state_dict(),
        "noise_multiplier": run.z,
        "secure": run.secure,
        "uncovered": list(run.uncovered),
        "run_seconds": run.run_seconds,
    }


def load_run_state(run: Run, state: dict) -> None:
    from dpsub.training.checkpoint import restore_rng

    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.schedule.load_state_dict(state["schedule"])
    if state["ledger"] is not None:
        run.ledger = PrivacyLedger.from_state_dict(state["ledger"])
    if state.get("nominal") is not None:
        run.nominal = PrivacyLedger.from_state_dict(state["nominal"])
    run.sampler.load_state_dict(state["sampler"])
    run.mechanism.load_state_dict(state["mechanism"])
    clean, reseed = bool(state.get("clean", False)), f"{run.cfg.seed}:{int(state['step'])}"
    if not restore_rng(run.generators, state["rng"], clean=clean, reseed=reseed):
        run.privatizer.source.load_state_dict(state["noise_source"])
    run.step = int(state["step"])
    run.uncovered = list(state.get("uncovered", []))
    run.run_seconds = float(state.get("run_seconds", 0.0))
