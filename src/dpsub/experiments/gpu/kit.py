"""The GPU kit: one command that checks, measures and trains on a GPU machine (docs/gpu.md).

Steps, in order, each bounded in time (:data:`BOUNDS`) within the command's budget
(:data:`BUDGET_S`, under the device's 10-minute limit), each leaving its outputs under
``$OUT`` as it goes and packed into ``$OUT/<step>.tar`` when it ends:

a. ``check``: the packages (installed from ``.gpu/wheels`` when missing), CUDA, the data
   the later steps need (CIFAR-10 decoded from ``.gpu/data``); one line and exit 2 if
   anything is missing;
b. ``smoke``: ``pytest -m gpu tests/integration/test_gpu.py`` (tests/integration/test_gpu.py);
c. ``bench``: ``scripts/bench.py`` at the paper's GPU sizes, one process per table
   (:data:`BENCHES`), written as ``gpu_<name>.md`` / ``.json`` as each finishes;
d. ``cells``: table cells by priority, campaign after campaign (:mod:`dpsub.experiments.gpu.cells`:
   GEP Tables 5 and 6 reduced, the RGP head study, GEP Table 1 CIFAR-10 cpu-long then paper).

``tiny=True`` runs every step on the CPU at toy sizes (the test suite does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dpsub.experiments.gpu.stage import (
    AUX_FILE,
    DECODER,
    GPU_DIR,
    PACKED_AUX,
    PACKED_CIFAR,
    StageError,
    unpack_aux,
    unpack_cifar10,
)  # fmt: skip

REPO = Path(__file__).resolve().parents[4]
STEPS = ("check", "smoke", "bench", "cells")
#: the longest each step may take (s); every one under the 600-s command limit
BOUNDS = {"check": 120, "smoke": 180, "bench": 300, "cells": 560}
#: a step is skipped when less than this is left of the budget
MIN_S = {"check": 10, "smoke": 60, "bench": 60, "cells": 90}
BUDGET_S = 560  # the whole command: 40 s under the device's 10-minute limit
MARGIN_S = 15  # kept back for packing and the final log line
PACKAGES = ("hydra", "omegaconf", "opacus")

#: name -> scripts/bench.py arguments (the paper's GPU sizes)
BENCHES = {
    "resnet20_b1000": [
        "--models", "resnet20", "--batch-size", "1000", "--aux-size", "2000",
        "--mechanisms", "nonprivate", "dpsgd", "gep", "bgep", "--backends", "vmap", "ghost",
        "--set", "num_bases=1000", "--steps", "20", "--warmup", "2",
    ],
    "wrn28_4_b1000_rgp": [
        "--models", "wrn28_4", "--batch-size", "1000", "--microbatch", "250",
        "--mechanisms", "nonprivate", "rgp", "--backends", "vmap", "ghost",
        "--backends-for", "rgp", "--steps", "20", "--warmup", "2",
    ],
}  # fmt: skip
TINY_BENCHES = {
    "tiny": [
        "--models", "mnist_cnn", "--batch-size", "8", "--aux-size", "16",
        "--mechanisms", "nonprivate", "dpsgd", "gep", "--set", "num_bases=4",
        "--steps", "1", "--warmup", "0", "--memory-steps", "0", "--device", "cpu",
        "--threads", "1",
    ],
}  # fmt: skip


PARALLEL = 3  # gpu_run's default --parallel on a GPU (docs/gpu.md: measured 2026-11-28)


def parallel_of(requested: int | None, tiny: bool) -> int:
    """Cells at once: as asked, else 1 in ``--tiny`` (the CPU tests) and :data:`PARALLEL`."""
    return requested if requested is not None else 1 if tiny else PARALLEL


@dataclass
class Options:
    out: Path
    steps: tuple[str, ...] = STEPS
    budget_s: float = BUDGET_S
    tiny: bool = False
    root: Path = REPO  # where results/ and .gpu/ are (tests: a temporary folder)
    data_root: Path | None = None
    work: Path | None = None  # scratch outside the checkout (default: $TMPDIR/dpsub-gpu)
    gep_authors: Path | None = None
    max_cells: int | None = None
    interrupt_cells: bool = False  # tests: stop each cell at its first checkpoint
    campaigns: tuple[str, ...] | None = (
        None  # names in dpsub.experiments.gpu.cells.CAMPAIGNS (default: all)
    )
    parallel: int = 1  # cells trained at once on the one GPU (the CLI's default: PARALLEL)
    # beside each new cell's table overrides (cells.CELL_OVERRIDE_KEYS): one pass per batch
    cell_overrides: tuple[str, ...] = ("grads.microbatch=auto",)


@dataclass
class Kit:
    opts: Options
    start: float = field(default_factory=time.time)
    env: dict = field(default_factory=lambda: dict(os.environ))
    record: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        o = self.opts
        o.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(o.work or Path(os.environ.get("TMPDIR", "/tmp")) / "dpsub-gpu")
        self.work.mkdir(parents=True, exist_ok=True)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "src"), *filter(None, [self.env.get("PYTHONPATH")])]
        )
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.env.setdefault("WANDB_MODE", "disabled")
        self.data_root = o.data_root
        self.record = {"tiny": o.tiny, "steps": {}, "started": _now()}

    # ------------------------------------------------------------ plumbing
    def log(self, msg: str) -> None:
        line = f"[{time.time() - self.start:6.1f}s] {msg}"
        print(line, flush=True)
        with (self.opts.out / "gpu_run.log").open("a") as f:
            f.write(line + "\n")

    def step_dir(self, step: str) -> Path:
        d = self.opts.out / step
        d.mkdir(parents=True, exist_ok=True)
        return d

    def pack(self, step: str) -> None:
        """``$OUT/<step>/`` -> ``$OUT/<step>.tar`` (one file per step: 8 files come back)."""
        d = self.opts.out / step
        if not d.is_dir():
            return
        with tarfile.open(self.opts.out / f"{step}.tar", "w") as tar:
            for p in sorted(d.rglob("*")):
                if p.is_file():
                    tar.add(p, arcname=str(p.relative_to(d)))
        shutil.rmtree(d)

    def left(self) -> float:
        return self.opts.budget_s - (time.time() - self.start) - MARGIN_S

    def save_record(self) -> None:
        (self.opts.out / "gpu_run.json").write_text(json.dumps(self.record, indent=1) + "\n")

    def child(self, argv: list[str], log_path: Path, timeout: float, env: dict | None = None):
        """Run ``argv`` (its output into ``log_path``), killed with its group after ``timeout``."""
        with log_path.open("w") as f:
            f.write(f"$ {' '.join(argv)}\n")
            f.flush()
            proc = subprocess.Popen(
                argv, cwd=REPO, env=env or self.env, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                return proc.wait(timeout=max(timeout, 1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                f.write(f"\n[killed after {timeout:.0f} s]\n")
                return "timeout"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ----------------------------------------------------------------- a. check
def ensure_packages(kit: Kit) -> dict:
    """hydra, omegaconf, opacus importable: installed from ``.gpu/wheels`` if needed."""
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        wheels = sorted((kit.opts.root / GPU_DIR / "wheels").glob("*.whl"))
        if not wheels:
            raise StageError(
                f"check: {', '.join(missing)} not installed and no wheels in "
                f"{kit.opts.root / GPU_DIR / 'wheels'} (stage them: python scripts/gpu_run.py --stage)"
            )
        site = kit.work / "site"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--upgrade", "--target", str(site), *map(str, wheels)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise StageError(f"check: pip could not install the staged wheels: {r.stderr[-300:]}")
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        kit.env["PYTHONPATH"] = os.pathsep.join([str(site), kit.env["PYTHONPATH"]])
    versions = {}
    for p in PACKAGES:
        if importlib.util.find_spec(p) is None:
            raise StageError(f"check: {p} still not importable after installing the wheels")
        versions[p] = getattr(__import__(p), "__version__", "?")
    return versions


def ensure_data(kit: Kit) -> Path:
    """A data root holding ``cifar-10-batches-py/`` and the auxiliary images (for cells)."""
    root = Path(kit.data_root or os.environ.get("DPSUB_DATA") or kit.work / "data")
    gpu = kit.opts.root / GPU_DIR / "data"
    if not (root / "cifar-10-batches-py").is_dir():
        packed = gpu / PACKED_CIFAR
        if not (packed.is_file() and (gpu / DECODER).is_file()):
            raise StageError(
                f"check: CIFAR-10 not under {root} and not staged ({packed}): "
                "python scripts/gpu_run.py --stage, or --data-root PATH"
            )
        npz = unpack_cifar10(packed, kit.work / "cifar10_jpeg" / "cifar10_jpeg.npz")
        shutil.copy2(gpu / DECODER, npz.parent / DECODER)
        r = subprocess.run([sys.executable, str(npz.parent / DECODER), str(root)],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0:
            raise StageError(f"check: decoding CIFAR-10 failed: {r.stderr.strip()[-300:]}")
    if not (root / AUX_FILE).is_file():
        if not (gpu / PACKED_AUX).is_file():
            raise StageError(
                f"check: auxiliary images not found: {root / AUX_FILE}, {gpu / PACKED_AUX}"
            )
        unpack_aux(gpu / PACKED_AUX, root / AUX_FILE)
    return root


def device_name() -> str:
    """The accelerator's name (``cpu (<arch>)`` without one): every command records it."""
    import torch

    cuda = torch.cuda.is_available()
    return torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.machine()})"


