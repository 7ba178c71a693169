"""The training loop: one reading from config to the final epsilon.

``train(cfg, run_dir)`` builds the run (:func:`~dpsub.training.build.build_run`: data,
model, mechanism, privacy plan; every config or data error is raised before a file
is written), continues it from ``run_dir``'s checkpoint if there is one (refusing any
change that would alter a release), then repeats :func:`~dpsub.training.build.train_step`
until the planned steps are done or the budget is spent, logging, evaluating and
checkpointing on the way.

What is logged. By default only what the privacy guarantee covers: epsilon, the
noise multiplier charged, the learning rate, test-set metrics, and mechanism
metrics computed from released or public quantities. Statistics of the private
batches (training loss and accuracy, realized batch size, clip fractions, GEP's
projection error...) are computed without noise; they are logged, under
``private/``, only with ``privacy.private_diagnostics=true``, and the run's summary
then says that its outputs are not covered by its epsilon. That label is sticky
(``Run.uncovered``, kept in checkpoints): no resume turns an uncovered run covered.
Throughput is logged only as a run average (``summary.json``), never per log window:
step times track the realized Poisson batch sizes; secure-mode runs log no timing
at all (docs/privacy.md, "What epsilon does not cover").
"""

from __future__ import annotations

import logging
import math
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from dpsub.config import Settings, validate
from dpsub.data.aux_options import aux_options
from dpsub.errors import ConfigError, ResumeError
from dpsub.models import count_parameters
from dpsub.privacy import epsilon_for
from dpsub.rundir import (
    CHECKPOINT,
    CONFIG,
    FINGERPRINT_KEY,
    LOG,
    MIA,
    RunDir,
    hardware,
    not_covered_statistics,
)
from dpsub.tracking import RunLogger
from dpsub.training.build import Run, StepOutcome, build_run, load_run_state, run_state, train_step
from dpsub.training.checkpoint import (
    LEDGER_NAME,
    check_resume,
    data_fingerprint,
    fingerprint_key,
    journal_ledger,
    key_of,
    load_checkpoint,
    lock_run_dir,
    save_checkpoint,
)
from dpsub.training.distributed import init_distributed
from dpsub.training.ema import evaluate_released, released
from dpsub.training.heap import keep_freed_memory
from dpsub.training.progress import Progress, attach_run_log

log = logging.getLogger("dpsub")


class Interrupted(SystemExit):
    """Raised after a SIGTERM/SIGINT once the checkpoint is written."""


@dataclass
class RunResult:
    steps: int
    epsilon: float
    delta: float
    noise_multiplier: float
    test_accuracy: float  # on the validation split for a tuning run (dataset.validation_size)
    test_loss: float
    run_dir: Path
    stopped_by_budget: bool
    epsilon_nominal: float | None = None


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


def eval_metrics(run: Run, acc: float, loss: float) -> dict[str, float]:
    """``test/...``, or ``validation/...`` for a tuning run (dataset.validation_size)."""
    split = run.data.eval_split
    return {f"{split}/accuracy": acc, f"{split}/loss": loss}


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


# ------------------------------------------------------------------ epsilon
def epsilons(run: Run, exact: bool) -> dict[str, float]:
    """Epsilon spent (honest) and, for measured-accounting mechanisms, the nominal one.

    ``exact``: with the configured accountant (PRV is slow: evaluations only); else RDP.
    """
    return run.account.epsilons(exact)


