"""Step time and peak memory of every mechanism, relative to non-private training.

Each (model, mechanism, backend) is a real run: its config is composed with Hydra's
compose API from ``conf/`` (``dataset=synthetic`` shaped like the model's inputs,
``train.batch_size`` = the whole synthetic set, so every step sees the same full
batch), validated with :func:`dpsub.config.validate`, built with
:func:`dpsub.training.build.build_run`, and timed around
:func:`dpsub.training.build.train_step`, the trainer's own step (sampling aside: the
batch is given). ``nonprivate`` always runs and is the baseline of the ratios.

The timed steps are *interleaved*: round r times one step of every run in turn, so
load drift on a shared machine hits all mechanisms alike (timing them one after
another made a 1.5x ratio read 2.1x on another day). Ratios are medians, or means
(``--statistic mean``: over a multiple of ``subspace_every`` steps, the amortized cost
of a mechanism that refits its subspace every s steps). Pin the threads (``--threads
1``) on a shared machine: two threads on two busy cores distort ratios (docs/speed.md).
``--standalone`` also times every row alone in its own process (rows that share a process
can slow each other); ``--for-readme`` refuses to write figures that break the README
rule (:mod:`dpsub.experiments.bench.standalone`).

Usage::

    python scripts/bench.py                                   # every mechanism, mnist_cnn + resnet20
    python scripts/bench.py --models resnet20 --mechanisms dpsgd --backends vmap opacus
    python scripts/bench.py --set num_bases=256 --aux-size 512 \\
        --out results/bench/x.json --markdown results/bench/x.md
    python scripts/bench.py --models resnet20 --mechanisms dpsgd --backends ghost \\
        --threads 1 --steps 20 --warmup 2 --standalone --for-readme --out ... --markdown ...

``--set KEY=VALUE`` sets ``mechanism.KEY`` for every mechanism declaring KEY, ``--set
MECH.KEY=VALUE`` only for MECH; ``--variant MECH:KEY=VALUE,...`` adds one more row of
MECH with those options (e.g. GEP at two subspace cadences in one interleaved run; a
dotted KEY is a whole-config override, e.g. ``dpsgd@ghost:train.augmult=4`` times K = 4
views per example beside K = 1);
``MECH@BACKEND:...`` gives that row its own backend; ``--override`` passes any Hydra
override to every run. ``--peers`` adds other frameworks' private steps (Opacus, the GEP
authors' code, fastDP): :mod:`dpsub.experiments.bench.peers`, docs/speed.md.
Mechanisms that need auxiliary data get ``aux=gaussian`` with ``--aux-size`` examples.

Memory is measured on separate, untimed steps before the warmup (``--memory-steps``; the
first step of a run includes its first subspace fit):
on CUDA ``max_memory_allocated()`` during the step minus what was allocated just
before it; on the CPU the process RSS sampled every ~2 ms by a thread during the step
minus the RSS just before it, after giving freed heap back to the OS (approximate:
allocator caching blurs it). Trimming the heap makes the next step page-fault its
memory in again, which slowed private steps more than non-private ones (vmap DP-SGD on
ResNet-20 read 1.80x instead of 1.62x), so no timed step follows a trim. A run that
fails (unknown option, out of memory...) becomes an error row.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import gc
import json
import math
import os
import platform
import shlex
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from dpsub.config import validate
from dpsub.experiments.bench import peers as peer_lib
from dpsub.experiments.bench import standalone as alone_lib
from dpsub.grads import BACKENDS
from dpsub.mechanisms.options import SPECS
from dpsub.models import count_parameters
from dpsub.paths import project_root
from dpsub.rundir import cpu_name, git_commit
from dpsub.training.build import build_run, train_step
from dpsub.training.heap import keep_freed_memory

ROOT = project_root()  # the repository (an install: the working directory)
#: a backend, or vmap with grads.compile=true (torch.compile of the per-example function)
CHOICES = (*BACKENDS, "vmap+compile")

CONF = ROOT / "conf"
MNIST_MODELS = ("mnist_cnn", "lenet")
MiB = 2**20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- options
def in_shape_of(model: str) -> tuple[int, int, int]:
    return (1, 28, 28) if model in MNIST_MODELS else (3, 32, 32)


def parse_value(text: str) -> Any:
    """YAML-typed value, as Hydra would read it: 1000 -> int, 1e-3 -> float, [1,2] -> list."""
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]))["v"]


def parse_overrides(items: list[str]) -> list[tuple[str | None, str, Any]]:
    """``KEY=VALUE`` -> (None, KEY, value); ``MECH.KEY=VALUE`` -> (MECH, KEY, value)."""
    out = []
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        scope, _, key = key.strip().rpartition(".")
        out.append((scope or None, key, parse_value(value)))
    return out


def mechanism_options(
    name: str, overrides: list[tuple[str | None, str, Any]], used: set[int]
) -> dict[str, Any]:
    """The --set values that apply to mechanism ``name`` (its declared options, or scoped)."""
    declared = SPECS[name].option_names if name in SPECS else ()
    opts = {}
    for i, (scope, key, value) in enumerate(overrides):
        if scope == name or (scope is None and key in declared):
            opts[key] = value
            used.add(i)
    return opts


def run_overrides(model: str, mech: str, backend: str, options: dict, args) -> list[str]:
    """Hydra overrides of one benchmark run."""
    c, h, _ = in_shape_of(model)
    has_yaml = (CONF / "mechanism" / f"{mech}.yaml").exists()
    declared = SPECS[mech].option_names if mech in SPECS else ()
    ov = [
        f"model={model}",
        f"mechanism={mech}" if has_yaml else "mechanism=nonprivate",
        *([] if has_yaml else [f"mechanism.name={mech}"]),
        "dataset=synthetic",
        f"dataset.synthetic.n_train={args.batch_size}",
        "dataset.synthetic.n_test=8",
        f"dataset.synthetic.channels={c}",
        f"dataset.synthetic.size={h}",
        f"train.batch_size={args.batch_size}",
        "train.epochs=100000",
        f"grads.microbatch={args.microbatch}",
        f"grads.backend={backend.partition('+')[0]}",
        f"grads.compile={str(backend.endswith('+compile')).lower()}",
        "privacy.noise_multiplier=1.0",
        "privacy.epsilon=1e12",  # the budget never stops a benchmark
        f"device={args.device}",
        f"seed={args.seed}",
        "logger=disabled",
    ]
    if mech in SPECS and SPECS[mech].needs_aux:
        ov += ["aux=gaussian", f"aux.num_samples={args.aux_size}", "aux.labels=random_once"]
    for key, value in options.items():
        if "." in key:  # a whole-config key (train.augmult=4): after the defaults above
            ov.append(f"{key}={json.dumps(value)}")
            continue
        prefix = "" if (has_yaml and key in declared) else "+"
        ov.append(f"{prefix}mechanism.{key}={json.dumps(value)}")
    return ov + list(args.override)


def compose_cfg(overrides: list[str]):
    from dpsub.config import compose

    return compose(overrides)


# ------------------------------------------------------------------ memory
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def trim_heap() -> None:
    """Give freed heap back to the OS so the RSS baseline is not inflated by old frees."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RssSampler:
    """Peak RSS of this process, read every ``interval`` s by a background thread."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes())
            if self._stop.wait(self.interval):
                break

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


# ------------------------------------------------------------------ timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_step(run, idx) -> None:
    """dpsub's own train_step, or a peer framework's full private step."""
    if isinstance(run, peer_lib.PeerRun):
        run.step()
    else:
        train_step(run, idx=idx)


def timed_step(run, idx) -> float:
    """Milliseconds of one step (nothing else runs: no heap trimming, no sampler)."""
    sync(run.device)
    t0 = time.perf_counter()
    one_step(run, idx)
    sync(run.device)
    return (time.perf_counter() - t0) * 1e3


def memory_step(run, idx, args) -> float:
    """Extra MiB of one (untimed) train_step: peak minus what was held just before it."""
    device = run.device
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        one_step(run, idx)
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - base) / MiB
    trim_heap()  # (costs the next step page faults: never done before a timed step)
    with RssSampler(args.rss_interval) as s:
        base = s.peak
        one_step(run, idx)
    return max(s.peak - base, 0) / MiB


def build(record: dict, overrides: list[str]):
    """Compose, validate and build one run; an error row on failure."""
    try:
        cfg = compose_cfg(overrides)
        validate(cfg)
        t0 = time.perf_counter()
        run = build_run(cfg)
        record["setup_s"] = time.perf_counter() - t0
        record["params"] = count_parameters(run.model)
        return run
    except Exception as e:  # noqa: BLE001 -- report, keep benchmarking
        record.update(status="error", error=f"build: {type(e).__name__}: {e}")
        log(f"  ! {record['mechanism']} ({record['backend']}) failed to build: {e}")
        return None


def interleave(runs, records, args, rounds: int, step_fn) -> list[list[float]]:
    """``rounds`` rounds of one ``step_fn`` step of every healthy run in turn."""
    out: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, run in enumerate(runs):
            if run is None or records[i]["status"] != "ok":
                continue
            idx = torch.arange(args.batch_size, device=run.device)
            try:
                out[i].append(step_fn(run, idx))
            except Exception as e:  # noqa: BLE001
                records[i].update(status="error", error=f"step: {type(e).__name__}: {e}")
                log(traceback.format_exc())
    return out


def bench_model(model: str, pairs, args, overrides, used) -> list[dict]:
    """Build every run of ``model``; measure memory, warm up, then time, all interleaved."""
    records, runs = [], []
    for mech, backend, variant in pairs:
        options = {**mechanism_options(mech, overrides, used), **variant}
        rec = {
            "model": model, "in_shape": list(in_shape_of(model)), "mechanism": mech,
            "backend": "-" if mech == "nonprivate" else backend, "batch_size": args.batch_size,
            "microbatch": args.microbatch, "steps": args.steps, "warmup": args.warmup,
            "statistic": args.statistic, "noise_multiplier": 1.0, "options": options,
            "status": "ok", "error": None,
        }  # fmt: skip
        if mech in SPECS and SPECS[mech].needs_aux:
            rec["aux_size"] = args.aux_size
        runs.append(build(rec, run_overrides(model, mech, backend, options, args)))
        records.append(rec)
    if args.peers:
        add_peers(model, runs, records, args)
    # memory first: step 0 fits every subspace mechanism's first basis; then at least one
    # untimed step re-faults the trimmed heap before anything is timed
    mems = interleave(runs, records, args, args.memory_steps, lambda r, i: memory_step(r, i, args))
    settle = max(args.warmup, 1 if args.memory_steps else 0)
    interleave(runs, records, args, settle, timed_step)
    times = interleave(runs, records, args, args.steps, timed_step)
    for i, rec in enumerate(records):
        if rec["status"] == "ok":
            ms = times[i]
            q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
            rec.update(
                median_ms=statistics.median(ms), mean_ms=statistics.fmean(ms), min_ms=min(ms),
                max_ms=max(ms), q1_ms=q[0], q3_ms=q[2], step_ms=ms,
                peak_extra_mib=max(mems[i], default=None),
            )  # fmt: skip
            rec["time_ms"] = rec[f"{args.statistic}_ms"]
            log(f"  {rec['mechanism']} [{rec['backend']}]: {rec['time_ms']:.1f} ms/step")
    runs.clear()
    gc.collect()
    records = ratios(records)
    peer_ratios(records)
    return records


# ------------------------------------------------------------------- peers
def peer_record(model: str, framework: str, mech: str, backend: str, args, **extra) -> dict:
    rec = {
        "model": model, "in_shape": list(in_shape_of(model)), "mechanism": mech,
        "framework": framework, "backend": backend, "batch_size": args.batch_size,
        "microbatch": args.batch_size, "steps": args.steps, "warmup": args.warmup,
        "statistic": args.statistic, "noise_multiplier": 1.0, "options": {},
        "status": "ok", "error": None, **extra,
    }  # fmt: skip
    return rec


def gep_sizes(runs, records) -> dict[str, Any]:
    """m, k, grouping of the first dpsub GEP row (else GEP's defaults), for the authors."""
    for run, rec in zip(runs, records, strict=True):
        if rec["mechanism"] == "gep" and run is not None and not isinstance(run, peer_lib.PeerRun):
            m = run.cfg.mechanism
            return dict(num_bases=int(m.num_bases), num_groups=int(m.num_groups),
                        power_iters=int(m.power_iters), grouping=str(m.grouping),
                        clip0=float(m.clip_embedding), clip1=float(m.clip_residual))  # fmt: skip
    m = compose_cfg(["mechanism=gep"]).mechanism
    return dict(num_bases=m.num_bases, num_groups=m.num_groups, power_iters=m.power_iters,
                grouping=m.grouping, clip0=m.clip_embedding, clip1=m.clip_residual)  # fmt: skip


def add_peers(model: str, runs: list, records: list[dict], args) -> None:
    """Append the peer frameworks' rows (built from the non-private run's model and batch)."""
    base = runs[0]
    if base is None:
        return
    x = base.data.train_x[: args.batch_size].to(base.device)
    y = base.data.train_y[: args.batch_size].to(base.device)
    o = base.cfg.optim
    s = peer_lib.PeerSettings(clip=1.0, noise_multiplier=1.0, lr=float(o.lr),
                              momentum=float(o.get("momentum", 0.0)), seed=args.seed)  # fmt: skip

    def add(rec: dict, make) -> None:
        records.append(rec)
        try:
            t0 = time.perf_counter()
            runs.append(make())
            rec["setup_s"] = time.perf_counter() - t0
        except peer_lib.PeerUnavailable as e:
            rec.update(status="skipped", error=str(e))
            runs.append(None)
            log(f"  - {rec['framework']}: {e}")
        except Exception as e:  # noqa: BLE001 -- report, keep benchmarking
            rec.update(status="error", error=f"build: {type(e).__name__}: {e}")
            runs.append(None)
            log(traceback.format_exc())

    for mode in args.opacus_modes:
        rec = peer_record(model, "opacus", "dpsgd", mode, args)
        add(rec, lambda mode=mode: peer_lib.opacus_peer(mode, base.model, x, y, s))
    g = gep_sizes(runs, records)
    rec = peer_record(model, "gep-authors", "gep", "backpack", args, aux_size=args.aux_size)
    rec["options"] = {"num_bases": g["num_bases"], "num_groups": g["num_groups"],
                      "power_iters": g["power_iters"]}  # fmt: skip
    if args.gep_authors is None:
        records.append({**rec, "status": "skipped",
                        "error": "no checkout given: pass --gep-authors PATH (it is never copied "
                                 "into this repository)"})  # fmt: skip
        runs.append(None)
    else:
        aux = peer_lib.gaussian_aux(args.aux_size, in_shape_of(model), base.data.num_classes,
                                    args.seed, base.device)  # fmt: skip
        add(rec, lambda: peer_lib.gep_authors_peer(
            args.gep_authors, base.model, x, y, *aux, g["num_bases"], g["num_groups"],
            g["power_iters"], s, clip0=g["clip0"], clip1=g["clip1"]))  # fmt: skip
    why = peer_lib.fastdp_status()
    records.append({**peer_record(model, "fastdp", "dpsgd", "book-keeping", args),
                    "status": "skipped" if why else "error", "error": why or "not wired"})  # fmt: skip
    runs.append(None)


def peer_ratios(records: list[dict]) -> None:
    """Each peer's time over dpsub's fastest row of the same mechanism (``vs_dpsub``)."""
    for r in records:
        r.setdefault("framework", "dpsub")
    for r in records:
        r["vs_dpsub"] = r["vs_dpsub_row"] = None
        if r["framework"] == "dpsub" or r["status"] != "ok":
            continue
        same = [d for d in records if d["framework"] == "dpsub" and d["status"] == "ok"
                and d["mechanism"] == r["mechanism"]]  # fmt: skip
        if same:
            best = min(same, key=lambda d: d["time_ms"])
            r["vs_dpsub"] = r["time_ms"] / best["time_ms"]
            r["vs_dpsub_row"] = label(best)


def label(r: dict) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in r["options"].items())
    return f"{r['mechanism']} [{r['backend']}]" + (f" ({opts})" if opts else "")