def step_check(kit: Kit, bound: float) -> dict:
    info = {"packages": ensure_packages(kit), "python": platform.python_version()}
    import torch

    cuda = torch.cuda.is_available()
    info.update(torch=torch.__version__, cuda=cuda, cuda_version=torch.version.cuda)
    info["device"] = device_name()
    if not cuda and not kit.opts.tiny:
        raise StageError("check: no CUDA device (torch.cuda.is_available() is False); "
                         "on a CPU run the kit with --tiny")  # fmt: skip
    if "cells" in kit.opts.steps and not kit.opts.tiny:
        kit.data_root = ensure_data(kit)
        info["data_root"] = str(kit.data_root)
    (kit.step_dir("check") / "check.json").write_text(json.dumps(info, indent=1) + "\n")
    kit.log(f"check: {info['device']}, torch {info['torch']}, packages {info['packages']}")
    return {**info, "ok": True}


# ----------------------------------------------------------------- b. smoke
def step_smoke(kit: Kit, bound: float) -> dict:
    ensure_packages(kit)  # (a no-op after the check step)
    d = kit.step_dir("smoke")
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/integration/test_gpu.py", "-q", "-rA",
            "-p", "no:cacheprovider", f"--junitxml={d / 'junit.xml'}"]  # fmt: skip
    env = dict(kit.env)
    if kit.opts.tiny:  # the suite's own CPU stand-in: one quick test
        env["DPSUB_GPU_TESTS_ON_CPU"] = "1"
        argv += ["-k", "tiny"]
    rc = kit.child(argv, d / "pytest.log", bound, env)
    tail = (d / "pytest.log").read_text().strip().splitlines()[-1:]
    kit.log(f"smoke: exit {rc}: {tail[0] if tail else ''}")
    return {"exit": rc, "ok": rc == 0}