# ------------------------------------------------------------------ metrics
class Window:
    """Private batch statistics accumulated between two log lines."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.correct = 0
        self.n = 0
        self.clipped = 0
        self.nonfinite = 0
        self.steps = 0

    def add(self, out: StepOutcome) -> None:
        st = out.result.stats
        self.loss += st.loss_sum
        self.correct += st.correct
        self.n += st.clip.n
        self.clipped += st.clip.clipped
        self.nonfinite += st.clip.nonfinite
        self.steps += 1

    def private_metrics(self) -> dict[str, float]:
        n = max(self.n, 1)  # the device counters are read here, when logged (host syncs)
        return {
            "private/train_loss": float(self.loss) / n,
            "private/train_accuracy": int(self.correct) / n,
            "private/batch_size": self.n / max(self.steps, 1),
            "private/clip_fraction": int(self.clipped) / n,
            "private/nonfinite": int(self.nonfinite),
        }


def log_metrics(run: Run, out: StepOutcome, window: Window, mech: dict, private: bool) -> dict:
    """A log line's metrics; no timing (a window's steps/s tracks its private batch sizes)."""
    metrics = {
        "lr": run.schedule.get_last_lr()[0],
        "z_eff": out.z_charged,
        **epsilons(run, exact=False),
        **{f"mech/{k}": v for k, v in out.result.metrics.items()},
    }
    if private:
        metrics.update(window.private_metrics())
        metrics.update({f"private/mech/{k}": float(v) for k, v in mech.items()})
    return metrics


def _stop_requested(run: Run, stop: _StopFlag) -> bool:
    """Did any rank get SIGTERM/SIGINT? (All ranks must stop after the same step.)"""
    flag = stop.signum is not None
    if run.dist.active:
        flag = bool(run.dist.all_reduce(torch.tensor([float(flag)], device=run.device)).item())
    return flag


# --------------------------------------------------------------------- run
def _budget_below_one_step(run: Run, z: float) -> ConfigError:
    """``privacy.epsilon`` cannot pay for the first step at multiplier ``z`` (a fixed
    ``privacy.noise_multiplier`` too small, DP-Hero's honest multiplier, or a restart whose
    ledger already counts the releases of the attempt before)."""
    p, name = run.settings.privacy, run.mechanism.name
    if run.ledger is not None and run.ledger.steps:
        return ConfigError(
            f"privacy.epsilon: the budget {p.epsilon} is spent: the run's ledger counts "
            f"{run.ledger.steps} steps (epsilon {run.ledger.epsilon():.4g}) made before it "
            "stopped, and affords no more; nothing was trained. Start a new run in another out_dir"
        )
    one = epsilon_for([(z, run.q, 1)], p.delta, p.accountant)
    hint = " (experiment=dphero_mnist_lenet: docs/dphero.md)" if "dphero" in name else ""
    return ConfigError(
        f"privacy.epsilon: the budget {p.epsilon} does not cover one step of {name} (epsilon "
        f"{one:.4g} at noise multiplier {z:.4g}); nothing was trained. Raise "
        f"privacy.epsilon or the noise{hint}"
    )


def _check_first_step(run: Run) -> None:
    """Planned accounting: a budget below the first step is known before anything is written."""
    if run.step or run.account.admit(0):  # (admit: True unless planned and unaffordable)
        return
    raise _budget_below_one_step(run, run.account.multiplier(0))


def _refuse_new_run(run_dir: Path, checkpointed: bool) -> ResumeError:
    """A new run may not start in a dir that holds one: its outputs, and in secure mode the
    releases its ledger counts, would be forgotten by the new run's ledger."""
    journal = journal_ledger(run_dir)
    how = ""
    if not checkpointed:
        counted = f"; its ledger counts {journal.steps} released steps" if journal else ""
        how = f" (it stopped before its first checkpoint{counted}: it continues from step 0)"
    return ResumeError(
        f"out_dir: {run_dir} already holds a run; continue it with resume={run_dir}{how}, "
        "or give the new run another out_dir"
    )