def ratios(records: list[dict]) -> list[dict]:
    base = next(
        (r for r in records if r["mechanism"] == "nonprivate" and r["status"] == "ok"), None
    )
    for r in records:
        r["time_ratio"] = r["mem_ratio"] = None
        if base is not None and r["status"] == "ok":
            r["time_ratio"] = r["time_ms"] / base["time_ms"]
            if r["peak_extra_mib"] is not None and base["peak_extra_mib"]:
                r["mem_ratio"] = r["peak_extra_mib"] / base["peak_extra_mib"]
    return records


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``MECH:KEY=VALUE,KEY=VALUE`` -> (MECH, {KEY: value}) (values YAML-typed; a dotted
    KEY is kept whole: a config key, not an option of the mechanism)."""
    mech, sep, rest = text.partition(":")
    if not sep or not mech or "=" not in rest:
        raise SystemExit(f"--variant expects MECH:KEY=VALUE[,KEY=VALUE...], got {text!r}")
    return mech, {f"{s}.{k}" if s else k: v for s, k, v in parse_overrides(rest.split(","))}


def plan(args) -> list[tuple[str, str, dict[str, Any]]]:
    """(mechanism, backend, variant options) rows, nonprivate first, then --variant rows."""
    names = args.mechanisms or sorted(SPECS)
    names = ["nonprivate"] + [n for n in dict.fromkeys(names) if n != "nonprivate"]
    backends = args.backends or [args.backend]
    rows = []
    for name in names:
        if name != "nonprivate" and ("all" in args.backends_for or name in args.backends_for):
            rows.extend((name, b, {}) for b in backends)
        else:
            rows.append((name, args.backend, {}))
    for text in args.variant:
        mech, options = parse_variant(text)
        mech, _, backend = mech.partition("@")  # MECH@BACKEND: that row's backend
        if backend and backend not in CHOICES:
            raise SystemExit(f"--variant {text!r}: backend must be one of {', '.join(CHOICES)}")
        rows.append((mech, backend or args.backend, options))
    return rows


# --------------------------------------------------------------------- env
def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def environment(device: torch.device, argv: list[str], args) -> dict:
    env = {
        "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
        "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *argv]), "git": git_commit(),
        "loadavg_start": loadavg(),
        "timing": f"{args.statistic} over interleaved steps (round-robin over the runs)",
        "memory_method": (
            "torch.cuda.max_memory_allocated" if device.type == "cuda"
            else "RSS sampled every ~2 ms after trimming the heap (approximate)"
        ) + f", peak over {args.memory_steps} untimed first step(s) (they include a subspace fit)",
    }  # fmt: skip
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    return env


# ------------------------------------------------------------------ output
def _fmt(v, spec: str, suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec) + suffix


def markdown(records: list[dict], env: dict) -> str:
    lines = [
        "# dpsub benchmark: cost of each mechanism vs. non-private training", "",
        f"- device: {env['device']} ({env['device_name']})" + (f", CUDA {env['cuda']}" if env.get("cuda") else ""),
        f"- torch {env['torch']}, python {env['python']}; CPUs: {env['cpu_count']} (torch threads: {env['torch_threads']})",
        f"- date: {env['date']}" + (f"; git {env['git']}" if env.get("git") else ""),
        f"- command: `{env['command']}`",
        f"- timing: {env['timing']}; memory: {env['memory_method']}, extra = peak minus memory held before the step",
        f"- machine load (1/5/15-min loadavg): {env.get('loadavg_start', 'n/a')} at start, "
        f"{env.get('loadavg_end', 'n/a')} at end",
        f"- allocator: {env.get('malloc', 'the C library default (not recorded)')}",
        *rule_lines(env), "",
    ]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in records):
        lines += model_table([r for r in records if r["model"] == model])
    return "\n".join(lines)


def rule_lines(env: dict) -> list[str]:
    """Which figures count for a README, and whether this run's meet the rule."""
    problems = env.get("readme_problems")
    if problems is None:  # a page written before the rule
        return []
    verdict = (
        "met"
        if not problems
        else ("**not met** (" + "; ".join(problems) + "): do not quote these figures in the README")
    )
    return [f"- README rule: {alone_lib.RULE}: {verdict}"]