# ----------------------------------------------------------------- c. bench
def step_bench(kit: Kit, bound: float) -> dict:
    ensure_packages(kit)
    d = kit.step_dir("bench")
    end = time.time() + bound
    out = {}
    benches = TINY_BENCHES if kit.opts.tiny else BENCHES
    for name, args in benches.items():
        stem = f"gpu_{name}" if not kit.opts.tiny else f"cpu_{name}"
        argv = [sys.executable, "scripts/bench.py", *args, "--out", str(d / f"{stem}.json"),
                "--markdown", str(d / f"{stem}.md")]  # fmt: skip
        rc = kit.child(argv, d / f"{stem}.log", end - time.time())
        out[name] = rc
        kit.log(f"bench {name}: exit {rc}")
        if time.time() > end - 5:
            break
    ok = all(rc == 0 for rc in out.values())
    out["gep_authors"] = gep_authors(kit, d, end)
    kit.bench_ms = step_times(d)
    return {**out, "ok": ok}


def step_times(d: Path) -> dict[str, float]:
    """mechanism -> ms per step measured by the bench (vmap rows), for checkpoint spacing."""
    ms = {}
    for f in sorted(d.glob("*.json")):
        try:
            rows = json.loads(f.read_text())
        except ValueError:
            continue
        for r in rows if isinstance(rows, list) else []:
            if r.get("status") == "ok" and r.get("backend") in ("vmap", "-"):
                ms.setdefault(r["mechanism"], r["time_ms"])
    return ms


