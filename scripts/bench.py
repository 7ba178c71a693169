"""Step time and peak memory of every mechanism, relative to non-private training.

For each model, every mechanism runs a full training step (``mechanism.step`` ->
``engine.set_grad`` -> SGD ``optimizer.step``) on one fixed-size batch of random
data that already lives on the device, in this one process. ``nonprivate`` (the
plain mean gradient) is always run first and is the baseline of the ratios.

Usage::

    python scripts/bench.py                                   # every mechanism, mnist_cnn + resnet20
    python scripts/bench.py --models resnet20 --mechanisms dpsgd --backends vmap opacus
    python scripts/bench.py --set num_bases=1000 --aux-size 2000 \\
        --out results/bench/gep.json --markdown results/bench/gep.md

Mechanism options come from ``conf/mechanism/<name>.yaml`` (``name`` dropped);
``--set KEY=VALUE`` overrides KEY in every mechanism that has it, ``--set
MECH.KEY=VALUE`` only in MECH. Mechanisms with ``needs_aux`` get a random-Gaussian
:class:`~dpsub.data.aux.AuxData` of ``--aux-size`` examples (labels "random_once").

Time: ``time.perf_counter()`` around each step (``torch.cuda.synchronize()`` on
CUDA), median over ``--steps`` after ``--warmup`` untimed steps.
Memory: on CUDA ``max_memory_allocated()`` over the timed steps, minus what was
allocated just before them (model, data, optimizer state, the mechanism's state);
on CPU the process RSS sampled every ~2 ms by a background thread during the timed
steps, minus the RSS just before them (approximate: allocator caching and the
sampling interval both blur it).

A mechanism that fails (unknown option, missing data, out of memory...) becomes an
error row; the benchmark goes on.
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
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
try:
    import dpsub  # noqa: F401
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(ROOT / "src"))

from dpsub.data.aux import AuxData  # noqa: E402
from dpsub.grads import BACKENDS, GradEngine  # noqa: E402
from dpsub.mechanisms import MECHANISMS, StepContext, build_mechanism  # noqa: E402
from dpsub.models import MODELS, build_model, count_parameters  # noqa: E402
from dpsub.training.optim import build_optimizer  # noqa: E402

CONF = ROOT / "conf"
MNIST_SHAPE = (1, 28, 28)
CIFAR_SHAPE = (3, 32, 32)
MNIST_MODELS = ("mnist_cnn", "lenet")
NUM_CLASSES = 10
NOISE_MULTIPLIER = 1.0
MiB = 2**20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- options
def in_shape_of(model: str) -> tuple[int, int, int]:
    return MNIST_SHAPE if model in MNIST_MODELS else CIFAR_SHAPE


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
        key = key.strip()
        scope = None
        if "." in key:
            scope, key = key.split(".", 1)
        out.append((scope, key, parse_value(value)))
    return out


def mechanism_options(
    name: str, overrides: list[tuple[str | None, str, Any]], used: set[int]
) -> tuple[dict, str | None]:
    """Options of ``conf/mechanism/<name>.yaml`` (without ``name``) with the overrides applied."""
    path = CONF / "mechanism" / f"{name}.yaml"
    note = None
    if path.exists():
        opts = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
        opts.pop("name", None)
        opts.pop("defaults", None)  # Hydra defaults list (e.g. the default aux source)
    else:
        opts, note = {}, f"no {path.relative_to(ROOT)}: default options"
    for i, (scope, key, value) in enumerate(overrides):
        if scope == name or (scope is None and key in opts):
            opts[key] = value
            used.add(i)
    return opts, note


def random_aux(n: int, in_shape, seed: int) -> AuxData:
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(n, *in_shape, generator=g)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    return AuxData(
        x=x, y=None, num_classes=NUM_CLASSES, source="gaussian", labels="random_once",
        fixed_labels=labels,
    )  # fmt: skip


# ------------------------------------------------------------------ memory
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM = "/proc/self/statm"


def rss_bytes() -> int | None:
    try:
        with open(_STATM) as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def trim_heap() -> None:
    """Give freed heap back to the OS so the RSS baseline is not inflated by old frees."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RssSampler:
    """Peak RSS of this process, read from /proc/self/statm every ``interval`` s."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with open(_STATM) as f:
            while True:
                f.seek(0)
                rss = int(f.read().split()[1]) * _PAGE
                self.peak = max(self.peak, rss)
                self.samples += 1
                if self._stop.wait(self.interval):
                    break

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes() or 0
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes() or 0)


# --------------------------------------------------------------------- env
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if rev.returncode != 0:
            return None
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device, argv: list[str]) -> dict:
    env = {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *argv]),
        "git": git_commit(),
        "memory_method": (
            "torch.cuda.max_memory_allocated over the timed steps"
            if device.type == "cuda"
            else "RSS sampled every ~2 ms over the timed steps (approximate)"
        ),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    with contextlib.suppress(ImportError):
        import opacus

        env["opacus"] = opacus.__version__
    return env


# --------------------------------------------------------------- benchmark
def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_optim_cfg():
    path = CONF / "optim" / "sgd.yaml"
    if path.exists():
        return OmegaConf.load(path)
    return OmegaConf.create({"name": "sgd", "lr": 0.1, "momentum": 0.9})


def bench_one(
    *,
    model_name: str,
    mech_name: str,
    backend: str,
    options: dict,
    x: torch.Tensor,
    y: torch.Tensor,
    aux_fn,
    args,
    device: torch.device,
) -> dict:
    """Build a fresh model/engine/mechanism/optimizer and time ``args.steps`` steps."""
    rec: dict[str, Any] = {"status": "ok", "error": None}
    phase = "build"
    state: dict[str, Any] = {}
    try:
        seed_all(args.seed)  # same initial weights for every mechanism
        model = build_model(model_name, in_shape_of(model_name), NUM_CLASSES).to(device)
        model.train()
        state["model"] = model
        engine = GradEngine(model, microbatch=args.microbatch, backend=backend)
        mechanism = build_mechanism(mech_name, NOISE_MULTIPLIER, **options)
        state["mechanism"] = mechanism
        phase = "setup"
        aux = aux_fn() if getattr(mechanism, "needs_aux", False) else None
        rec["aux_size"] = len(aux) if aux is not None else None
        t0 = time.perf_counter()
        mechanism.setup(engine, aux)
        sync(device)
        rec["setup_s"] = time.perf_counter() - t0
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, args.optim_cfg)
        state["optimizer"] = optimizer
        gen = torch.Generator(device=device).manual_seed(args.seed + 2)
        total = args.warmup + args.steps

        def one_step(i: int) -> None:
            ctx = StepContext(i, total, float(x.shape[0]), gen)
            res = mechanism.step(x, y, ctx)
            engine.set_grad(res.grad)
            optimizer.step()

        phase = "warmup"
        for i in range(args.warmup):
            one_step(i)
        sync(device)

        phase = "step"
        gc.collect()
        times = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            for i in range(args.warmup, total):
                sync(device)
                t0 = time.perf_counter()
                one_step(i)
                sync(device)
                times.append(time.perf_counter() - t0)
            peak = torch.cuda.max_memory_allocated(device)
            rec["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MiB
        else:
            trim_heap()
            base = rss_bytes() or 0
            with RssSampler(args.rss_interval) as sampler:
                for i in range(args.warmup, total):
                    t0 = time.perf_counter()
                    one_step(i)
                    times.append(time.perf_counter() - t0)
            peak = sampler.peak
            rec["rss_samples"] = sampler.samples
        ms = [t * 1e3 for t in times]
        rec.update(
            median_ms=statistics.median(ms),
            mean_ms=statistics.fmean(ms),
            min_ms=min(ms),
            max_ms=max(ms),
            step_ms=ms,
            baseline_mib=base / MiB,
            peak_mib=peak / MiB,
            peak_extra_mib=max(peak - base, 0) / MiB,
        )
    except Exception as e:  # noqa: BLE001 -- report, keep benchmarking
        rec.update(status="error", error=f"{phase}: {type(e).__name__}: {e}")
        log(f"  ! {mech_name} ({backend}) failed during {phase}:\n" + traceback.format_exc())
    finally:
        state.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def plan(args) -> list[tuple[str, str]]:
    """(mechanism, backend) pairs, nonprivate first."""
    names = args.mechanisms or sorted(MECHANISMS)
    names = ["nonprivate"] + [n for n in dict.fromkeys(names) if n != "nonprivate"]
    backends = args.backends or [args.backend]
    pairs = []
    for name in names:
        if name == "nonprivate":
            pairs.append((name, args.backend))  # mean gradient: the backend is unused
        elif "all" in args.backends_for or name in args.backends_for:
            pairs.extend((name, b) for b in backends)
        else:
            pairs.append((name, args.backend))
    return pairs


def run(args, device: torch.device, env: dict) -> list[dict]:
    overrides = parse_overrides(args.set)
    used: set[int] = set()
    records = []
    for model_name in args.models:
        in_shape = in_shape_of(model_name)
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randn(args.batch_size, *in_shape, generator=g).to(device)
        y = torch.randint(0, NUM_CLASSES, (args.batch_size,), generator=g).to(device)
        aux_cache: dict[str, AuxData] = {}

        def aux_fn(in_shape=in_shape, aux_cache=aux_cache) -> AuxData:
            if "aux" not in aux_cache:
                aux_cache["aux"] = random_aux(args.aux_size, in_shape, args.seed).to(device)
            return aux_cache["aux"]

        n_params = count_parameters(build_model(model_name, in_shape, NUM_CLASSES))
        log(f"== {model_name} ({n_params:,} parameters, input {in_shape}), batch {args.batch_size}")
        model_recs = []
        for mech_name, backend in plan(args):
            options, note = mechanism_options(mech_name, overrides, used)
            log(f"  {mech_name} [{backend}] {options or ''}")
            rec = {
                "model": model_name,
                "params": n_params,
                "in_shape": list(in_shape),
                "mechanism": mech_name,
                "backend": "-" if mech_name == "nonprivate" else backend,
                "batch_size": args.batch_size,
                "microbatch": args.microbatch,
                "steps": args.steps,
                "warmup": args.warmup,
                "noise_multiplier": NOISE_MULTIPLIER,
                "options": options,
                "note": note,
            }
            rec.update(
                bench_one(
                    model_name=model_name,
                    mech_name=mech_name,
                    backend=backend,
                    options=options,
                    x=x,
                    y=y,
                    aux_fn=aux_fn,
                    args=args,
                    device=device,
                )
            )
            if rec["status"] == "ok":
                log(f"    {rec['median_ms']:.1f} ms/step, +{rec['peak_extra_mib']:.1f} MiB")
            model_recs.append(rec)
        base = next(
            (r for r in model_recs if r["mechanism"] == "nonprivate" and r["status"] == "ok"), None
        )
        for r in model_recs:
            r["time_ratio"] = r["mem_ratio"] = None
            if base is not None and r["status"] == "ok":
                r["time_ratio"] = r["median_ms"] / base["median_ms"]
                if base["peak_extra_mib"] > 0:
                    r["mem_ratio"] = r["peak_extra_mib"] / base["peak_extra_mib"]
            r["env"] = env
        records.extend(model_recs)
        del x, y
        aux_cache.clear()
    unused = [
        f"{s + '.' if s else ''}{k}" for i, (s, k, _) in enumerate(overrides) if i not in used
    ]
    if unused:
        log(f"warning: --set keys matched no mechanism option: {', '.join(unused)}")
    return records


# ------------------------------------------------------------------ output
def _fmt(v, spec: str, suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec) + suffix


def markdown(records: list[dict], env: dict) -> str:
    lines = ["# dpsub benchmark: cost of each mechanism vs. non-private training", ""]
    lines += [
        f"- device: {env['device']} ({env['device_name']})",
        f"- torch {env['torch']}"
        + (f", opacus {env['opacus']}" if env.get("opacus") else "")
        + f", python {env['python']}",
        f"- CPUs: {env['cpu_count']} (torch threads: {env['torch_threads']})"
        + (f"; GPU: {env['gpu']} (CUDA {env['cuda']})" if env.get("gpu") else ""),
        f"- date: {env['date']}" + (f"; git {env['git']}" if env.get("git") else ""),
        f"- command: `{env['command']}`",
        f"- memory: {env['memory_method']}; extra = peak minus memory held just before the "
        "timed steps (model, data, optimizer and mechanism state)",
    ]
    if env["device"].startswith("cpu"):
        lines.append("- note: CPU memory is approximate (sampled RSS; allocator caching blurs it)")
    lines.append("")
    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        r0 = rows[0]
        lines += [
            f"## {model} ({r0['params']:,} params, input {'x'.join(map(str, r0['in_shape']))}), "
            f"batch {r0['batch_size']}, microbatch {r0['microbatch']}, "
            f"median of {r0['steps']} steps after {r0['warmup']} warmup",
            "",
            "| mechanism | backend | batch | ms/step (median) | time vs nonprivate "
            "| peak extra MiB | memory vs nonprivate | peak MiB (abs) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if r["status"] != "ok":
                err = str(r["error"]).replace("|", "\\|").replace("\n", " ")
                if len(err) > 160:
                    err = err[:157] + "..."
                lines.append(
                    f"| {r['mechanism']} | {r['backend']} | {r['batch_size']} "
                    f"| error: {err} | | | | |"
                )
                continue
            lines.append(
                f"| {r['mechanism']} | {r['backend']} | {r['batch_size']} "
                f"| {_fmt(r['median_ms'], '.1f')} | {_fmt(r['time_ratio'], '.2f', 'x')} "
                f"| {_fmt(r['peak_extra_mib'], '.1f')} | {_fmt(r['mem_ratio'], '.2f', 'x')} "
                f"| {_fmt(r['peak_mib'], '.1f')} |"
            )
        lines.append("")
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
    p.add_argument("--models", nargs="+", default=["mnist_cnn", "resnet20"], choices=sorted(MODELS))
    p.add_argument(
        "--mechanisms",
        nargs="+",
        default=None,
        help="mechanisms to run (default: every registered one); nonprivate is always included",
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--microbatch", type=int, default=None, help="default: the batch size")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--backend", default="vmap", choices=BACKENDS, help="per-example gradients")
    p.add_argument(
        "--backends",
        nargs="+",
        default=None,
        choices=BACKENDS,
        help="run the mechanisms of --backends-for once per backend (to compare them)",
    )
    p.add_argument(
        "--backends-for",
        nargs="+",
        default=["dpsgd"],
        help="mechanisms that --backends applies to ('all': every private mechanism)",
    )
    p.add_argument("--aux-size", type=int, default=2000, help="auxiliary examples (needs_aux)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="mechanism option override for every mechanism having KEY (MECH.KEY=VALUE: only MECH)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--rss-interval", type=float, default=0.002, help="CPU RSS sampling period (s)")
    p.add_argument("--out", type=Path, default=None, help="JSON output (list of records)")
    p.add_argument("--markdown", type=Path, default=None, help="Markdown output")
    p.add_argument(
        "--append",
        action="store_true",
        help="add to existing --out/--markdown files instead of overwriting them",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("need --batch-size >= 1, --steps >= 1, --warmup >= 0")
    args.microbatch = args.microbatch or args.batch_size
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but CUDA is not available")
        if device.index is not None:
            torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    if args.threads:
        torch.set_num_threads(args.threads)
    args.optim_cfg = load_optim_cfg()
    seed_all(args.seed)

    prog = sys.argv[0] if sys.argv[0].endswith("bench.py") else str(Path(__file__))
    env = environment(device, [os.path.relpath(prog), *argv])
    records = run(args, device, env)
    text = markdown(records, env)
    print(text, flush=True)
    if args.out:
        write_json(args.out, records, args.append)
        log(f"wrote {args.out}")
    if args.markdown:
        write_markdown(args.markdown, text, args.append)
        log(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
