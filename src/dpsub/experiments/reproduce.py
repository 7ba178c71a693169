"""Run a paper table's grid (``conf/paper/<table>.yaml``) as one Hydra multirun.

    python scripts/reproduce.py gep1-mnist                       # the paper setting, every seed
    python scripts/reproduce.py gep1-mnist --setting cpu --tune  # + tuning, + the tuned picks
    python scripts/reproduce.py gep1-mnist --dry-run             # the grid and its cost
    python scripts/reproduce.py gep1-cifar10 hydra/launcher=slurm data.root=/data

Every job is a cell x seed of the table (docs/tables.md). Its run dir is
``<out>/<table>/<setting>/<variant>/<cell>,seed=<s>``; a job whose dir holds summary.json
is skipped, one that began but has no summary is resumed, and a job whose config equals
that of a finished run anywhere under ``<out>`` reuses it (a symlink). The pending jobs
run as one Hydra multirun, so any launcher works (``hydra/launcher=local`` runs two at a
time on this machine, ``slurm`` submits them); ``hydra.*`` overrides go to Hydra, the
others to every job. Overrides that change a run (``train.epochs=3``) name the results
folder (``cpu+train.epochs=3``), so reduced runs never mix with full ones.

``--tune`` also runs the table's tuning grid (lr x clip thresholds, the same for every
mechanism) on ``tune.validation_size`` examples held out of the private training set,
picks the best point per cell by validation accuracy (``tune/picks.json``) and runs the
picks on the test set with every seed (variant ``tuned``). The tuning runs' privacy cost
is not counted (as in the papers). ``--private-tune --select-mean M --select-sigma S``
tunes instead with the choice counted: one ``dpsub-select`` search per cell and seed over
the same grid, its kept model's test accuracy the row, its epsilon the search's
(variant ``private``, :mod:`dpsub.experiments.private_tables`).

``--dry-run`` prints every job with its status, N, steps and estimated time, where the runs
go, and a one-line reason for every cost it cannot give (no step time; missing data of a
dataset without a published size), in seconds (:mod:`dpsub.experiments.costs`): step times come from
an earlier ``--time`` on this machine (cached in ``<out>/.step_times.json``) or from the
steps_per_s that finished runs of the same setting recorded (under ``<out>`` and
``results/tables``). ``--dry-run --time`` measures the missing
ones: a couple of steps of each distinct setting (dataset shape, model, mechanism, batch,
anchors) with the trainer's own ``build_run``/``train_step`` on synthetic data of the same
shape (CPU time of one core). The GPU column is the CPU time divided by ``--gpu-speedup``
(an assumption: the lent GPUs measured ~56x for a GP step and ~200x for GEP's, docs/gpu.md,
but a card's speed-up depends on the model and the mechanism). Step times
committed in ``results/tables/step_times.json`` fill in where this machine has none.

A finished run anywhere under ``<out>`` or among the runs committed in ``results/``
whose config equals a job's is reused (a symlink), so ``make table`` on a fresh clone
re-renders the committed tables instead of re-running them.

``--stop-at HH:MM`` (or ``+2h30m``) ends a work period cleanly: at that time the running
job finishes its step, writes its checkpoint and the command exits (code 143, as after a
SIGTERM; 1 when it falls between jobs); no job starts after it. The same command, run
again, resumes the job from its checkpoint and goes on. It needs the default launcher
(jobs in this process).

A bad table, setting or override is one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import re
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dpsub import rundir as runs
from dpsub.errors import ConfigError
from dpsub.experiments import costs, private_tables, tables
from dpsub.experiments.commands import how_to_run
from dpsub.overrides import quote_value
from dpsub.paths import conf_dir, project_root

log = logging.getLogger("dpsub.reproduce")
COMMITTED = (
    project_root() / "results"
)  # the runs committed with the repository (reused, never re-run)


def say(msg: str) -> None:
    print(msg, flush=True)


def die(msg: str) -> None:
    print(f"reproduce: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# ------------------------------------------------------------- overrides
def split_overrides(items: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(hydra, changing, passthrough): Hydra's own; those that change a run (they name the
    results folder); those that cannot (data location, logging, evaluation frequency)."""
    from dpsub.training.checkpoint import may_change

    hydra_ov, extra, passthrough = [], [], []
    for item in items:
        key = item.lstrip("+~").split("=", 1)[0]
        if "=" not in item:
            die(f"override {item!r}: expected KEY=VALUE")
        if key.startswith(("hydra.", "hydra/")):
            hydra_ov.append(item)
        elif may_change(key):
            passthrough.append(item)
        else:
            extra.append(item)
    return hydra_ov, extra, passthrough