def gep_authors(kit: Kit, d: Path, end: float) -> str:
    """Time one GEP step of the authors' code if ``--gep-authors`` gave a checkout."""
    from dpsub.experiments.gpu import authors

    note = authors.run(kit, d, end)
    kit.log(f"gep authors: {note}")
    return note


# ----------------------------------------------------------------- d. cells
def step_cells(kit: Kit, bound: float) -> dict:
    from dpsub.experiments.gpu.cells import DEFAULT_ORDER, CellRunner, queue
    from dpsub.experiments.gpu.load import GpuLoad

    ensure_packages(kit)
    if kit.data_root is None and not kit.opts.tiny:
        kit.data_root = ensure_data(kit)
    order = kit.opts.campaigns or DEFAULT_ORDER

    def plan() -> list:  # planned again after every cell (tuning grids bring their picks)
        jobs = queue(kit.opts.root, tiny=kit.opts.tiny, campaigns=order)
        return jobs[: kit.opts.max_cells] if kit.opts.max_cells is not None else jobs

    ms = getattr(kit, "bench_ms", {})
    runner = CellRunner(
        root=kit.opts.root, tar_path=kit.opts.out / "cells.tar", env=kit.env,
        deadline=time.time() + bound, data_root=str(kit.data_root) if kit.data_root else None,
        log=kit.log, work=kit.work, parallel=kit.opts.parallel,
        overrides=kit.opts.cell_overrides,
    )  # fmt: skip
    if kit.opts.tiny:
        runner.checkpoint_every, runner.grace_s, runner.min_cell_s, runner.poll_s = 1, 20, 5, 0.05
        runner.interrupt_at_checkpoint = kit.opts.interrupt_cells
    elif ms:  # a checkpoint every ~3 minutes at the measured speed of the slowest mechanism
        runner.checkpoint_every = max(10, int(180_000 / max(ms.values())))
    with GpuLoad() as load:  # is --parallel too low (an idle card) or too high (its memory)?
        done = runner.run(plan)
    kit.log(f"cells: {load.line()}")
    jobs = plan()
    left = [j.name for j in jobs if not j.finished]
    kit.log(f"cells: {len(jobs) - len(left)} of {len(jobs)} finished; ran {done}")
    ok = all(r["status"] != "failed" for r in done)
    return {"ran": done, "unfinished": len(left), "ok": ok, "gpu_load": load.summary()}


STEP_FNS = {"check": step_check, "smoke": step_smoke, "bench": step_bench, "cells": step_cells}


def run_kit(opts: Options) -> int:
    """Run the chosen steps in order; 0 when every step that ran succeeded, 2 on a bad set-up."""
    kit = Kit(opts)
    kit.record["device"] = device_name()
    kit.log(f"dpsub GPU kit: steps {', '.join(opts.steps)}; budget {opts.budget_s:.0f} s"
            + (" (tiny, CPU)" if opts.tiny else ""))  # fmt: skip
    status = 0
    for step in STEPS:
        if step not in opts.steps:
            continue
        bound = min(BOUNDS[step], kit.left())
        if bound < (5 if opts.tiny else MIN_S[step]):
            kit.log(f"{step}: skipped ({kit.left():.0f} s left of the budget)")
            kit.record["steps"][step] = {"status": "skipped"}
            continue
        t0 = time.time()
        try:
            result = STEP_FNS[step](kit, bound)
        except StageError as e:
            print(f"gpu_run: {e}", file=sys.stderr, flush=True)
            kit.log(f"{step}: FAILED: {e}")
            kit.record["steps"][step] = {"status": "failed", "error": str(e)}
            kit.pack(step)
            kit.save_record()
            return 2
        ok = bool(result.get("ok", True))
        status = status or (0 if ok else 1)
        info = {k: v for k, v in result.items() if k != "packages"}
        kit.record["steps"][step] = {"status": "ok" if ok else "errors",
                                     "seconds": round(time.time() - t0, 1), **info}  # fmt: skip
        kit.pack(step)
        kit.save_record()
    kit.log(f"done in {time.time() - kit.start:.0f} s; harvest with: "
            "python scripts/gpu_run.py --harvest <the folder $OUT came back to>")  # fmt: skip
    return status