def model_table(rows: list[dict]) -> list[str]:
    """One model's heading and table (interleaved, and standalone beside it when timed)."""
    r0 = next((r for r in rows if "params" in r), rows[0])
    alone = any("standalone_ms" in r for r in rows)
    cols = "| mechanism | backend | options | ms/step | IQR ms | rounds | time vs nonprivate "
    cols += "| alone ms/step | alone IQR ms | alone rounds | alone vs nonprivate alone " * alone
    cols += "| peak extra MiB | memory vs nonprivate |"
    return [
        f"## {r0['model']} ({r0.get('params', 0):,} params, input {'x'.join(map(str, r0['in_shape']))}), "
        f"batch {r0['batch_size']}, microbatch {r0['microbatch']}, {r0['statistic']} of {r0['steps']} "
        f"interleaved rounds after {r0['warmup']} warmup"
        + ("; `alone`: each row in its own process (the figure that counts)" if alone else ""), "",
        cols, "|---|---|---|" + "---:|" * (cols.count("|") - 4),
        *(table_row(r, alone) for r in rows), "",
    ]  # fmt: skip


def table_row(r: dict, alone: bool) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
    head = f"| {r['mechanism']} | {r['backend']} | {opts} "
    if r["status"] != "ok":
        err = str(r["error"]).replace("|", "\\|").replace("\n", " ")[:160]
        return head + f"| error: {err} " + "| " * (5 + 4 * alone) + "|"
    cells = [_fmt(r["time_ms"], ".1f"), _iqr(r, "q1_ms", "q3_ms"), str(len(r.get("step_ms", []))),
             _fmt(r["time_ratio"], ".2f", "x")]  # fmt: skip
    if alone and r.get("standalone_error"):
        cells += ["error: " + str(r["standalone_error"])[:80], "", "", ""]
    elif alone:
        cells += [_fmt(r.get("standalone_ms"), ".1f"),
                  _iqr(r, "standalone_q1_ms", "standalone_q3_ms"),
                  _fmt(r.get("standalone_rounds"), "d"), _fmt(r.get("standalone_ratio"), ".2f", "x")]  # fmt: skip
    cells += [_fmt(r["peak_extra_mib"], ".1f"), _fmt(r["mem_ratio"], ".2f", "x")]
    return head + "".join(f"| {c} " for c in cells) + "|"