# ----------------------------------------------------------------- plan
def plan(args, table: tables.Table) -> tuple[list[tables.Job], list[tables.Job], dict]:
    """(jobs of phase 1, jobs of phase 2 (tuned), picks). Phase 1: the paper variant, and
    with --tune the tuning grid; phase 2: the tuned picks (known once tuning finished)."""
    kw = dict(extra=args.extra, passthrough=args.passthrough)
    jobs = [] if args.skip_paper else tables.plan_jobs(table, args.setting, args.out, "paper", **kw)
    tuned, picks = [], {}
    if args.tune:
        tune_jobs = tables.plan_jobs(table, args.setting, args.out, "tune", **kw)
        jobs += tune_jobs
        picks = tables.pick_best(table, tune_jobs)
        tuned = tables.plan_jobs(
            table, args.setting, args.out, "tuned",
            picks={c: p["overrides"] for c, p in picks.items()}, **kw,
        )  # fmt: skip
    return only(args, jobs), only(args, tuned), picks


def only(args, jobs: list[tables.Job]) -> list[tables.Job]:
    """The jobs that ``--only KEY=V[,V...]`` keeps."""
    keep = lambda j: all(  # noqa: E731
        str({**j.cell, "seed": j.seed}.get(k)) in v.split(",") for k, v in args.only
    )
    return [j for j in jobs if keep(j)]


def compose_all(jobs: list[tables.Job]) -> dict[Path, DictConfig]:
    """Every job's config, composed and validated (ConfigError names the job)."""
    from dpsub.config import compose, validate

    out = {}
    for job in jobs:
        try:
            cfg = compose(job.hydra_overrides())
            validate(cfg)
        except ConfigError as e:
            raise ConfigError(f"{e} (job {job.variant}/{job.name})") from None
        except Exception as e:  # noqa: BLE001 -- Hydra's own errors: one line
            msg = str(e).splitlines()[0]
            raise ConfigError(f"job {job.variant}/{job.name}: {msg}") from None
        out[job.dir] = cfg
    return out


def finished_runs(*roots: Path) -> list[tuple[Path, dict]]:
    """(run dir, its saved config made portable and flattened) of every finished run under
    ``roots`` (each once; not through symlinks): what a new job may reuse."""
    from dpsub.training.checkpoint import flatten_config

    found = {
        r.path.resolve(): r for root in roots for r in runs.find_runs(root, follow_links=False)
    }
    return [(r.path, flatten_config(portable(r.config_dict()))) for r in found.values()]


def portable(cfg: dict) -> dict:
    """``cfg`` with paths under its data.root written relative to it: the same data on two
    machines (a committed run's aux.path) is the same setting."""
    root = str((cfg.get("data") or {}).get("root") or "")
    aux = dict(cfg.get("aux") or {})
    if root and str(aux.get("path", "")).startswith(root.rstrip("/") + "/"):
        aux["path"] = "${data.root}" + str(aux["path"])[len(root.rstrip("/")) :]
    return {**cfg, "aux": aux}


#: keys every resolved config holds and a reused run must share (a resume may change none)
_REUSE_KEYS = ("seed", "mechanism.name", "privacy.epsilon", "model.name")


def status(job: tables.Job, cfg: DictConfig, done: list[tuple[Path, dict]]) -> str:
    """done | stale:<keys> | reuse:<dir> | resume | todo. A finished run whose config is no
    longer the job's (a tuned pick that moved when its grid was extended, an edited table) is
    ``stale``: it is set aside and run again, never counted as the job's."""
    from dpsub.training.checkpoint import changed_flat_keys, changed_keys, flatten_config

    new = portable(OmegaConf.to_container(cfg, resolve=True))
    if job.finished:
        keys = changed_keys(portable(runs.RunDir(job.dir).config_dict()), new)
        return "stale:" + ",".join(keys) if keys else "done"
    if runs.RunDir(job.dir).started:  # a checkpoint, or stopped before one: from step 0
        return "resume"
    if not job.dir.exists():
        flat = flatten_config(new)
        same = [flat.get(k) for k in _REUSE_KEYS]  # a quick filter before the full comparison
        for d, saved in done:
            if [saved.get(k) for k in _REUSE_KEYS] != same or d == job.dir:
                continue
            if not changed_flat_keys(saved, flat):
                return f"reuse:{d}"
    return "todo"


