"""The training loop: one reading from config to the final epsilon.

Path of one step:  sample a Poisson batch (on the device)  ->  the mechanism
turns its per-example gradients into one released gradient and states the
step's cost z_eff  ->  the ledger checks and records the cost  ->  the
optimizer applies the released gradient (post-processing).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from dpsub.config import check_against_data, validate
from dpsub.data import load_dataset
from dpsub.data.aux import build_aux
from dpsub.data.sampling import build_sampler
from dpsub.grads import GradEngine, check_private_model
from dpsub.logging import RunLogger
from dpsub.mechanisms import MECHANISMS, StepContext, build_mechanism
from dpsub.models import build_model, count_parameters
from dpsub.privacy import PrivacyLedger, calibrate_noise
from dpsub.training.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from dpsub.training.optim import build_optimizer, build_schedule

log = logging.getLogger("dpsub")


class Interrupted(SystemExit):
    """Raised after a SIGTERM/SIGINT once the checkpoint is written."""


@dataclass
class RunResult:
    steps: int
    epsilon: float
    delta: float
    noise_multiplier: float
    test_accuracy: float
    test_loss: float
    run_dir: Path
    stopped_by_budget: bool


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@torch.no_grad()
def evaluate(model, x, y, batch_size: int) -> tuple[float, float]:
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, x.shape[0], batch_size):
        logits = model(x[i : i + batch_size])
        loss += float(F.cross_entropy(logits, y[i : i + batch_size], reduction="sum"))
        correct += int((logits.argmax(-1) == y[i : i + batch_size]).sum())
    model.train()
    n = max(int(x.shape[0]), 1)
    return correct / n, loss / n


class _StopFlag:
    """SIGTERM/SIGINT set a flag; the loop finishes its step, checkpoints and exits."""

    def __init__(self):
        self.signum: int | None = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread (e.g. some launchers)
                pass
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def plan_steps(cfg: DictConfig, n_train: int) -> tuple[float, int]:
    q = cfg.train.batch_size / n_train
    steps = max(1, round(cfg.train.epochs / q))
    if cfg.train.max_steps is not None:
        steps = min(steps, int(cfg.train.max_steps))
    return q, steps


def train(cfg: DictConfig, run_dir: str | Path) -> RunResult:
    """Run (or resume) one experiment; everything it writes goes to ``run_dir``."""
    validate(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)

    # ---------------------------------------------------------------- data
    data = load_dataset(
        cfg.dataset.name,
        root=cfg.data.root,
        download=cfg.data.download,
        train_size=cfg.dataset.get("train_size"),
        balanced=cfg.dataset.get("balanced", True),
        seed=cfg.seed,
        image_size=cfg.dataset.get("image_size"),
        use_extra=cfg.dataset.get("use_extra", False),
        synthetic=OmegaConf.to_container(cfg.dataset.synthetic)
        if cfg.dataset.get("synthetic")
        else None,
    )
    aux, data = build_aux(cfg.aux, data, root=cfg.data.root, seed=cfg.seed)
    n_train = int(data.train_y.shape[0])
    check_against_data(cfg, n_train)
    data = data.to(device)
    if aux is not None:
        aux = aux.to(device)

    # --------------------------------------------------------------- model
    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    model = build_model(mcfg.pop("name"), data.in_shape, data.num_classes, **mcfg).to(device)
    engine = GradEngine(model, microbatch=cfg.grads.microbatch, backend=cfg.grads.backend)

    # ------------------------------------------------------------- privacy
    q, total_steps = plan_steps(cfg, n_train)
    p = cfg.privacy
    kcfg = OmegaConf.to_container(cfg.mechanism, resolve=True)
    mech_name = kcfg.pop("name")
    if not MECHANISMS[mech_name].private:
        z = math.inf
    elif p.noise_multiplier is not None:
        z = float(p.noise_multiplier)
    else:
        z = calibrate_noise(p.epsilon, p.delta, q, total_steps, p.accountant)
    mechanism = build_mechanism(mech_name, z, **kcfg)
    if mechanism.private:
        check_private_model(model)
    mechanism.setup(engine, aux)
    ledger = PrivacyLedger(
        delta=p.delta,
        accountant=p.accountant,
        budget=p.epsilon if mechanism.private else math.inf,
        planned=(z, q, total_steps) if p.noise_multiplier is None else None,
    )

    # ----------------------------------------------------------- optimizer
    params = [p_ for p_ in model.parameters() if p_.requires_grad]
    optimizer = build_optimizer(params, cfg.optim)
    schedule = build_schedule(optimizer, cfg.optim.schedule, total_steps)

    gens = {
        "sampler": torch.Generator(device=device).manual_seed(cfg.seed + 1),
        "noise": torch.Generator(device=device).manual_seed(cfg.seed + 2),
    }
    sampler = build_sampler(p.sampling, n_train, cfg.train.batch_size, gens["sampler"], device)

    # -------------------------------------------------------------- resume
    step = 0
    ckpt = load_checkpoint(run_dir, map_location=device)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        schedule.load_state_dict(ckpt["schedule"])
        ledger = PrivacyLedger.from_state_dict(ckpt["ledger"])
        sampler.load_state_dict(ckpt["sampler"])
        mechanism.load_state_dict(ckpt["mechanism"])
        restore_rng(gens, ckpt["rng"])
        step = int(ckpt["step"])
        if ckpt["noise_multiplier"] != z:
            raise RuntimeError(
                f"resume: the checkpoint's noise multiplier {ckpt['noise_multiplier']} differs from "
                f"this config's {z}; resume with the run's own saved config (.hydra/config.yaml)"
            )
        log.info("resumed from %s at step %d (epsilon spent %.4f)", run_dir, step, ledger.epsilon())

    resolved = OmegaConf.to_container(cfg, resolve=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    logger = RunLogger(run_dir, resolved, cfg.logger, cfg.run_name, resume_step=step)
    header = {
        "dataset": data.describe(),
        "model": f"{type(model).__name__} ({count_parameters(model):,} parameters)",
        "mechanism": mech_name,
        "sampling": f"{p.sampling} q={q:.5f} (B={cfg.train.batch_size}, N={n_train})",
        "steps": total_steps,
        "noise_multiplier": z,
        "target": f"epsilon={p.epsilon} delta={p.delta} ({p.accountant})",
        "device": str(device),
    }
    for k, v in header.items():
        log.info("%-16s %s", k, v)
    if p.sampling == "shuffle" and mechanism.private:
        log.warning("privacy.sampling=shuffle: the reported epsilon assumes Poisson sampling")

    def checkpoint() -> None:
        save_checkpoint(
            run_dir,
            {
                "step": step,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "ledger": ledger.state_dict(),
                "sampler": sampler.state_dict(),
                "mechanism": mechanism.state_dict(),
                "rng": rng_state(gens),
                "noise_multiplier": z,
            },
        )

    def eps_now(exact: bool) -> float:
        if not mechanism.private:
            return math.inf
        return ledger.epsilon() if exact or p.accountant == "rdp" else ledger.epsilon("rdp")

    # ---------------------------------------------------------------- loop
    t_cfg = cfg.train
    stopped_by_budget = False
    acc = loss = float("nan")
    window = {"loss": 0.0, "correct": 0, "n": 0, "t": time.perf_counter()}
    mech_metrics: dict[str, float] = {}  # latest value of each mechanism diagnostic
    bar = tqdm(total=total_steps, initial=step, disable=not t_cfg.progress, dynamic_ncols=True)
    model.train()
    try:
        with _StopFlag() as stop:
            while step < total_steps:
                z_eff = mechanism.effective_noise_multiplier()
                if mechanism.private and not ledger.can_step(z_eff, q):
                    stopped_by_budget = True
                    log.info("privacy budget spent after %d steps: stopping", step)
                    break
                idx = sampler.sample()
                ctx = StepContext(step, total_steps, cfg.train.batch_size, gens["noise"])
                res = mechanism.step(data.train_x[idx], data.train_y[idx], ctx)
                if res.z_eff != z_eff:
                    raise RuntimeError(
                        f"{mech_name}: stated z_eff {z_eff} but the step used {res.z_eff}"
                    )
                engine.set_grad(res.grad)
                optimizer.step()
                schedule.step()
                if mechanism.private:
                    ledger.step(res.z_eff, q)
                step += 1
                bar.update(1)
                window["loss"] += res.loss_sum
                window["correct"] += res.correct
                window["n"] += res.n
                mech_metrics.update(res.metrics)

                last = step == total_steps
                if t_cfg.log_every and (step % t_cfg.log_every == 0 or last):
                    n = max(window["n"], 1)
                    dt = time.perf_counter() - window["t"]
                    metrics = {
                        "train/loss": window["loss"] / n,
                        "train/accuracy": window["correct"] / n,
                        "train/batch_size": res.n,
                        "lr": schedule.get_last_lr()[0],
                        "epsilon_rdp" if p.accountant == "prv" else "epsilon": eps_now(False),
                        "z_eff": res.z_eff,
                        "steps_per_s": t_cfg.log_every / dt if dt > 0 else 0.0,
                        **{f"mech/{k}": v for k, v in mech_metrics.items()},
                    }
                    logger.log(metrics, step)
                    window = {"loss": 0.0, "correct": 0, "n": 0, "t": time.perf_counter()}
                if (t_cfg.eval_every and step % t_cfg.eval_every == 0) or last:
                    acc, loss = evaluate(model, data.test_x, data.test_y, t_cfg.eval_batch_size)
                    logger.log(
                        {"test/accuracy": acc, "test/loss": loss, "epsilon": eps_now(True)}, step
                    )
                bar.set_postfix(
                    loss=f"{res.loss_sum / max(res.n, 1):.3f}",
                    acc=f"{acc:.3f}",
                    eps=f"{eps_now(False):.3f}",
                    refresh=False,
                )
                if t_cfg.checkpoint_every and step % t_cfg.checkpoint_every == 0:
                    checkpoint()
                if stop.signum is not None:
                    checkpoint()
                    log.warning(
                        "signal %d: checkpoint saved at step %d; resume with resume=%s",
                        stop.signum,
                        step,
                        run_dir,
                    )
                    raise Interrupted(128 + stop.signum)
    finally:
        bar.close()

    # --------------------------------------------------------------- final
    checkpoint()
    acc, loss = evaluate(model, data.test_x, data.test_y, t_cfg.eval_batch_size)
    eps = eps_now(True)
    result = RunResult(step, eps, p.delta, z, acc, loss, run_dir, stopped_by_budget)
    summary = {
        "steps": step,
        "planned_steps": total_steps,
        "epsilon": eps,
        "delta": p.delta,
        "accountant": p.accountant,
        "noise_multiplier": z,
        "sampling": p.sampling,
        "test_accuracy": acc,
        "test_loss": loss,
        "stopped_by_budget": stopped_by_budget,
    }
    logger.log({"test/accuracy": acc, "test/loss": loss, "epsilon": eps}, step)
    logger.summary(summary)
    logger.close()
    eps_txt = "inf (non-private)" if not math.isfinite(eps) else f"{eps:.4f}"
    print(
        f"final: test accuracy {100 * acc:.2f}% | epsilon {eps_txt} (delta={p.delta}, "
        f"{p.accountant}, {p.sampling}) | {step} steps | noise multiplier {z:.4f} | run dir {run_dir}",
        flush=True,
    )
    return result