def _iqr(r: dict, q1: str, q3: str) -> str:
    return f"{_fmt(r.get(q1), '.1f')}-{_fmt(r.get(q3), '.1f')}"


PEER_NOTES = [
    "The machine is shared (other jobs ran during this run): every row is timed in the same "
    "interleaved rounds (round r times one step of every row in turn), so load drift hits all "
    "frameworks alike and the ratios stay fair while the absolute ms/step may not be reproducible.",
    "Every row is a full private step on the same model (same initial weights), the same batch, "
    "clip 1.0, noise multiplier 1.0 and SGD (the run's lr and momentum): dpsub's `train_step` "
    "(sampling aside), Opacus' `make_private` model, optimizer (and, in ghost mode, loss); "
    "the GEP authors' `main.py` private branch with the residual added back (`--rgp`, the "
    "paper's GEP), anchors on Gaussian auxiliary data of the same size m as dpsub's.",
    "The GEP authors' code runs from the given checkout (`$GEP_AUTHORS`: github.com/dayu11/"
    "Gradient-Embedding-Perturbation), never copied into this repository; on "
    "the CPU two lines are patched in the loaded module only: `torch.tensor(clip).cuda()` -> a "
    "tensor on the batch's device, and numpy's removed `np.int` -> `int`.",
    "`vs dpsub best` = the peer's time over dpsub's fastest row of the same mechanism "
    "(above 1: dpsub is faster).",
]