def _restore(run: Run, cfg: DictConfig, run_dir: Path, ckpt: dict | None) -> None:
    """Check that the resumed config releases what the saved one did, and restore the state
    (none without a checkpoint: the run continues from step 0, as built)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if ckpt is None:  # stopped before its first checkpoint: config.yaml is the run's config
        if not (run_dir / CONFIG).is_file():
            raise ResumeError(f"resume: {run_dir} has no {run_dir / CHECKPOINT}; nothing to resume")
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / CONFIG))
        check_resume(saved, resolved, None, run.fingerprint)
        return
    if ckpt.get("data_fingerprint_keyed") and fingerprint_key(run_dir) is None:
        raise ResumeError(
            f"resume: {run_dir / FINGERPRINT_KEY} is missing: without the run's key its "
            "checkpoint cannot be checked against the private training set"
        )
    check_resume(ckpt["config"], resolved, ckpt.get("data_fingerprint"), run.fingerprint)
    load_run_state(run, ckpt["state"])


def _start_or_resume(run: Run, cfg: DictConfig, run_dir: Path, resume: bool) -> list[str]:
    """Restore ``run`` from ``run_dir`` (checked), or refuse to start anew in a dir that
    holds a run (with or without a checkpoint).

    Returns the lines to log once ``train.log`` is attached (the resume marker)."""
    ckpt = load_checkpoint(run_dir, map_location=run.device)
    key = key_of(ckpt, run_dir)  # None: a new run (its first checkpoint makes one)
    run.fingerprint = data_fingerprint(run.data.train_x, run.data.train_y, key)
    started = run.dist.broadcast_object(RunDir(run_dir).started)  # rank 0's view, before it writes
    if not resume:
        if started:
            raise _refuse_new_run(run_dir, ckpt is not None)
        return []
    _restore(run, cfg, run_dir, ckpt)
    notes = []
    if (run_dir / MIA).exists():  # scripts/mia.py attacked the model: not covered
        uncover(run, "membership_inference")
    if run.secure and run.ledger is not None:  # fresh secret noise: charge every step that ran
        journal = journal_ledger(run_dir)
        if run.ledger.steps and (journal is None or journal.steps < run.ledger.steps):
            raise ResumeError(
                f"resume: {run_dir / LEDGER_NAME} is missing or counts fewer steps than the "
                "checkpoint: in secure mode it is the only record of the steps that ran after "
                "the checkpoint, which a resume must charge; restore it from the run dir"
            )
        if journal is not None and journal.steps > run.ledger.steps:
            since = "the checkpoint" if ckpt is not None else "the start (no checkpoint)"
            notes.append(
                f"secure mode: {journal.steps - run.ledger.steps} steps ran after {since} "
                "and are charged again"
            )
            run.ledger = journal
    light = run.light_resumes[-1] if run.light_resumes else None
    if light is not None and light["step"] == run.step:
        notes.append(
            f"light checkpoint: {', '.join(light['dropped'])} left out (public state: "
            f"recomputed from step {run.step}); no step ran after it, so none is replayed, and "
            "from here the run is not bit-identical to an uninterrupted one"
        )
    eps = epsilons(run, False).get("epsilon", math.nan)
    notes.append(
        f"resumed {run_dir} at step {run.step} (epsilon spent {eps:.4f}); "
        "steps after it logged above are run again"
    )
    return notes


def uncover(run: Run, reason: str) -> None:
    """Mark the run's outputs as not covered by its epsilon (for good: checkpointed)."""
    if reason not in run.uncovered:
        run.uncovered.append(reason)


def _uncovered_by_config(run: Run, private: bool) -> None:
    """What the settings alone leave uncovered; marked before anything is logged."""
    if private:
        uncover(run, "private_diagnostics")
    if not run.account.covered_by_epsilon:  # the budget is enforced on a nominal epsilon
        uncover(run, "nominal_accounting")
    if run.settings.privacy.sampling == "shuffle" and run.mechanism.private:
        uncover(run, "shuffle_sampling")  # its epsilon assumes Poisson sampling
    if run.account.simulation is not None:  # a simulated noise level is no guarantee
        uncover(run, "simulated_noise")
    aux = aux_options(run.settings.aux)
    if (
        run.mechanism.private
        and aux.get("name") == "public_train"
        and aux.get("pick") == "balanced"
    ):
        uncover(run, "public_part_chosen_with_private_labels")  # aux.pick=balanced