# --------------------------------------------------------------- output
def steps_logged(job: tables.Job) -> int:
    """The last step a run in progress logged (its metrics.jsonl; 0 without one)."""
    try:
        return max((int(m.get("step", 0)) for m in runs.RunDir(job.dir).metrics()), default=0)
    except (OSError, ValueError, runs.RunError):  # no metrics.jsonl yet, a torn last line
        return 0


def left_fraction(job: tables.Job, steps) -> float:
    """The share of a resumed run's steps still to run (its logged steps are done, up to
    the checkpoint's at most ``train.log_every`` steps before)."""
    return 1.0 if not steps else max(0.0, 1.0 - steps_logged(job) / int(steps))


def print_grid(rows, states, gpu_factor: float) -> None:
    say("| variant | job | status | N | steps | s/step | est. CPU | est. GPU |")
    say("|---|---|---|---:|---:|---:|---:|---:|")
    todo_s, reasons = 0.0, {}
    for r in rows:
        j, st = r["job"], states[r["job"].dir]
        pending = st in ("todo", "resume", "after tuning") or st.startswith("stale:")
        left = r["sec"] * left_fraction(j, r["steps"]) if st == "resume" else r["sec"]
        todo_s += left if pending and math.isfinite(left) else 0.0
        st = f"resume@{steps_logged(j)}" if st == "resume" else st
        st = f"stale ({st[6:]})" if st.startswith("stale:") else st.split(":")[0]
        note = ""
        if r["why"]:
            note = f" [{reasons.setdefault(r['why'], len(reasons) + 1)}]"
        step = f"{r['step_s']:.2f}" if math.isfinite(r["step_s"]) else "?"
        n = r["n"] if isinstance(r["n"], int) else "?"
        say(
            f"| {j.variant} | {j.name} | {st} | {n} | {r['steps'] or '?'} "
            f"| {step} | {costs.hms(r['sec'])}{note} |" + f" {costs.hms(r['sec'] * gpu_factor)} |"
        )
    for why, i in reasons.items():
        say(f"[{i}] {why}")
    total = sum(r["sec"] for r in rows if math.isfinite(r["sec"]))
    unknown = sum(not math.isfinite(r["sec"]) for r in rows)
    say(
        f"\n{len(rows)} jobs; all: {costs.hms(total)} CPU"
        + f" ({costs.hms(total * gpu_factor)} GPU, estimate)"
        + f"; still to run: {costs.hms(todo_s)} CPU"
        + f" ({costs.hms(todo_s * gpu_factor)} GPU, estimate)"
        + (f"; {unknown} jobs of unknown cost not counted" if unknown else "")
    )


def dry_run(args, table, jobs, tuned) -> None:
    waiting = []
    if args.tune:  # cells still tuning: their picks' cost, the paper hyper-parameters standing in
        every = tables.plan_jobs(
            table, args.setting, args.out, "tuned", extra=args.extra,
            passthrough=args.passthrough, picks={tables.cell_id(c): [] for c in table.cells(args.setting)},
        )  # fmt: skip
        picked = {j.dir for j in tuned}
        waiting = [j for j in only(args, every) if j.dir not in picked]
    all_jobs = jobs + tuned + waiting
    cfgs = compose_all(all_jobs)
    done = finished_runs(args.out, COMMITTED)
    states = {j.dir: status(j, cfgs[j.dir], done) for j in jobs + tuned}
    states.update({j.dir: "after tuning" for j in waiting})
    setting = table.setting(args.setting)
    say(f"# {table.title}: setting {args.setting} ({setting.note})")
    if args.extra:
        say(f"# overrides changing the runs: {' '.join(args.extra)}")
    say(f"# runs go to {tables.setting_dir(args.out, table, args.setting, args.extra)}/<variant>/<job>; "
        f"render with: {how_to_run('make_table.py')} {table.name} --setting {args.setting} "
        f"{' '.join(args.extra)}".rstrip())  # fmt: skip
    rows, where = costs.estimate(
        all_jobs,
        cfgs,
        args.out,
        [args.out, COMMITTED],
        args.timing_steps if args.time else None,
        say,
    )
    if args.time:
        say(f"# step times measured on {where} (load average {os.getloadavg()[0]:.1f})")
    else:
        say(f"# step times: measured (--time) on {where}, else (or where over 1.25x slower) "
            "recorded by runs of the same setting, running ones too; --time measures the "
            "missing ones")  # fmt: skip
    factor = 1 / args.gpu_speedup
    say(f"# GPU column: an estimate = the one-core CPU time / {args.gpu_speedup:g} (--gpu-speedup, "
        "a conservative assumption; the one H100 session so far measured ~56x for a GP step at "
        "batch 1000 and ~200x for GEP's refit from 2,000 anchors: docs/gpu.md)")  # fmt: skip
    say("")
    print_grid(rows, states, factor)