def _spread(r: dict) -> str:
    return f"{r['min_ms']:.0f}-{r['max_ms']:.0f} (IQR {r['q1_ms']:.0f}-{r['q3_ms']:.0f})"


def target_lines(rows: list[dict], model: str) -> list[str]:
    """The issue's targets, read off this run's rows (met or missed, by how much)."""
    ok = [r for r in rows if r["status"] == "ok"]
    mine = [r for r in ok if r["framework"] == "dpsub" and r["mechanism"] == "dpsgd"]
    out = []
    if mine:
        best = min(mine, key=lambda r: r["time_ms"])
        ratio = best["time_ratio"]
        if ratio is not None and model != "mnist_cnn":
            verdict = "met" if ratio <= 1.15 else f"missed by {ratio / 1.15 - 1:.0%}"
            out.append(f"- DP-SGD, best backend ({best['backend']}): {ratio:.2f}x non-private "
                       f"(target <= 1.15x: {verdict})")  # fmt: skip
        opac = [r for r in ok if r["framework"] == "opacus"]
        if opac:
            fast = min(opac, key=lambda r: r["time_ms"])
            ahead = best["time_ms"] <= fast["time_ms"]
            out.append(f"- DP-SGD vs the fastest Opacus mode ({fast['backend']}): dpsub "
                       f"{best['time_ms']:.0f} ms vs {fast['time_ms']:.0f} ms, "
                       + ("not slower (met)" if ahead else
                          f"slower by {best['time_ms'] / fast['time_ms'] - 1:.0%} (missed)"))  # fmt: skip
    authors = next((r for r in ok if r["framework"] == "gep-authors"), None)
    gep = [r for r in ok if r["framework"] == "dpsub" and r["mechanism"] == "gep"]
    if authors and gep:
        tracked = [r for r in gep if r["options"].get("warm_start")] or gep
        t = min(tracked, key=lambda r: r["time_ms"])
        x = authors["time_ms"] / t["time_ms"]
        verdict = "met" if x >= 5 else f"missed: {x:.2f}x of 5x"
        out.append(f"- GEP: the authors' step over dpsub's {label(t)}: {x:.2f}x faster "
                   f"(target >= 5x: {verdict})")  # fmt: skip
    return out