def _header(run: Run, logger) -> dict:
    p = run.settings.privacy
    engine = run.engine
    return {
        "dataset": run.data.describe(),
        "aux": run.aux.describe() if run.aux is not None else "none",
        "model": f"{type(run.model).__name__} ({count_parameters(run.model):,} parameters)",
        "mechanism": run.mechanism.name,
        "sampling": f"{p.sampling} q={run.q:.5f} (B={run.settings.train.batch_size}, N={len(run.data.train_y)})",
        "steps": run.total_steps,
        "noise_multiplier": run.z,
        "target": f"epsilon={p.epsilon} delta={p.delta} ({p.accountant}, rng {p.rng})",
        **_simulated_header(run),
        "device": f"{run.device} (world size {run.dist.world})",
        "hardware": hardware(),
        "grads": f"backend {engine.backend}, microbatch {engine.microbatch}"
        + (", compiled" if engine.compile else ""),
        "logger": logger.describe(),
    }


def _simulated_header(run: Run) -> dict:
    sim = run.account.simulation
    if sim is None:
        return {}
    return {"target": "none: the budget is not enforced (simulated noise level)",
            "simulate": sim.describe()}  # fmt: skip


class _NoLogger:
    """Ranks other than 0 write nothing."""

    def log(self, *a) -> None: ...
    def describe(self) -> str:
        return "rank 0 writes the logs"

    def summary(self, *a) -> None: ...
    def close(self) -> None: ...


def train(cfg: DictConfig | Settings, run_dir: str | Path, resume: bool = False) -> RunResult:
    """Run (or, with ``resume``, continue) one experiment; everything goes to ``run_dir``.

    ``cfg``: the composed config, or its Settings when the caller validated it already (the
    command line does: a run validates its config once). Under torchrun every rank calls
    this; rank 0 owns the run dir, the logs and the checkpoints (training/distributed.py).
    """
    settings = validate(cfg)
    cfg = settings.cfg
    keep_freed_memory()  # the next step reuses this step's memory (no page faults; heap.py)
    dist = init_distributed(settings.device)
    run_dir = Path(dist.broadcast_object(str(run_dir)))  # rank 0's (its clock names it)
    if not dist.main:
        log.setLevel(logging.WARNING)
    run = build_run(settings, dist=dist, say=log.info)
    unlock = detach_log = lambda: None  # noqa: E731
    fresh = False  # this process made the run dir (only then may a refusal remove it)
    if dist.main and (run_dir.is_dir() or not resume):  # one process per run dir, held
        try:  # from before the checkpoint is read
            run_dir.mkdir(parents=True)
            fresh = True
        except FileExistsError:  # (another process may have made it a moment ago)
            pass
        unlock = lock_run_dir(run_dir, "resume" if resume else "out_dir")
    try:
        notes = _start_or_resume(run, cfg, run_dir, resume)
        _check_first_step(run)
        if dist.main:
            if not resume:
                OmegaConf.save(cfg, run_dir / CONFIG, resolve=True)
            detach_log = attach_run_log(run_dir / LOG)
        for line in notes:  # after attaching: train.log marks where a resumed run continues
            (log.warning if line.startswith("secure") else log.info)(line)
        result = _loop(run, cfg, run_dir)
    except (ConfigError, KeyboardInterrupt):
        detach_log()
        unlock()
        if fresh and run.step == 0:  # refused or stopped before its first step: leave nothing
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        detach_log()
        unlock()
    dist.shutdown()
    return result