# --------------------------------------------------------------- launch
def set_aside_stale(jobs, states, base: Path) -> None:
    """Set each stale run aside (:func:`tables.set_aside`): the job runs again."""
    for j in jobs:
        st = states[j.dir]
        if st.startswith("stale:"):
            dest = tables.set_aside(j.dir, base, j.variant)
            say(f"stale {j.variant}/{j.name} (changed: {st[6:]}) -> {dest}; running it again")
            states[j.dir] = "todo"


def link_reused(jobs, states) -> None:
    for j in jobs:
        st = states[j.dir]
        if st.startswith("reuse:"):
            target = Path(st.split(":", 1)[1])
            j.dir.parent.mkdir(parents=True, exist_ok=True)
            j.dir.symlink_to(os.path.relpath(target, j.dir.parent))
            say(f"reuse {j.variant}/{j.name} -> {target}")


def launch(jobs: list[tables.Job], sweep_dir: Path, hydra_ov: list[str], fit=None) -> None:
    """One Hydra multirun over ``jobs`` (the task below runs job number ``reproduce.index``;
    ``fit``: a job's estimated seconds, checked against ``--stop-at`` when it would start)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    spec = [{"dir": str(j.dir), "overrides": j.hydra_overrides(), "fit_s": (fit or {}).get(j.dir)}
            for j in jobs]  # fmt: skip
    (sweep_dir / "jobs.json").write_text(json.dumps(spec, indent=1))
    index = ",".join(str(i) for i in range(len(jobs)))
    sys.argv = [
        sys.argv[0], "-m", f"hydra.sweep.dir={quote_value(str(sweep_dir))}",
        f"+reproduce.jobs={quote_value(str(sweep_dir / 'jobs.json'))}",
        f"+reproduce.index={index}", *hydra_ov,
    ]  # fmt: skip
    hydra_main()


# ------------------------------------------------------------- --stop-at
class Deadline:
    """``--stop-at``: a SIGTERM at the deadline. The training loop's own handler takes it
    during a job (checkpoint, then exit); between jobs :meth:`handle` records it and the
    next job does not start (nothing is cut mid-write)."""

    reached = False
    text = ""
    at = math.inf  # the deadline (time.time()); inf: none armed

    @classmethod
    def handle(cls, signum, frame) -> None:
        cls.reached = True

    @classmethod
    def arm(cls, seconds: float, text: str) -> threading.Timer | None:
        """Handle SIGTERM from now on; the timer that sends it (None: already reached)."""
        cls.text, cls.at = text, time.time() + seconds
        signal.signal(signal.SIGTERM, cls.handle)
        if seconds <= 0:
            cls.reached = True
            return None
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
        return timer

    @classmethod
    def check(cls) -> None:
        if cls.reached:
            raise SystemExit(f"reproduce: stopped at --stop-at {cls.text}, before the next job; "
                             "the same command resumes")  # fmt: skip

    @classmethod
    def fits(cls, seconds: float | None) -> bool:
        """A job estimated at ``seconds`` ends before the deadline (unknown: it may start)."""
        return seconds is None or not math.isfinite(seconds) or time.time() + seconds <= cls.at


def check_fit_margin(margin: float) -> float:
    """``--fit-margin``: a positive factor (ConfigError otherwise)."""
    if not margin > 0:
        raise ConfigError(f"--fit-margin {margin}: must be positive")
    return margin


def seconds_until(text: str, now: dt.datetime | None = None) -> float:
    """``HH:MM`` (the next such local time) or ``+2h30m`` / ``+90s`` -> seconds from now."""
    now = now or dt.datetime.now()
    m = re.fullmatch(r"\+(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if m and any(m.groups()):
        h, mi, s = (int(g or 0) for g in m.groups())
        return float(h * 3600 + mi * 60 + s)
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text)
    if not m or int(m[1]) > 23 or int(m[2]) > 59:
        raise ConfigError(f"--stop-at {text!r}: expected HH:MM or +2h30m / +45m / +90s")
    at = now.replace(hour=int(m[1]), minute=int(m[2]), second=0, microsecond=0)
    if at <= now:
        at += dt.timedelta(days=1)
    return (at - now).total_seconds()


def _task(cfg: DictConfig) -> float:
    """One job: compose its config, then train, resume or skip it (dpsub.cli.sweeps.run_job:
    a failure is logged and recorded in the sweep folder; the other jobs go on)."""
    Deadline.check()
    from dpsub.cli.sweeps import run_job
    from dpsub.cli.train import train_run
    from dpsub.config import compose

    job = json.loads(Path(cfg.reproduce.jobs).read_text())[int(cfg.reproduce.index)]
    if not Deadline.fits(job.get("fit_s")):
        log.info("job %s: not started, its estimated %s would end after --stop-at %s (--fit)",
                 job["dir"], costs.hms(job["fit_s"]), Deadline.text)  # fmt: skip
        return math.nan
    jcfg = compose(job["overrides"])  # validated by compose_all (Hydra: hydra_main's)
    return run_job(jcfg, Path(job["dir"]), train_run, f"job {job['dir']}")


def hydra_main() -> None:
    import hydra

    import dpsub.config  # noqa: F401 -- declares the options' defaults before Hydra composes

    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")(_task)()


def run_phase(jobs, args, hydra_ov, label: str) -> None:
    cfgs = compose_all(jobs)
    done = finished_runs(args.out, COMMITTED)
    states = {j.dir: status(j, cfgs[j.dir], done) for j in jobs}
    base = tables.setting_dir(args.out, args.table_obj, args.setting, args.extra)
    set_aside_stale(jobs, states, base)
    link_reused(jobs, states)
    pending = [j for j in jobs if states[j.dir] in ("todo", "resume")]
    say(f"{label}: {len(jobs)} jobs, {len(jobs) - len(pending)} finished or reused, "
        f"{len(pending)} to run")  # fmt: skip
    if pending:
        fit = fit_seconds(pending, cfgs, args) if args.fit else {}
        launch(pending, new_sweep_dir(base), hydra_ov, fit)


def new_sweep_dir(base: Path) -> Path:
    """``<setting>/.sweeps/<time>_<suffix>``, made here and unique: two lanes that launch in
    the same second must not write one ``jobs.json`` (each would then run the other's jobs)."""
    import tempfile

    (base / ".sweeps").mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}_", dir=base / ".sweeps"))