def peers_markdown(records: list[dict], env: dict) -> str:
    """One table per model: dpsub's rows and the peers', spread over rounds, targets."""
    load = f"{env.get('loadavg_start', 'n/a')} at start, {env.get('loadavg_end', 'n/a')} at end"
    lines = [
        "# dpsub against its peers: full private steps, one interleaved run", "",
        f"- machine: {env['device']} ({env['device_name']}), {env['cpu_count']} CPUs, torch "
        f"threads {env['torch_threads']}; torch {env['torch']}, python {env['python']}",
        f"- machine load (1/5/15-min loadavg): {load}",
        *rule_lines(env),
        f"- date: {env['date']}; git {env.get('git')}",
        f"- command: `{env['command']}`",
        f"- timing: {env['timing']}; memory: {env['memory_method']}", "",
        *[f"- {n}" for n in [*PEER_NOTES, *env.get("notes", [])]], "",
    ]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        r0 = next((r for r in rows if "params" in r), rows[0])
        lines += [
            f"## {model} ({r0.get('params', 0):,} params), batch {r0['batch_size']}, "
            f"{r0['statistic']} of {r0['steps']} interleaved rounds after {r0['warmup']} warm-up", "",
            "| framework | mechanism | backend | options | ms/step | spread over rounds (min-max) "
            "| vs non-private | vs dpsub best | peak extra MiB | memory vs non-private |",
            "|---|---|---|---|---:|---|---:|---:|---:|---:|",
        ]  # fmt: skip
        for r in rows:
            opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
            if r.get("aux_size") and r["mechanism"] != "nonprivate":
                opts += f", m={r['aux_size']}"
            head = f"| {r['framework']} | {r['mechanism']} | {r['backend']} | {opts} "
            if r["status"] != "ok":
                what = "not timed" if r["status"] == "skipped" else "error"
                err = str(r["error"]).replace("|", "\\|").replace("\n", " ")[:200]
                lines.append(head + f"| {what}: {err} | | | | | |")
                continue
            lines.append(
                head + f"| {r['time_ms']:.1f} | {_spread(r)} | {_fmt(r['time_ratio'], '.2f', 'x')} "
                f"| {_fmt(r['vs_dpsub'], '.2f', 'x')} | {_fmt(r['peak_extra_mib'], '.0f')} "
                f"| {_fmt(r['mem_ratio'], '.2f', 'x')} |"
            )  # fmt: skip
        lines += ["", "Targets (issue 25, CPU, batch 256):", "", *target_lines(rows, model), ""]
    return "\n".join(lines)