def _warn_not_covered(run: Run, private: bool) -> None:
    """The warnings of a run whose outputs its epsilon does not (fully) cover."""
    if run.settings.privacy.sampling == "shuffle" and run.mechanism.private:
        log.warning(
            "privacy.sampling=shuffle: the reported epsilon assumes Poisson sampling; this "
            "run's outputs are NOT covered by it"
        )
    if private:
        log.warning(
            "privacy.private_diagnostics=true: the logs hold unprivatized statistics of "
            "the private data; this run's outputs are NOT covered by its epsilon"
        )
    if run.account.simulation is not None:
        log.warning(
            "privacy.simulate: a simulated noise level is NOT a privacy guarantee; the epsilon "
            "logged is this run's own (noise multiplier %.4g at q=%.5g), the reference's "
            "epsilon %.4g only names the noise level; this run's outputs are not covered",
            run.z, run.q, run.account.simulation.epsilon_ref,
        )  # fmt: skip
        sim = run.account.simulation
        if sim.batch_size < sim.run_batch_size:
            log.warning(
                "privacy.simulate.batch_size=%d is below this run's batch %d: it draws more "
                "noise than a real run at its own batch would need (a simulation stands a small "
                "batch in for a larger one); for a guarantee at this noise, drop privacy.simulate",
                sim.batch_size, sim.run_batch_size,
            )  # fmt: skip
    if not run.account.covered_by_epsilon:
        log.warning(
            "mechanism.accounting=nominal: the budget is enforced on the paper's nominal "
            "epsilon, which is NOT a privacy guarantee; the honest epsilon is logged beside it"
        )


class _Saver:
    """The loop's wall and CPU time (summed over a run's processes) and its checkpoints."""

    def __init__(self, run: Run, run_dir: Path, resolved: dict):
        self.run, self.run_dir, self.resolved = run, run_dir, resolved
        self.start, self.seconds_before = time.perf_counter(), run.run_seconds
        self.cpu_start, self.cpu_before = time.process_time(), run.cpu_seconds
        self.keyed = False  # run.fingerprint is under the key on disk (first checkpoint)

    def tick(self) -> None:
        self.run.run_seconds = self.seconds_before + time.perf_counter() - self.start
        if self.cpu_before is not None:  # None: unknown since a resume, stays unknown
            self.run.cpu_seconds = self.cpu_before + time.process_time() - self.cpu_start

    def __call__(self, clean: bool = False) -> None:  # clean: no step runs after it (stop, end)
        run = self.run
        if not run.dist.main:
            return
        state = {**run_state(run), "clean": clean}
        if not self.keyed:  # the run's secret key, before the first checkpoint that uses it
            key = fingerprint_key(self.run_dir, create=True)
            run.fingerprint = data_fingerprint(run.data.train_x, run.data.train_y, key)
            self.keyed = True
        save_checkpoint(self.run_dir, {
            "state": state, "config": self.resolved,
            "data_fingerprint": run.fingerprint, "data_fingerprint_keyed": True,
        })  # fmt: skip
        if run.ledger is not None and not run.secure:
            run.ledger.save(self.run_dir / LEDGER_NAME)


@dataclass
class _Shown:
    """What the loop has logged since its last log line, and its latest evaluation."""

    window: Window
    mech_private: dict
    acc: float | None = None
    loss: float | None = None
    resumed: float | None = None  # the accuracy a resumed run showed last

    @property
    def accuracy(self) -> float | None:
        return self.acc if self.acc is not None else self.resumed


def _after_step(run: Run, out: StepOutcome, shown: _Shown, logger, progress, private) -> None:
    """Log lines, evaluations and the progress bar after one step."""
    t = run.settings.train
    shown.window.add(out)
    shown.mech_private.update(out.result.private_metrics)
    step, last = run.step, run.step == run.total_steps
    if t.log_every and (step % t.log_every == 0 or last):
        metrics = log_metrics(run, out, shown.window, shown.mech_private, private)
        logger.log(metrics, step)
        progress.log(step, metrics, shown.accuracy)
        shown.window = Window()
    if run.dist.main and ((t.eval_every and step % t.eval_every == 0) or last):
        shown.acc, shown.loss, raw = evaluate_released(run, evaluate)
        ev = {**eval_metrics(run, shown.acc, shown.loss), **raw, **epsilons(run, exact=True)}
        logger.log(ev, step)
        progress.evaluation(step, ev)
    eps = epsilons(run, False).get("epsilon", math.inf)
    progress.update(step, eps, shown.accuracy)