def fit_seconds(jobs: list[tables.Job], cfgs: dict, args) -> dict[Path, float]:
    """``--fit``: each job's estimated wall time left (its recorded step times, a resumed
    run's remaining steps, times ``--fit-margin``); NaN where no step time is known.
    ``cfgs``: the jobs' composed configs (run_phase's)."""
    rows, _ = costs.estimate(jobs, cfgs, args.out, [args.out, COMMITTED], None,
                             lambda msg: None)  # fmt: skip
    return {
        r["job"].dir: r["sec"] * left_fraction(r["job"], r["steps"]) * args.fit_margin for r in rows
    }


def run_tuning(jobs, args, table, hydra_ov) -> None:
    """Phase 1, then the jobs a tuning grid extended at an edge (``tune.extend``) adds once
    its first points finish, round after round, all before any pick trains (a pick trained
    before its grid was extended is wasted when the extension moves it). A job is launched
    once per command: one that fails is not retried here."""
    run_phase(
        jobs, args, hydra_ov, "phase 1 (paper setting" + (" + tuning grid)" if args.tune else ")")
    )
    seen = {j.dir for j in jobs}
    while args.tune:
        new = [j for j in plan(args, table)[0] if not j.finished and j.dir not in seen]
        if not new:
            return
        seen |= {j.dir for j in new}
        run_phase(new, args, hydra_ov, "phase 1 (the tuning grid extended at an edge)")


