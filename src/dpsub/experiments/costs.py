"""What a table's jobs cost: N, steps and seconds a step (``reproduce.py --dry-run``).

A step's cost depends on its :func:`timing_key` (image shape, model, mechanism without its
clip thresholds, batch, gradient engine, device, anchors), not on lr, epsilon or seed. Step
times come, in this order, from an earlier ``--time`` on this machine (``<out>/.step_times.json``,
machine -> timing key -> seconds), from those committed with the repository
(``results/tables/step_times.json``), or from finished runs of the same setting (their CPU
seconds a step, else the pace of their train.log without its pauses, else steps_per_s);
where those runs took over 1.25x a ``--time`` figure, theirs (:func:`step_time`).
:func:`time_step` measures one with the trainer's own ``build_run`` / ``train_step`` on
synthetic data of the same shape. N is the private training set after
the auxiliary and validation carve-outs; where the data is absent, the official release's
size stands in (:func:`dpsub.data.registry.published_train_size`).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from dpsub import rundir as runs
from dpsub.data.registry import published_train_size
from dpsub.errors import DataError
from dpsub.paths import committed_step_times, wheel_install

COMMITTED_TIMES = committed_step_times()
NO_TIME = "no step time cached or recorded for this setting (--time measures it)"
NO_TIME_WHEEL = (
    "no step time for this setting: none measured here, and an installed dpsub has only the "
    "repository's committed step times, not its finished runs (--time measures it: a few steps)"
)


def dataset_shape(cfg: DictConfig | dict) -> tuple[int, int]:
    """(channels, size) of the configured dataset's images."""
    d = cfg["dataset"]
    if d["name"] == "synthetic":
        return int(d["synthetic"]["channels"]), int(d["synthetic"]["size"])
    if d["name"] == "digits":
        return 1, int(d.get("image_size") or 28)
    return (1, 28) if d["name"] in ("mnist", "fashion_mnist") else (3, 32)


def timing_key(cfg: DictConfig | dict) -> str:
    """What a step's cost depends on (not lr, epsilon, seed, clip thresholds); ``cfg``: a
    composed config or a saved one's plain dict. K > 1 views (train.augmult) multiply a
    step's passes, so they are part of it (K = 1 leaves the key as it was before the option)."""
    c = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else cfg
    mech = {k: v for k, v in c["mechanism"].items() if "clip" not in k}
    views = int(c["train"].get("augmult") or 1)
    return json.dumps(
        {
            "shape": dataset_shape(c), "model": c["model"], "mechanism": mech,
            "batch": c["train"]["batch_size"], "grads": c["grads"], "device": c["device"],
            "aux": c["aux"]["name"] != "none" and int(c["aux"]["num_samples"]),
            **({"augmult": views} if views > 1 else {}),
        },
        sort_keys=True,
    )  # fmt: skip


def time_step(cfg: DictConfig, steps: int, warmup: int) -> float:
    """Seconds of the trainer's step for ``cfg``'s setting, on synthetic data of the same
    shape (a fixed full batch of B examples; noise multiplier fixed, no calibration): the
    median over ``steps`` steps, or, for a subspace refitted every s > 1 steps, the mean over
    max(steps, s) steps (one refit amortized). On a CPU, the process's CPU time (a step's
    cost on an idle core, whatever else the machine runs); on a GPU, the synchronized wall
    time."""
    import torch

    from dpsub.training.build import build_run, train_step

    cfg = cfg.copy()
    c, s = dataset_shape(cfg)
    b = int(cfg.train.batch_size)
    with open_dict(cfg):
        cfg.dataset = {"name": "synthetic", "validation_size": None, "synthetic": {
            "n_train": b, "n_test": 8, "channels": c, "size": s, "num_classes": 10, "seed": 0}}  # fmt: skip
        if cfg.aux.name != "none":
            m = int(cfg.aux.num_samples)
            cfg.aux = {"name": "gaussian", "num_samples": m, "labels": "random_once", "seed": None}
        cfg.privacy.noise_multiplier, cfg.privacy.epsilon = 1.0, 1e12
        cfg.privacy.simulate = {}  # (a simulated noise level costs the same step)
        cfg.train.epochs, cfg.train.max_steps = 100000, None
    run = build_run(cfg)
    idx = torch.arange(b, device=run.device)
    every = int(cfg.mechanism.get("subspace_every") or 1)
    clock = time.perf_counter if run.device.type == "cuda" else time.process_time
    times = []
    for i in range(warmup + max(steps, every)):
        t0 = clock()
        train_step(run, idx=idx)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        if i >= warmup:
            times.append(clock() - t0)
    return statistics.fmean(times) if every > 1 else statistics.median(times)