def _loop(run: Run, cfg: DictConfig, run_dir: Path) -> RunResult:
    resolved = OmegaConf.to_container(cfg, resolve=True)
    s, t = run.settings, run.settings.train
    private, main = s.privacy.private_diagnostics, run.dist.main
    _uncovered_by_config(run, private)
    if run.secure and main:
        run.on_release.append(lambda r: r.ledger.save(run_dir / LEDGER_NAME, sync=True))
    logger = (
        RunLogger(run_dir, resolved, s.logger, cfg.run_name, resume_step=run.step)
        if main
        else _NoLogger()
    )
    for k, v in _header(run, logger).items():
        log.info("%-16s %s", k, v)
    _warn_not_covered(run, private)
    saver, stopped_by_budget = _Saver(run, run_dir, resolved), False
    # step 0: the run's config and (keyed) data fingerprint are on record before its first
    # release, so a resume is checked against them even if it stops before its next
    # checkpoint (seeded noise replayed on edited data or config would leak the difference);
    # reseeded: the old device's checkpoint would replay these steps with other noise
    if run.step == 0 or run.reseeded:
        saver()
    resumed = _resumed_accuracy(run_dir, run.step, run.data.eval_split) if run.step else None
    shown = _Shown(Window(), {}, resumed=resumed)
    progress = Progress(
        run.total_steps, run.step, t.progress and main, run.data.eval_split, timing=not run.secure
    )
    try:
        with _StopFlag() as stop:
            while run.step < run.total_steps:
                out = train_step(run, diagnostics=private)
                if out.stopped_by_budget:
                    if run.step == 0:  # nothing trained: an error, not a run that "succeeded"
                        logger.close()
                        raise _budget_below_one_step(run, out.z_records)
                    stopped_by_budget = True
                    log.info("privacy budget spent after %d steps: stopping", run.step)
                    break
                _after_step(run, out, shown, logger, progress, private)
                if t.checkpoint_every and run.step % t.checkpoint_every == 0:
                    saver.tick()
                    saver()
                if _stop_requested(run, stop):
                    saver.tick()
                    saver(clean=True)
                    log.warning("signal %d: checkpoint saved at step %d; resume with resume=%s",
                                stop.signum, run.step, run_dir)  # fmt: skip
                    raise Interrupted(128 + stop.signum)
    finally:
        progress.close()
    saver.tick()
    done = run.step == run.total_steps and shown.acc is not None
    final_eval = (shown.acc, shown.loss) if done else None
    return _finish(run, run_dir, logger, saver, stopped_by_budget, final_eval)


def _resumed_accuracy(run_dir: Path, step: int, split: str) -> float | None:
    """The last accuracy evaluated at or before ``step`` (a resumed run's step lines show it
    until its next evaluation, not ``-``); None when there is none or no metrics file."""
    from dpsub.tracking import read_metrics

    key = f"{split}/accuracy"
    try:
        evals = [m for m in read_metrics(run_dir) if key in m and m.get("step", 0) <= step]
    except (OSError, ValueError):
        return None
    return evals[-1][key] if evals else None


def membership_inference(run: Run, logger) -> dict:
    """``eval.mia=true``: attack the final model (``private/mia/*``: not covered by epsilon)."""
    if not run.settings.eval.mia:
        return {}
    from dpsub.eval.mia import evaluate_run

    result = evaluate_run(run)
    logger.log(result, run.step)
    log.warning(
        "eval.mia=true: membership-inference success %.4f [%.4f, %.4f] on %d examples "
        "(computed from the private training set without noise: not covered by epsilon)",
        result["private/mia/success"], result["private/mia/ci_low"],
        result["private/mia/ci_high"], result["private/mia/examples"],
    )  # fmt: skip
    return result


def _simulated_summary(run: Run) -> dict:
    """``simulated``: the reference a noise-matched run simulates (NOT a guarantee)."""
    sim = run.account.simulation
    return {} if sim is None else {"simulated": sim.as_dict()}