def run_all(jobs, args, table, hydra_ov) -> None:
    """The paper setting and the tuning grid, then (``--tune``) the picks."""
    run_tuning(jobs, args, table, hydra_ov)
    if args.tune:
        _, tuned, picks = plan(args, table)
        write_picks(args, picks)
        run_phase(tuned, args, hydra_ov, "phase 2 (tuned picks)")


def write_picks(args, picks: dict) -> None:
    base = tables.setting_dir(args.out, args.table_obj, args.setting, args.extra)
    (base / "tune").mkdir(parents=True, exist_ok=True)
    (base / "tune" / "picks.json").write_text(json.dumps(picks, indent=1))


# ------------------------------------------------------------------ CLI
def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("table", help=f"one of: {', '.join(tables.table_names())}")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every job (hydra.*: Hydra's)")
    p.add_argument("--setting", default="paper", help="a setting of the table (default: paper)")
    p.add_argument(
        "--out", type=Path, default=project_root() / "outputs" / "tables", help="results root"
    )
    p.add_argument("--tune", action="store_true", help="also tune lr x clip, then run the picks")
    p.add_argument("--private-tune", action="store_true",
                   help="instead of --tune: one dpsub-select search per cell and seed over the "
                        "tuning grid, the choice counted in its epsilon (--select-*)")  # fmt: skip
    p.add_argument("--select-mean", type=float, default=None,
                   help="with --private-tune: the mean number of runs of a search")  # fmt: skip
    p.add_argument("--select-sigma", type=float, default=None,
                   help="with --private-tune: the std of the noise on a run's count of correct "
                        "held-out examples")  # fmt: skip
    p.add_argument("--select-shape", type=float, default=1.0,
                   help="with --private-tune: the law of K (inf Poisson, 1 geometric: default)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the grid and its cost only")
    p.add_argument("--skip-paper", action="store_true",
                   help="with --tune or --private-tune: only the tuning (not the runs at the "
                        "paper's hyper-parameters)")  # fmt: skip
    p.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE",
                   help="only the cells with this axis (or seed) value, or one of the values "
                        "A,B,... (repeatable: all must hold)")  # fmt: skip
    p.add_argument("--time", action="store_true",
                   help="with --dry-run: time the step of every setting without a cached time "
                        "(minutes); otherwise cached or recorded step times only (seconds)")  # fmt: skip
    p.add_argument("--timing-steps", type=int, default=2, help="timed steps per setting")
    p.add_argument("--stop-at", metavar="HH:MM", default=None,
                   help="at this local time (or after +2h30m / +45m / +90s) the running job "
                        "checkpoints and the command exits; the same command resumes "
                        "(default launcher only)")  # fmt: skip
    p.add_argument("--fit", action="store_true",
                   help="with --stop-at: start a job only if its estimated time (recorded step "
                        "times) ends before the deadline; the others wait for the next period "
                        "(for machines that do not keep a checkpoint from one period to the "
                        "next); a job of unknown cost starts")  # fmt: skip
    p.add_argument(
        "--fit-margin",
        type=float,
        default=1.05,
        help="with --fit: the estimate is multiplied by this (default 1.05: the recorded "
        "times are CPU seconds of runs made beside another lane)",
    )
    p.add_argument("--gpu-speedup", type=float, default=30.0,
                   help="assumed speed of a GPU over one core of the CPU the step times are "
                        "for, for the GPU estimate (default 30)")  # fmt: skip
    args = p.parse_intermixed_args(argv)
    args.only = [tuple(o.split("=", 1)) for o in args.only]
    if any(len(o) != 2 for o in args.only):
        die("--only: expected AXIS=VALUE")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    hydra_ov, args.extra, args.passthrough = split_overrides(args.overrides)
    try:
        table = args.table_obj = tables.load_table(args.table)
        table.setting(args.setting)
        check_fit_margin(args.fit_margin)
        jobs, tuned, picks = plan(args, table)
        searches, law = private_plan(args, table)
        if args.dry_run:
            dry_run(args, table, jobs, tuned)
            private_dry_run(searches, law, search_seconds(args, table, searches, law))
            return 0
        fits = search_fit(args, table, searches, law)
        compose_all(jobs + tuned)  # every config valid before anything is written
        stop = None if args.stop_at is None else seconds_until(args.stop_at)
        if args.fit and stop is None:
            raise ConfigError("--fit: needs --stop-at (the deadline a job must end before)")
        if stop is not None and any(o.startswith("hydra/launcher=") for o in hydra_ov):
            raise ConfigError("--stop-at: needs the default launcher (jobs in this process)")
    except ConfigError as e:
        die(str(e))
    if stop is not None:
        Deadline.arm(stop, args.stop_at)
        say(f"stopping at {args.stop_at} ({stop / 60:.0f} minutes from now)")
    try:
        run_all(jobs, args, table, hydra_ov)
        private_tables.run_searches(searches, law, lambda: Deadline.reached, say, fits)
    except SystemExit:
        if Deadline.reached:  # the running job checkpointed (code 143) or none was running
            say(f"stopped at --stop-at {args.stop_at}; the same command resumes")
        raise
    unfinished = [j for j in plan(args, table)[0] if not j.finished] + [
        s for s in searches if private_tables.status(s, law) != "done"
    ]
    if unfinished:
        say(f"{len(unfinished)} jobs unfinished, e.g. {unfinished[0].dir}")
        return 1
    return 0


