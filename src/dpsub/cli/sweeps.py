"""Hydra sweeps (``dpsub-train -m ...``) that survive a bad job and can be continued.

Before any job starts (:func:`check_jobs`, torch-free, called by ``dpsub.cli.train.cli``):
every job's config is composed and validated and its data files, W&B key and device
are checked (:func:`dpsub.config.check_environment`); each failing job is one line on stderr, no
job starts, exit code 2. Otherwise the plan of every job is printed and the sweep's
folder is fixed (``hydra.sweep.dir``), so it can be named in the messages.

While the sweep runs (:func:`run_job`, inside each job, any launcher): a job whose dir
already holds ``summary.json`` is skipped, one that began before resumes (from
``checkpoint.pt``, or from step 0 when it stopped before its first checkpoint, its ledger
kept; the saved config must match, as for ``resume=``), and a job that fails is logged in
one line and recorded in ``<sweep dir>/failed_jobs.jsonl`` while the other jobs go on.
At the end (:func:`report`) a failed job makes the command exit non-zero, naming the file.

Continuing a sweep: ``dpsub-train resume=<sweep dir>`` runs the sweep of that folder's
``multirun.yaml`` again with the same overrides and launcher (:func:`continue_args`);
finished jobs are skipped, interrupted ones resume, failed ones run again (resumed if
they had begun).
``scripts/reproduce.py`` runs its jobs through :func:`run_job` as well.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dpsub.errors import ConfigError, DataError, RunDirInUse, exit_code
from dpsub.rundir import SUMMARY, RunDir

FAILED = "failed_jobs.jsonl"
log = logging.getLogger("dpsub")


# ------------------------------------------------------------ before the sweep
def check_jobs(jobs: list[list[str]], hydra_overrides: list[str]) -> str | None:
    """Compose, validate and look for the data of every job (``key=value`` lists).

    Prints one line per failing job on stderr and exits 2; else prints the plan and
    returns the sweep folder (``hydra.sweep.dir`` resolved once, None if it cannot be).
    """
    from dpsub.config import check_environment, compose, config_context, validate

    errors, plans, sweep_dir = [], [], None
    swept = {
        o for o in {o for job in jobs for o in job} if sum(o in job for job in jobs) < len(jobs)
    }
    with config_context():
        for i, job in enumerate(jobs):
            where = f"sweep job {i} ({' '.join(o for o in job if o in swept) or 'defaults'})"
            try:
                cfg = compose(job)
                validate(cfg)
                check_environment(cfg)  # data files, W&B key, device: torch-free for cpu
            except (ConfigError, DataError) as e:
                errors.append(f"dpsub: {where}: {e}")
                continue
            plans.append(f"  job {i}: {plan_of(cfg)}")
        if not errors and jobs:
            sweep_dir = _sweep_dir(jobs[0], hydra_overrides)
    if errors:
        for line in errors:
            print(line, file=sys.stderr)
        print(
            f"dpsub: {len(errors)} of {len(jobs)} sweep jobs are invalid; no job was started",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)
    where = f" -> {sweep_dir}" if sweep_dir else ""
    print(f"sweep: {len(jobs)} jobs{where}", *plans, sep="\n", flush=True)
    return sweep_dir


def plan_of(cfg: DictConfig) -> str:
    from dpsub.cli.train import plan_line

    return plan_line(cfg).removeprefix("plan: ")


def _sweep_dir(job: list[str], hydra_overrides: list[str]) -> str | None:
    from dpsub.config import compose

    try:
        cfg = compose([*job, *hydra_overrides], return_hydra_config=True)
        return str(cfg.hydra.sweep.dir)
    except Exception:  # noqa: BLE001 -- an unusual sweep dir: Hydra resolves it itself
        return None


# ------------------------------------------------------------ inside each job
#: The keys job dir names left out before they left out every key a resume may change
#: (Hydra's ``exclude_keys`` then); only to find the job dirs of a sweep made before.
_EXCLUDED_BEFORE = (
    "resume",
    "logger",
    "logger.mode",
    "train.progress",
    "out_dir",
    "hydra/launcher",
)


def job_label(overrides: list[str], excluded=None) -> str:
    """A job's overrides as Hydra's ``override_dirname`` writes them (sorted, comma-joined),
    without the keys a resume may change: continuing a sweep with ``train.log_every=5``
    must find the same job dirs (``excluded(key)``: another rule, for old names)."""
    from dpsub.training.checkpoint import may_change

    excluded = excluded or may_change
    keys = [o.split("=", 1)[0].lstrip("+~").split("@", 1)[0] for o in overrides]
    return ",".join(sorted(o for o, k in zip(overrides, keys, strict=True) if not excluded(k)))


def job_subdir(sweep_dir: Path, num: int, overrides: list[str]) -> str:
    """``<job number>_<job_label>`` (the number alone without overrides); a job dir of the
    same job made before the label left out every key a resume may change is kept."""

    def name(label: str) -> str:
        return f"{num}_{label}" if label else str(num)

    new = name(job_label(overrides))
    old = name(job_label(overrides, lambda k: k in _EXCLUDED_BEFORE))
    return old if not (sweep_dir / new).exists() and (sweep_dir / old).is_dir() else new


def run_job(cfg: DictConfig, run_dir: Path, train_fn, name: str) -> float:
    """One sweep job: skip it if finished, resume it if checkpointed, record a failure.

    ``train_fn(cfg, run_dir, resume)`` trains and returns the evaluation accuracy.
    """
    run_dir = Path(run_dir)
    summary = run_dir / SUMMARY
    if summary.is_file():
        log.info("%s: finished earlier (%s), skipped", name, summary)
        values = json.loads(summary.read_text())
        return float(values.get("test_accuracy", values.get("validation_accuracy", math.nan)))
    try:
        return train_fn(cfg, run_dir, RunDir(run_dir).started)  # begun: resume it
    except RunDirInUse as e:  # two sweeps over one table: the holder trains it, not a failure
        log.warning("%s: skipped, %s", name, str(e).split(";")[0].split(": ", 1)[-1])
        return math.nan
    except Exception as e:  # noqa: BLE001 -- recorded; the sweep goes on with the others
        code = exit_code(e)
        msg = str(e) if code is not None else traceback.format_exc()
        log.error("%s failed: %s", name, msg.strip().splitlines()[-1] if code is None else msg)
        _record(
            _sweep_dir_of(run_dir),
            {"job": name, "dir": str(run_dir), "exit": code or 1, "error": msg},
        )
        return math.nan


def _sweep_dir_of(run_dir: Path) -> Path:
    """The running Hydra sweep's folder (a job dir may lie elsewhere: reproduce.py)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().sweep.dir) if HydraConfig.initialized() else run_dir.parent


