"""The train entrypoint: ``dpsub-train`` / ``python -m dpsub.cli.train``.

* ``dpsub-train [overrides]``: dpsub checks that every group option and key named
  exists (``dpsub.overrides``), Hydra composes ``conf/config.yaml``, dpsub validates the
  config and checks the data files, W&B key and device (torch-free where it can: fast),
  builds the run and only then creates its directory (``out_dir``; in a multirun
  ``<hydra.sweep.dir>/<job number>_<overrides>``).
* ``dpsub-train -m ...``: a Hydra multirun. Every job of a plain sweep is composed and
  validated before the first one starts, so a bad value fails before anything is
  written.
* ``dpsub-train resume=<run dir> [key=value ...]``: continue that run with the run's
  own saved ``config.yaml``. Overrides are refused unless they cannot change a
  release (``dpsub.training.checkpoint.RESUME_MAY_CHANGE``: logging, evaluation and
  checkpoint frequency, W&B, data location); nothing is written before the resume
  is known to be valid.

Errors print one line on stderr: exit code 2 for a bad config or data file, 3 for a
privacy error (a mechanism drawing less noise than its plan).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpsub.cli.common import (
    CONF_DIR,
    MULTIRUN_FLAGS,
    check_args,
    configure_logging,
    fail,
    interruptible,
    job_dir,
    run_dir_arg,
)
from dpsub.errors import ConfigError, ResumeError, exit_code
from dpsub.rundir import CONFIG


def plan_line(cfg: DictConfig) -> str:
    """What a run will do, in one line, from the config alone (no torch, no data)."""
    p, t = cfg.privacy, cfg.train
    if cfg.mechanism.name == "nonprivate":
        budget = "non-private"
    elif (p.get("simulate") or {}).get("batch_size") is not None:
        budget = _simulated_budget(p)
    elif p.noise_multiplier is not None:
        budget = f"noise multiplier {p.noise_multiplier}, epsilon <= {p.epsilon}"
    else:
        budget = f"epsilon {p.epsilon}"
    budget += f" (delta {p.delta}, {p.accountant}, {p.sampling})"
    steps = f"{t.epochs} epochs of batch {t.batch_size}"
    steps += f", at most {t.max_steps} steps" if t.max_steps is not None else ""
    aux = "" if cfg.aux.name == "none" else f", aux {cfg.aux.name}"
    model = cfg.model.get("_target_") or cfg.model.name  # model=custom: the class
    return (
        f"plan: {cfg.mechanism.name} on {cfg.dataset.name} with {model}{aux} | {budget} | {steps}"
    )


def _simulated_budget(p: DictConfig) -> str:
    """The plan line's budget of a noise-matched run (privacy.simulate)."""
    sim = p.simulate
    ref = (
        f"z_ref {sim.noise_multiplier}" if sim.noise_multiplier is not None
        else f"epsilon {sim.epsilon or p.epsilon}"
    )  # fmt: skip
    return (
        f"SIMULATED noise level of batch {sim.batch_size} at {ref} (NOT a privacy guarantee; "
        "the run's own epsilon is logged)"
    )


def train_run(cfg: DictConfig, run_dir: Path, resume: bool = False) -> float:
    """Validate, say the plan, train; return the evaluation accuracy (dpsub errors raise)."""
    import logging
    import os

    from dpsub.config import check_environment, validate

    settings = validate(cfg)  # before torch is imported: bad values fail in well under a second
    check_environment(cfg)  # data files, W&B key (torch-free), then the device
    if os.environ.get("RANK", "0") == "0":  # the plan first: torch takes seconds to import
        logging.getLogger("dpsub").info("%s -> %s", plan_line(cfg), run_dir)
        logging.getLogger("dpsub").info("setup: importing torch")  # seconds: never silent
    from dpsub.training.loop import train

    return train(settings, run_dir, resume=resume).test_accuracy  # validated once