def machine() -> str:
    """The CPU (or GPU) name and torch's thread count: what a step time is valid for."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}"
    return f"{runs.cpu_name()} x{torch.get_num_threads()} threads"


def train_size(cfg: DictConfig) -> tuple[int | None, str]:
    """(N, note): the private training set of ``cfg`` after the aux and validation
    carve-outs. Without the data, N from the release's published size and a note that says
    so, else (None, the one-line reason)."""
    from dpsub.config import validate
    from dpsub.training.build import load_images, private_data

    try:
        s = validate(cfg)  # what build_run trains on, without extracting any features (N
        _, data = private_data(s, data=load_images(s))  # does not depend on them)
        return int(data.train_y.shape[0]), ""
    except DataError as e:
        c = OmegaConf.to_container(cfg, resolve=True)
        n = published_train_size(c["dataset"], c["aux"])
        if n is None:
            return None, str(e).splitlines()[0]
        return n, (f"{cfg.dataset.name} not found under data.root: N from its published "
                   f"size ({n} after carve-outs); point data.root at it for the exact N")  # fmt: skip


def recorded_step_times(roots: list[Path], want: set[str]) -> dict[str, float]:
    """timing key (of ``want``) -> seconds per step measured by CPU runs under ``roots``
    (a finished run's summary.json's cpu_seconds per step, which a paused or core-starved
    run does not inflate; else the pace of its train.log's step lines without the paused
    windows (:func:`log_rate`), which is all a run still in progress offers; else its
    run-average steps_per_s, or older runs' per-window ones in metrics.jsonl; median over
    runs). A GPU run's rate is not a CPU step time: skipped."""
    seen: dict[str, list[float]] = {}
    for root in roots:
        found = runs.find_runs(root, marker=runs.METRICS) if Path(root).is_dir() else []
        for run in found:
            try:
                key = timing_key(run.config_dict())
                if key not in want or run.device_type() != "cpu":
                    continue
                rates = cpu_rate(run) or log_rate(run)
                if not rates:
                    rates = [r["steps_per_s"] for r in run.metrics() if r.get("steps_per_s")]
                    if run.finished:  # newer runs: the run average only
                        rates += [run.summary().get("steps_per_s") or 0]
                rates = [r for r in rates if r]
            except Exception:  # noqa: BLE001 -- an old run's config may not compose: skip it
                continue
            if rates:
                seen.setdefault(key, []).append(1 / statistics.median(rates))
    return {k: statistics.median(v) for k, v in seen.items()}


_STEP_LINE = re.compile(r"^\[(\d\d):(\d\d):(\d\d)\]\[INFO\] step (\d+)/\d+ ")


def log_rate(run) -> list[float]:
    """[steps per second between the step lines of the run's train.log], over the windows
    no slower than 5x the median window (a pause or a starved core is left out, a refit or
    an evaluation kept); a resume, which logs steps again, starts a new series; a window
    across midnight is counted modulo a day; [] with fewer than 3 windows."""
    try:
        lines = (run.path / runs.LOG).read_text(errors="replace").splitlines()
    except OSError:
        return []
    windows, last = [], None  # (steps, seconds)
    for line in lines:
        m = _STEP_LINE.match(line)
        if not m:
            continue
        t, step = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]), int(m[4])
        if last is not None and step > last[1] and (t - last[0]) % 86400 > 0:
            windows.append((step - last[1], (t - last[0]) % 86400))
        last = (t, step)
    if len(windows) < 3:
        return []
    typical = statistics.median(sec / steps for steps, sec in windows)
    kept = [(steps, sec) for steps, sec in windows if sec / steps <= 5 * typical]
    return [sum(steps for steps, _ in kept) / sum(sec for _, sec in kept)]