def run_timing(run: Run) -> dict[str, float]:
    """Run-average throughput (none in secure mode: timing tracks the private batch sizes)."""
    if run.secure or run.run_seconds <= 0:
        return {}
    cpu = {} if run.cpu_seconds is None else {"cpu_seconds": run.cpu_seconds}
    return {"run_seconds": run.run_seconds, "steps_per_s": run.step / run.run_seconds, **cpu}


def _finish(run, run_dir, logger, checkpoint, stopped_by_budget, final_eval) -> RunResult:
    """Checkpoint, evaluate (unless the loop just did), write the summary and the final line."""
    if not run.dist.main:
        nan = float("nan")
        return RunResult(
            run.step, nan, run.settings.privacy.delta, run.z, nan, nan, run_dir, stopped_by_budget
        )
    if run.settings.eval.mia:
        uncover(run, "membership_inference")  # before the result is written anywhere
    checkpoint(clean=True)
    p = run.settings.privacy
    eps = epsilons(run, exact=True)
    if final_eval is None:
        acc, loss, raw = evaluate_released(run, evaluate)
        logger.log({**eval_metrics(run, acc, loss), **raw, **eps}, run.step)
    else:
        acc, loss = final_eval
    with released(run):
        mia = membership_inference(run, logger)
    logger.summary(_summary(run, eps, acc, loss, stopped_by_budget, mia))
    logger.close()
    _log_final_line(run, run_dir, eps, acc)
    return RunResult(run.step, eps["epsilon"], p.delta, run.z, acc, loss, run_dir,
                     stopped_by_budget, eps.get("epsilon_nominal"))  # fmt: skip


def _summary(run, eps: dict, acc, loss, stopped_by_budget: bool, mia: dict) -> dict:
    """The summary record of a finished run (its privacy, result and timing)."""
    p = run.settings.privacy
    summary = {
        "steps": run.step,
        "planned_steps": run.total_steps,
        **eps,
        "delta": p.delta,
        "accountant": p.accountant,
        "noise_multiplier": run.z,
        "sampling": p.sampling,
        "rng": p.rng,
        f"{run.data.eval_split}_accuracy": acc,
        f"{run.data.eval_split}_loss": loss,
        "stopped_by_budget": stopped_by_budget,
        "covered_by_epsilon": not run.uncovered,
        "not_covered": list(run.uncovered),
        "device": run.device.type,
        "hardware": hardware(),
        **_simulated_summary(run),
        **({"light_resumes": run.light_resumes} if run.light_resumes else {}),
        **mia,
        **run_timing(run),
    }
    summary["not_covered_statistics"] = not_covered_statistics(summary)
    return summary


def _log_final_line(run, run_dir, eps: dict, acc) -> None:
    """The log's final line: accuracy, epsilon (nominal, simulated), steps, speed."""
    p = run.settings.privacy
    e = eps["epsilon"]
    eps_txt = "inf (non-private)" if not math.isfinite(e) else f"{e:.4f}"
    if "epsilon_nominal" in eps:
        eps_txt += f" (nominal {eps['epsilon_nominal']:.4f})"
    if run.account.simulation is not None:
        sim = run.account.simulation
        eps_txt += (f" (this run's own; SIMULATED noise of batch {sim.batch_size} at "
                    f"epsilon {sim.epsilon_ref:.4g}: not a privacy guarantee)")  # fmt: skip
    timing = run_timing(run)
    speed = f" | {timing['steps_per_s']:.1f} steps/s (run average)" if timing else ""
    log.info(
        f"final: {run.data.eval_split} accuracy %.2f%% | epsilon %s (delta=%s, %s, %s) | %d steps | noise multiplier %.4f{speed} | run dir %s",
        100 * acc,
        eps_txt,
        p.delta,
        p.accountant,
        p.sampling,
        run.step,
        run.z,
        run_dir,
    )