def private_plan(args, table) -> tuple[list, private_tables.Law | None]:
    """``--private-tune``: the searches (``--only`` applies) and their law (ConfigError for
    a missing or contradictory flag)."""
    if not args.private_tune:
        return [], None
    if args.tune:
        raise ConfigError("--private-tune: tunes instead of --tune; give one of them")
    if args.select_mean is None or args.select_sigma is None:
        raise ConfigError("--private-tune: needs --select-mean and --select-sigma")
    searches = private_tables.plan_searches(
        table, args.setting, args.out, args.extra, args.passthrough
    )
    law = private_tables.Law(args.select_mean, args.select_sigma, args.select_shape)
    return only(args, searches), private_tables.check_law(law)


def search_seconds(args, table, searches: list, law) -> dict[Path, float]:
    """Each search's expected time: the mean number of runs x the mean estimated time of its
    cell's grid points (recorded step times, as the dry run's); NaN where none is known."""
    if not searches:
        return {}
    cells = {tables.cell_id(s.cell) for s in searches}
    grid = [j for j in tables.plan_jobs(table, args.setting, args.out, "tune", extra=args.extra,
                                        passthrough=args.passthrough)
            if tables.cell_id(j.cell) in cells]  # fmt: skip
    rows, _ = costs.estimate(grid, compose_all(grid), args.out, [args.out, COMMITTED], None,
                             lambda msg: None)  # fmt: skip
    by_cell: dict[str, list[float]] = {}
    for r in rows:
        if math.isfinite(r["sec"]):
            by_cell.setdefault(tables.cell_id(r["job"].cell), []).append(r["sec"])
    return {s.dir: law.mean * statistics.fmean(by_cell[tables.cell_id(s.cell)])
            if tables.cell_id(s.cell) in by_cell else math.nan for s in searches}  # fmt: skip


def search_fit(args, table, searches: list, law):
    """``--fit``: whether a search is expected to end before ``--stop-at`` (it cannot be
    stopped part way without being paid again); without ``--fit`` every search may start."""
    if not args.fit or not searches:
        return lambda s: True
    sec = search_seconds(args, table, searches, law)
    return lambda s: Deadline.fits(sec[s.dir] * args.fit_margin)


def private_dry_run(searches: list, law, seconds: dict[Path, float]) -> None:
    if not searches:
        return
    say("\n| variant | search | status | expected CPU |\n|---|---|---|---:|")
    left = 0.0
    for s in searches:
        st = private_tables.status(s, law)
        sec = seconds.get(s.dir, math.nan)
        left += sec if st != "done" and math.isfinite(sec) else 0.0
        st = f"stale ({st[6:]})" if st.startswith("stale:") else st
        say(f"| {private_tables.VARIANT} | {s.name} | {st} | {costs.hms(sec)} |")
    say(f"\n{len(searches)} searches (expected times: the mean number of runs x a grid point's "
        f"recorded time; unknown ones not counted); still to run: {costs.hms(left)} CPU")  # fmt: skip


def cli() -> None:
    """The console command (pyproject.toml's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