def run(cfg: DictConfig, run_dir: Path, resume: bool = False) -> float:
    """:func:`train_run`, with dpsub's errors turned into one line and an exit code."""
    try:
        return train_run(cfg, run_dir, resume)
    except Exception as e:  # noqa: BLE001 -- dpsub's own errors become one line
        if exit_code(e) is None:
            raise
        fail(e)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    if cfg.resume is not None:
        fail(ResumeError("resume: use `dpsub-train resume=<run dir>` on its own, not in a sweep"))
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # finished: skipped; failed: recorded
        from dpsub.cli.sweeps import job_label, run_job
        from dpsub.training.progress import job_prefix

        hc = HydraConfig.get()
        label = job_label(list(hc.overrides.task))
        name = f"job {hc.job.num}" + (f" ({label})" if label else "")
        with job_prefix(f"job {hc.job.num} | "):  # parallel jobs' lines interleave
            return run_job(cfg, job_dir(cfg), train_run, name)
    return run(cfg, job_dir(cfg))  # the value a Hydra sweeper would optimize


# ------------------------------------------------------------------ resume
def resume(args: list[str]) -> float:
    """``resume=<dir> [key=value ...]``: the run's own config, changed only where allowed."""
    from dpsub.overrides import apply_to_saved
    from dpsub.training.checkpoint import changed_keys

    run_dir = Path([a for a in args if a.startswith("resume=")][-1].split("=", 1)[1])
    if not (run_dir / CONFIG).is_file():  # (no checkpoint: it continues from step 0)
        fail(ResumeError(
            f"resume: {run_dir} is not a dpsub run dir (needs {CONFIG}); nothing was created"
        ))  # fmt: skip
    rest = [a for a in args if not a.startswith("resume=")]
    bad = [a for a in rest if a.startswith(("-", "+", "~")) or "=" not in a]
    if bad:
        fail(ResumeError(f"resume: only key=value overrides can go with resume=, got {bad}"))
    saved = OmegaConf.load(run_dir / CONFIG)
    try:
        cfg = apply_to_saved(saved, rest)  # GROUP=OPTION and KEY=VALUE; unknown keys refused
    except ConfigError as e:
        fail(e)
    keys = changed_keys(OmegaConf.to_container(saved), OmegaConf.to_container(cfg))
    if keys:
        fail(ResumeError(
            f"resume: cannot change {', '.join(keys)}: they change what the run releases or how "
            "it is accounted; only logging, evaluation and checkpoint settings may change"
        ))  # fmt: skip
    cfg.resume = str(run_dir)
    configure_logging()
    return run(cfg, run_dir, resume=True)


# ---------------------------------------------------------------- sweeps
def validate_sweep(args: list[str]) -> str | None:
    """Validate every job of a plain Hydra sweep (and find its data) before any starts;
    return the sweep folder (dpsub.cli.sweeps)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dpsub.cli.sweeps import check_jobs

    hydra_ov = [a for a in args if a.startswith(("hydra.", "hydra/"))]
    overrides = [a for a in args if not a.startswith("-") and a not in hydra_ov]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # noqa: BLE001 -- a syntax Hydra itself will report
        return None
    return check_jobs(jobs, hydra_ov)


def multirun(args: list[str]) -> None:
    """``-m``: check every job, fix the sweep folder, run the jobs, report failed ones."""
    from dpsub.cli import sweeps
    from dpsub.overrides import quote_value

    sweep_dir = validate_sweep(args)
    if sweep_dir and not any(a.startswith("hydra.sweep.dir=") for a in args):
        sys.argv.append(f"hydra.sweep.dir={quote_value(sweep_dir)}")  # the folder named above
    sweeps.start(sweep_dir)
    main()
    sweeps.report(sweep_dir)


@interruptible
def cli() -> None:
    """``dpsub-train [experiment=NAME] [overrides]`` (see the module docstring)."""
    args = sys.argv[1:]
    if any(a.startswith("resume=") for a in args) and not any(a in MULTIRUN_FLAGS for a in args):
        target = Path([a for a in args if a.startswith("resume=")][-1].split("=", 1)[1])
        from dpsub.cli import sweeps

        if not sweeps.is_sweep_dir(target):
            resume(args)
            return
        try:  # a sweep's folder: run that sweep again; finished jobs are skipped
            sys.argv[1:] = args = sweeps.continue_args(
                target, [a for a in args if not a.startswith("resume=")]
            )
        except ConfigError as e:
            fail(e)
    sys.argv[1:] = args = run_dir_arg(args)
    check_args(args)
    if any(a in MULTIRUN_FLAGS for a in args):
        multirun(args)
        return
    main()


if __name__ == "__main__":
    cli()