def _record(sweep_dir: Path, entry: dict) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with (sweep_dir / FAILED).open("a") as f:  # one short append per job: safe across workers
        f.write(json.dumps(entry) + "\n")


# ------------------------------------------------------------- after the sweep
def report(sweep_dir: str | None) -> None:
    """Exit non-zero (the failed jobs' worst code) if any job of this sweep failed."""
    path = Path(sweep_dir) / FAILED if sweep_dir else None
    if path is None or not path.is_file():
        return
    failed = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not failed:
        return
    print(
        f"dpsub: sweep: {len(failed)} job(s) failed ({', '.join(f['job'] for f in failed)}; "
        f"errors in {path}); the others ran; continue the sweep (finished jobs are skipped) with dpsub-train resume={sweep_dir}",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(max(int(f["exit"]) for f in failed))


def start(sweep_dir: str | None) -> None:
    """A new attempt at a sweep: forget the previous attempt's failures."""
    if sweep_dir:
        (Path(sweep_dir) / FAILED).unlink(missing_ok=True)


# --------------------------------------------------------------- continuing
def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / "multirun.yaml").is_file()


def continue_args(sweep_dir: Path, extra: list[str]) -> list[str]:
    """The command line of the sweep in ``sweep_dir`` (its ``multirun.yaml``), to run again."""
    saved = OmegaConf.load(Path(sweep_dir) / "multirun.yaml")
    task = list(saved.hydra.overrides.task)
    hydra_ov = [
        o
        for o in saved.hydra.overrides.hydra
        if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))
    ]
    from dpsub.overrides import quote_value
    from dpsub.training.checkpoint import may_change

    bad = [a for a in extra if "=" not in a or not may_change(a.lstrip("+~").split("=")[0])]
    if bad:
        raise ConfigError(
            f"resume: a sweep continues with its own overrides ({' '.join(task)}); only "
            f"logging, evaluation and checkpoint settings may be added, got {bad}"
        )
    swept = [a for a in extra if _is_sweep(a)]
    if swept:  # more jobs would renumber the sweep: job n would find another job's dir
        raise ConfigError(
            f"resume: a sweep continues with its own jobs; an added setting takes one value, "
            f"got {swept}"
        )
    keys = {a.split("=")[0] for a in extra}
    task = [o for o in task if o.split("=")[0] not in keys]  # the new value, once
    return ["-m", *task, *hydra_ov, *extra, f"hydra.sweep.dir={quote_value(str(sweep_dir))}"]


def _is_sweep(override: str) -> bool:
    """Does ``key=value`` sweep over several values (``a,b``, ``range(...)``, ...)?"""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(override).is_sweep_override()
    except Exception:  # noqa: BLE001 -- a syntax error: Hydra reports it when the sweep runs
        return False