def write_json(path: Path, records: list[dict], append: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    old = []
    if append and path.exists():
        with contextlib.suppress(ValueError):
            loaded = json.loads(path.read_text())
            old = loaded if isinstance(loaded, list) else [loaded]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(old + records, indent=2, default=str) + "\n")
    tmp.replace(path)


def write_markdown(path: Path, text: str, append: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if append and path.exists():
        with path.open("a") as f:
            f.write("\n---\n\n" + text + "\n")
    else:
        path.write_text(text + "\n")


# --------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Median step time and peak memory of each mechanism vs. non-private training.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    models = sorted(f.stem for f in (CONF / "model").glob("*.yaml"))
    p.add_argument("--models", nargs="+", default=["mnist_cnn", "resnet20"], choices=models)
    p.add_argument("--mechanisms", nargs="+", default=None, help="default: every declared one")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--microbatch", type=int, default=None, help="default: the batch size")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per run first")
    p.add_argument("--statistic", default="median", choices=["median", "mean"],
                   help="of the timed steps (mean over a multiple of subspace_every: amortized)")  # fmt: skip
    p.add_argument("--memory-steps", type=int, default=1,
                   help="untimed first steps per run for peak memory (then >= 1 warmup step)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--backend", default="vmap", choices=CHOICES, help="per-example gradients")
    p.add_argument("--backends", nargs="+", default=None, choices=CHOICES,
                   help="run the mechanisms of --backends-for once per backend")  # fmt: skip
    p.add_argument("--backends-for", nargs="+", default=["dpsgd"],
                   help="mechanisms that --backends applies to ('all': every one)")  # fmt: skip
    p.add_argument("--aux-size", type=int, default=2000, help="auxiliary examples (needs_aux)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="mechanism option for every mechanism declaring KEY (MECH.KEY=VALUE: MECH only)")  # fmt: skip
    p.add_argument("--variant", action="append", default=[], metavar="MECH:KEY=VALUE,...",
                   help="one more row of MECH (MECH@BACKEND: with that backend) with these options "
                        "(on top of --set; a dotted KEY such as train.augmult is a config key)")  # fmt: skip
    p.add_argument("--override", action="append", default=[], metavar="HYDRA_OVERRIDE",
                   help="any Hydra override for every run, e.g. optim=adam")  # fmt: skip
    p.add_argument("--peers", action="store_true",
                   help="also time other frameworks' private steps: Opacus (--opacus-modes), the "
                        "GEP authors' code (--gep-authors), fastDP (if installed)")  # fmt: skip
    p.add_argument("--opacus-modes", nargs="*", default=list(peer_lib.OPACUS_MODES),
                   choices=peer_lib.OPACUS_MODES, help="with --peers")  # fmt: skip
    p.add_argument("--gep-authors", type=Path, default=None,
                   help="with --peers: a checkout of the GEP authors' repository (needs BackPACK)")  # fmt: skip
    p.add_argument("--note", action="append", default=[],
                   help="with --peers: a line for the page's notes (what was left out and why)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--rss-interval", type=float, default=0.002, help="CPU RSS sampling period (s)")
    p.add_argument("--out", type=Path, default=None, help="JSON output (list of records)")
    p.add_argument("--markdown", type=Path, default=None, help="Markdown output")
    p.add_argument("--append", action="store_true", help="add to existing --out/--markdown")
    p.add_argument("--standalone", action="store_true",
                   help="also time every row alone, in its own process (the README's figure)")  # fmt: skip
    p.add_argument("--for-readme", action="store_true",
                   help=f"refuse (exit 2, nothing written) unless --standalone, --steps >= "
                        f"{alone_lib.MIN_ROUNDS} and the 1-min load <= 1 per core at start and end")  # fmt: skip
    p.add_argument("--only-row", type=int, default=None, help=argparse.SUPPRESS)  # a child's row
    return p


def main(argv: list[str] | None = None) -> int:
    threads = torch.get_num_threads()
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:  # a caller's thread count is its own (tests call main in-process)
        torch.set_num_threads(threads)


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    heap = keep_freed_memory()  # as dpsub-train does (DPSUB_MALLOC=default: glibc's own)
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 0 or args.memory_steps < 0:
        raise SystemExit("need --batch-size >= 1, --steps >= 1, --warmup >= 0, --memory-steps >= 0")
    if args.standalone and args.peers:
        log("bench: --standalone times dpsub's rows only; run it without --peers")
        return 2
    args.microbatch = args.microbatch or args.batch_size
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)  # fmt: skip
    args.device = str(device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    # the command as typed (python scripts/bench.py ...); called in-process: the wrapper's name
    prog = os.path.relpath(sys.argv[0]) if sys.argv[0].endswith("bench.py") else "scripts/bench.py"
    env = environment(device, [prog, *argv], args)
    env["malloc"] = "freed memory kept (dpsub.training.heap)" if heap else "the C library's default"
    if args.gep_authors:  # a path of this machine: the page names it by a placeholder
        env["command"] = env["command"].replace(str(args.gep_authors), "$GEP_AUTHORS")
    if args.for_readme and (why := alone_lib.readme_problems(args.steps, args.standalone, env)):
        return alone_lib.refuse(why[0])  # before spending any time
    records = run_models(parser, args)
    env["loadavg_end"] = loadavg()
    env["readme_problems"] = alone_lib.readme_problems(args.steps, args.standalone, env)
    if args.for_readme and env["readme_problems"]:
        return alone_lib.refuse(env["readme_problems"][0])
    env["notes"] = list(args.note)
    for r in records:
        r["env"] = env
    text = peers_markdown(records, env) if args.peers else markdown(records, env)
    print(text, flush=True)
    if args.out:
        write_json(args.out, records, args.append)
    if args.markdown:
        write_markdown(args.markdown, text, args.append)
    return 0


def run_models(parser: argparse.ArgumentParser, args) -> list[dict]:
    """Every model's rows, interleaved (and alone with --standalone); warns of unused --set."""
    overrides, used = parse_overrides(args.set), set()
    pairs = plan(args)
    if args.only_row is not None:  # a --standalone child: that row alone
        pairs = [pairs[args.only_row]]
    records = []
    for model in args.models:
        log(f"== {model}, batch {args.batch_size}")
        recs = bench_model(model, pairs, args, overrides, used)
        if args.standalone:
            alone_lib.add_standalone(parser, args, model, recs)
        records += recs
    unused = [
        f"{s + '.' if s else ''}{k}" for i, (s, k, _) in enumerate(overrides) if i not in used
    ]
    if unused and args.only_row is None:
        log(f"warning: --set keys matched no mechanism option: {', '.join(unused)}")
    return records


if __name__ == "__main__":
    sys.exit(main())