def cpu_rate(run) -> list[float]:
    """[steps per CPU second] of a finished run whose summary records cpu_seconds, else []."""
    s = run.summary() if run.finished else {}
    cpu, steps = s.get("cpu_seconds"), s.get("steps")
    return [steps / cpu] if cpu and steps else []


@dataclass
class StepTimes:
    """This machine's step-time cache (``<out>/.step_times.json``) with the committed times
    filling in where it has none (this machine's, else the first machine's: ``where`` names
    it). ``measuring``: --time, so committed times are not used."""

    path: Path
    measuring: bool = False

    def __post_init__(self):
        self.cache = json.loads(self.path.read_text()) if self.path.is_file() else {}
        here = machine()
        self.times, self.where = self.cache.setdefault(here, {}), here
        if COMMITTED_TIMES.is_file() and not self.measuring:
            committed = json.loads(COMMITTED_TIMES.read_text())
            name = here if here in committed else next(iter(committed), None)
            if name and not self.times:
                self.where = f"{name} (committed: results/tables/step_times.json)"
            if name:
                self.times = {**committed[name], **self.times}

    def measure(self, key: str, cfg: DictConfig, steps: int) -> None:
        self.times[key] = self.cache[machine()][key] = time_step(cfg, steps, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.cache, indent=1))


def step_time(key: str, cached: dict, recorded: dict, noted: set, say) -> float:
    """A setting's seconds a step: this machine's (or the committed) ``--time`` figure, or
    where finished runs of the setting took over 1.25x longer, theirs, said once. A --time
    figure measured on older code or an idle core once priced the augmult study's GEP steps at
    5.8 s while its runs took 9.1 CPU-seconds, so ``--fit`` would have started jobs that could
    not end before ``--stop-at``: the larger figure is the safe one."""
    timed, ran = cached.get(key, math.nan), recorded.get(key, math.nan)
    if math.isnan(timed) or not ran > 1.25 * timed:
        return ran if math.isnan(timed) else timed
    if key not in noted:
        noted.add(key)
        say(f"# a step time: finished runs took {ran:.2f} s a step, the --time figure "
            f"{timed:.2f} s (older code, or an idle core); using the runs'")  # fmt: skip
    return ran


def estimate(
    jobs, cfgs: dict, out: Path, roots: list[Path], timing_steps: int | None,
    say: Callable[[str], None],
) -> tuple[list[dict], str]:  # fmt: skip
    """A row per job (job, n, steps, step_s, sec, why: a reason a cost is missing) and the
    machine the step times are for. ``timing_steps``: measure the missing step times with
    that many steps (``--time``), else None; ``say`` prints progress and notes."""
    from dpsub.training.build import plan_steps

    st = StepTimes(Path(out) / ".step_times.json", measuring=timing_steps is not None)
    recorded = recorded_step_times(roots, {timing_key(c) for c in cfgs.values()})
    sizes, noted, rows = {}, set(), []
    for job in jobs:
        cfg = cfgs[job.dir]
        key = timing_key(cfg)
        if key not in st.times and timing_steps:
            say(f"  timing {job.variant}/{job.name} ({timing_steps} steps) ...")
            st.measure(key, cfg, timing_steps)
        step_s = step_time(key, st.times, recorded, noted, say)
        data_key = json.dumps(
            [OmegaConf.to_container(cfg[k]) for k in ("dataset", "aux")] + [cfg.seed]
        )
        if data_key not in sizes:  # loading the data is the slow part: once per dataset/aux/seed
            sizes[data_key] = train_size(cfg)
        n, note = sizes[data_key]
        if n is not None and note and note not in noted:
            noted.add(note)
            say(f"# {note}")
        steps = plan_steps(cfg, n)[1] if n is not None else None
        no_time = NO_TIME_WHEEL if wheel_install() else NO_TIME
        why = note if n is None else ("" if math.isfinite(step_s) else no_time)
        sec = steps * step_s if steps else math.nan
        rows.append({"job": job, "steps": steps, "step_s": step_s, "sec": sec, "n": n, "why": why})
    return rows, st.where


def hms(sec: float) -> str:
    """``1h05m`` / ``4m09s``; ``?`` for an unknown cost."""
    if not math.isfinite(sec):
        return "?"
    h, rem = divmod(int(round(sec)), 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"
