"""Table cells on a GPU machine: a priority queue of campaigns, run across commands and machines.

A campaign is a paper table in one setting (``conf/paper/<table>.yaml``), optionally tuned:
its tuning grid first (extended at its edges as the table says), then the picks at every
seed. The queue (:data:`CAMPAIGNS`, in :data:`DEFAULT_ORDER`): GEP's stage-0 scaling check,
GEP Table 1's CIFAR-10 row noise-matched to its paper cell (``sim-eps2``, tuned; issue 37)
and its attribution runs, the augmentation-multiplicity study (``augmult-cifar10``
``sim-eps8``, tuned; issue 42) and its GEP arm (``sim-eps8-gep``), De et al. 2022's DP-SGD
recipe (``de2022-cifar10``: augmult, EMA, WS; issue 42), GEP Table 1 in the paper setting,
then GEP Tables 5 and 6 in their ``reduced`` setting, the RGP head study of issue 27
(``rgp-head-cifar10``, tuned), the cadence study (``gep-cadence``, tuned), and GEP Table 1's
CIFAR-10 row in its ``cpu-long`` setting (tuned).
Within a table: seed 0 of every cell first; within a seed epsilon 8, then 2, then 5; within
an epsilon GP (DP-SGD), then GEP, then B-GEP. The queue is planned again after every cell,
so a finished tuning grid brings its extension or its picks into the same command.

Each cell is an ordinary table job (:func:`dpsub.experiments.tables.plan_jobs`: its run dir is where
``scripts/reproduce.py`` puts it, ``results/tables/<table>/<setting>/<variant>/<cell>``),
trained by ``python -m dpsub.cli.train`` in a child process that checkpoints every
``checkpoint_every`` steps, ``parallel`` cells at a time (one device: a small model's
launch-bound steps interleave), each started with the runner's ``overrides`` (how it is
computed, never what it releases: :data:`CELL_OVERRIDE_KEYS`). After every new checkpoint the runner packs the cells it touched
into two files of ``$OUT``: ``cells.tar`` holds their small files and never a checkpoint (so
a finished cell always comes back), ``ckpt.tar`` the checkpoints of unfinished cells that fit
one returned file (16 MiB). It sends SIGTERM before its deadline (the trainer finishes the
step, checkpoints and exits), so a cell continues exactly where it stopped: ``--harvest``
puts unfinished cells (with their checkpoint) into ``.gpu/cells/``, which travels with the
next command, and finished ones (without it) into ``results/tables/``.

A checkpoint too large to come back (GEP's basis at k = 1,000 on ResNet20: 360 MB) comes
back *light* when it was written at a clean stop (the runner's SIGTERM): without the
mechanism's public state (the basis), which the resumed run recomputes
(:func:`dpsub.training.checkpoint.light_copy`; the run records it in ``light_resumes``).
A checkpoint that cannot come back even so means that cell must finish within the command:
the runner then skips a sibling cell (same folder, same mechanism) when the time a finished
sibling took exceeds the time left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpsub.experiments.gpu.stage import GPU_DIR, OUT_MAX_FILE, MiB
from dpsub.rundir import FINGERPRINT_KEY, RunDir

EPSILON_ORDER = (8, 2, 5)
MECHANISM_ORDER = ("dpsgd", "gep", "bgep")
CKPT, SUMMARY = "checkpoint.pt", "summary.json"
CKPT_TAR = "ckpt.tar"  # beside cells.tar: the checkpoints that fit one returned file

#: the tiny setting (CPU tests): synthetic MNIST-shaped data, a small model and subspace
TINY_OVERRIDES = {
    "all": [
        "dataset=synthetic", "dataset.synthetic.n_train=64", "dataset.synthetic.n_test=32",
        "train.batch_size=16", "train.epochs=10", "grads.microbatch=16", "train.eval_every=0",
        "train.log_every=20", "device=cpu",
    ],
    "dpsgd": ["dataset.synthetic.channels=1", "dataset.synthetic.size=28", "model=mnist_cnn"],
    "gep": ["dataset.synthetic.channels=1", "dataset.synthetic.size=28", "model=mnist_cnn",
            "aux=gaussian", "aux.num_samples=16", "mechanism.num_bases=4"],
    "bgep": ["dataset.synthetic.channels=1", "dataset.synthetic.size=28", "model=mnist_cnn",
             "aux=gaussian", "aux.num_samples=16", "mechanism.num_bases=4"],
    # the experiment's own WRN-10-1 (its train_size subset is dropped: synthetic data)
    "rgp": ["dataset.synthetic.channels=3", "dataset.synthetic.size=32", "~dataset.train_size",
            "mechanism.warmup_steps=2"],
}  # fmt: skip


@dataclass(frozen=True)
class Campaign:
    """A table in one setting; ``tune``: its tuning grid, then the picks at every seed."""

    table: str
    setting: str
    tune: bool = False


#: name -> campaign, in the GPU command's default order: GEP in its own regime first (the
#: noise-matched table, then the paper's exact batch 1,000, which checks the scaling rule at
#: full length: issue 37), then the short campaigns
CAMPAIGNS = {
    # GEP's stage-0 scaling check first: it decides whether its sim-eps2 cells may stay at
    # B = 128 (about 30 s a step on a CPU core, a few GPU-minutes for all of it)
    "gep1-cifar10-stage0": Campaign("gep1-cifar10", "stage0"),
    "gep1-cifar10-sim-eps2": Campaign("gep1-cifar10", "sim-eps2", tune=True),
    "gep1-cifar10-attribution": Campaign("gep1-cifar10", "attribution"),
    # issue 42's CPU study of K views (DP-SGD; ~11 CPU-hours left, minutes here)
    "augmult-sim-eps8": Campaign("augmult-cifar10", "sim-eps8", tune=True),
    # its GEP arm (K = 1 now, K* once DP-SGD's grids settle): ~1.6 CPU-hours a run
    "augmult-sim-eps8-gep": Campaign("augmult-cifar10", "sim-eps8-gep", tune=True),
    "de2022": Campaign("de2022-cifar10", "paper"),  # the DP-SGD recipe (issue 42)
    "gep1-cifar10-paper": Campaign("gep1-cifar10", "paper"),
    "gep5-aux": Campaign("gep5-aux", "reduced"),
    "gep6-anchors": Campaign("gep6-anchors", "reduced"),
    "rgp-head": Campaign("rgp-head-cifar10", "reduced", tune=True),
    "gep-cadence": Campaign("gep-cadence", "paper", tune=True),
    "gep1-cifar10-cpu-long": Campaign("gep1-cifar10", "cpu-long", tune=True),
}
DEFAULT_ORDER = tuple(CAMPAIGNS)


def priority(job) -> tuple:
    eps, mech = job.cell.get("epsilon"), job.cell["mechanism"]
    rank = lambda seq, v: seq.index(v) if v in seq else len(seq)  # noqa: E731
    return (job.variant != "tune", job.seed, rank(EPSILON_ORDER, eps), rank(MECHANISM_ORDER, mech))


def tiny_setting(table, setting: str):
    """The CPU test's stand-in for ``setting``: its cells at one seed, toy data and model, a
    one-point tuning grid; the axis overrides dropped (no data files in a test)."""
    from dpsub.experiments import tables

    base = table.setting(setting)
    tune = table.tune_of(setting)
    if tune is not None:
        clip = {m: c[:1] for m, c in tune.clip.items()}
        lr = {m: tune.lrs_of(m)[:1] for m in clip}
        tune = tables.Tune(16, 0, lr, clip, extend=0)
    blank = {a: {} for a in {**table.overrides, **base.axis_overrides}}
    return tables.Setting(
        "tiny", "CPU test of the GPU kit", TINY_OVERRIDES, base.axes, [0], blank, tune
    )


def campaign_jobs(c: Campaign, root: Path, tiny: bool = False, passthrough=()) -> list:
    """The campaign's jobs in priority order (finished ones included): the paper variant,
    or the tuned picks known so far (a cell's pick exists once its whole grid is done) then
    the tuning grid, so a mechanism's arm is finished before more of another's is tuned."""
    from dpsub.experiments import tables

    table, setting = tables.load_table(c.table), c.setting
    if tiny:
        table.settings["tiny"], setting = tiny_setting(table, setting), "tiny"
    out, kw = Path(root) / "results" / "tables", {"passthrough": list(passthrough)}
    if not c.tune:
        return sorted(tables.plan_jobs(table, setting, out, "paper", **kw), key=priority)
    tune = sorted(tables.plan_jobs(table, setting, out, "tune", **kw), key=priority)
    picks = {cid: p["overrides"] for cid, p in tables.pick_best(table, tune).items()}
    tuned = tables.plan_jobs(table, setting, out, "tuned", picks=picks, **kw)
    return sorted(tuned, key=priority) + tune


def queue(
    root: Path, tiny: bool = False, passthrough: list[str] = (), campaigns=DEFAULT_ORDER
) -> list:
    """Every job of the chosen campaigns in priority order (finished ones included)."""
    unknown = [c for c in campaigns if c not in CAMPAIGNS]
    if unknown:
        raise ValueError(f"unknown campaign {unknown[0]!r} (known: {', '.join(CAMPAIGNS)})")
    return [j for c in campaigns for j in campaign_jobs(CAMPAIGNS[c], root, tiny, passthrough)]


def rel(path: Path, root: Path) -> Path:
    return Path(path).resolve().relative_to(Path(root).resolve())


def restore_carried(job, root: Path) -> bool:
    """Put a cell in progress that travelled in ``.gpu/cells`` back in its run dir."""
    carried = Path(root) / GPU_DIR / "cells" / rel(job.dir, root)
    if (carried / CKPT).is_file() and not (job.dir / CKPT).is_file():
        shutil.copytree(carried, job.dir, dirs_exist_ok=True)
        return True
    return False


#: keys a cell may be given on a GPU beside its table's overrides: how a run is computed,
#: never what it releases; each is in dpsub.training.checkpoint.RESUME_MAY_CHANGE, so a cell
#: finished (or parked) on a GPU is the same job to a CPU harness and resumes there
CELL_OVERRIDE_KEYS = ("grads.microbatch", "train.eval_batch_size", "train.log_every")


def check_cell_overrides(overrides) -> list[str]:
    """``overrides`` if each is ``key=value`` with a key of :data:`CELL_OVERRIDE_KEYS`."""
    for o in overrides:
        if "=" not in o or o.split("=", 1)[0] not in CELL_OVERRIDE_KEYS:
            raise ValueError(f"cell override {o!r}: only {', '.join(CELL_OVERRIDE_KEYS)} may "
                             "differ from the table's (they cannot change what a run releases)")  # fmt: skip
    return list(overrides)


@dataclass
class Running:
    """A cell's child process and what the runner watches of it."""

    job: object
    proc: subprocess.Popen
    argv: list[str]
    t0: float
    restored: bool
    step0: int = 0  # the last step logged before it started
    seen: int | None = None  # mtime of the last checkpoint packed
    stopped_at: float | None = None  # when SIGTERM was sent


@dataclass
class CellRunner:
    """Runs cells until ``deadline`` (time.time()), ``parallel`` at a time, packing them into
    ``tar_path``."""

    root: Path
    tar_path: Path
    env: dict
    deadline: float
    data_root: str | None = None
    # a GEP cell at k = 1,000 writes 360 MB a checkpoint that cannot come back unless clean:
    # every 250 steps (~20 s on a GPU) costs it a few percent; a stop always writes one
    checkpoint_every: int = 250
    grace_s: float = 45.0  # for the step in flight and the checkpoint after SIGTERM
    min_cell_s: float = 60.0  # do not start a cell with less time than this left
    interrupt_at_checkpoint: bool = False  # tests: SIGTERM at a cell's first checkpoint
    max_failures: int = (
        3  # a failed cell (e.g. its data not staged) is skipped; this many in a row stop
    )
    poll_s: float = 1.0
    log: Callable[[str], None] = print
    work: Path | None = None  # where the children's output goes (default: beside the tar)
    parallel: int = 1  # cells trained at once (one device: their small kernels interleave)
    overrides: tuple[str, ...] = ()  # for cells started here (check_cell_overrides)

    def __post_init__(self) -> None:
        self.touched: list[Path] = []
        self.log_file = Path(self.work or self.tar_path.parent) / "cells.log"
        self.ckpt_path = self.tar_path.with_name(CKPT_TAR)
        self.took: dict[tuple, float] = {}  # sibling key -> seconds of a cell run start to end
        self.too_big: dict[tuple, int] = {}  # sibling key -> bytes of a checkpoint left here
        self.light: dict[Path, tuple[int, Path | None]] = {}  # checkpoint -> (mtime, copy)
        self.mid_run: set[Path] = set()  # big checkpoints not (yet) written at a clean stop
        self.overrides = tuple(check_cell_overrides(self.overrides))
        self.child_logs: list[Path] = []

    def argv(self, job) -> list[str]:
        base = [sys.executable, "-m", "dpsub.cli.train"]
        keep = [f"train.checkpoint_every={self.checkpoint_every}"]
        if self.data_root:
            keep.append(f"data.root={self.data_root}")
        if RunDir(job.dir).started:  # (stopped before its first checkpoint: from step 0)
            return [*base, f"resume={job.dir}", *keep]
        ov = job.hydra_overrides()
        return [*base, *ov, *self.overrides, "logger=disabled", "train.progress=false", *keep]

    def run(self, jobs) -> list[dict]:
        """Run the unfinished jobs in order while time is left, ``parallel`` at a time; one
        record per job run. ``jobs``: a list, or a function giving the queue (planned again
        after every cell: a finished tuning grid brings its picks), each job run at most once."""
        plan = jobs if callable(jobs) else (lambda: jobs)
        self.out, self.tried, self.failed, self.closed = [], set(), 0, False
        active: list[Running] = []
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.write_text("")
        self._fill(plan, active)
        while active:
            time.sleep(self.poll_s)
            for r in list(active):
                self._poll(r)
                if r.proc.poll() is not None:
                    active.remove(r)
                    self._finish(r)
                    self._fill(plan, active)
        return self.out

    def _fill(self, plan: Callable[[], list], active: list[Running]) -> None:
        """Start the next unfinished jobs until ``parallel`` run (or none is left to start)."""
        while not self.closed and len(active) < self.parallel:
            job = next((j for j in plan() if not j.finished and j.dir not in self.tried), None)
            if job is None:  # (running jobs are tried ones)
                return
            self.tried.add(job.dir)
            if self.deadline - time.time() < self.min_cell_s:
                self.log(f"cells: {self.deadline - time.time():.0f} s left, stopping the queue")
                self.closed = True
                return
            why = self.cannot_finish(job)
            if why:
                self.log(f"cells: skip {job.name}: {why}")
                continue
            active.append(self._start(job, restore_carried(job, self.root)))

    def cannot_finish(self, job) -> str | None:
        """Why ``job`` would be lost here: its checkpoint cannot come back and a finished
        sibling took longer than the time left (``None``: start it)."""
        key, left = sibling_key(job.dir), self.deadline - time.time() - self.grace_s
        took, size = self.took.get(key), self.too_big.get(key)
        if took is None or size is None or took <= left:
            return None
        return (f"a sibling took {took:.0f} s, {max(left, 0):.0f} s are left, and its "
                f"checkpoint ({size / MiB:.0f} MiB) cannot come back")  # fmt: skip

    def _start(self, job, restored: bool) -> Running:
        argv = self.argv(job)
        log = self.log_file.with_name(f"cell-{len(self.child_logs):02d}.log")
        self.child_logs.append(log)
        verb = "resume" if "resume=" in argv[3] else "start"
        self.log(f"cells: {verb} {rel(job.dir, self.root)} (output: {log.name})")
        self.touched.append(job.dir)
        env = dict(self.env)
        if self.parallel > 1 and "OMP_NUM_THREADS" not in env:  # the cores shared out
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.parallel))
        with self.log_file.open("a") as f:
            f.write(f"\n$ {' '.join(argv)}  > {log.name}\n")
        with log.open("w") as f:
            proc = subprocess.Popen(
                argv, cwd=Path(__file__).resolve().parents[4], env=env,
                stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return Running(job, proc, argv, time.time(), restored, logged_step(job.dir))

    def _poll(self, r: Running) -> None:
        """Pack a new checkpoint; SIGTERM at the deadline (or, in tests, the first checkpoint),
        SIGKILL ``grace_s`` later."""
        ck = r.job.dir / CKPT
        mtime = ck.stat().st_mtime_ns if ck.is_file() else None
        if mtime is not None and mtime != r.seen:
            r.seen = mtime
            self.pack()
            if self.interrupt_at_checkpoint and r.stopped_at is None:
                r.stopped_at = self._signal(r.proc, signal.SIGTERM)
        if r.stopped_at is None and time.time() > self.deadline - self.grace_s:
            r.stopped_at = self._signal(r.proc, signal.SIGTERM)
        if r.stopped_at is not None and time.time() > r.stopped_at + self.grace_s:
            self._signal(r.proc, signal.SIGKILL)

    def _finish(self, r: Running) -> None:
        """Record a child that ended: finished | interrupted (checkpointed) | failed."""
        self.pack()
        rc, job = r.proc.returncode, r.job
        if job.finished and rc == 0:
            status = "finished"
            if "resume=" not in r.argv[3]:  # a whole run: what a sibling from step 0 takes
                self.took[sibling_key(job.dir)] = time.time() - r.t0
        elif (job.dir / CKPT).is_file() and rc in (0, 128 + signal.SIGTERM):
            status = "interrupted"
        else:
            status = "failed"
            self.log(f"cells: {job.name} failed (exit {rc}); see its output")
        seconds, steps = time.time() - r.t0, logged_step(job.dir) - r.step0
        self.out.append({"cell": job.name, "status": status, "restored": r.restored,
                         "seconds": round(seconds, 1), "steps": steps,  # (start-up included)
                         "ms_per_step": round(1000 * seconds / steps, 1) if steps > 0 else None,
                         "parallel": self.parallel})  # fmt: skip
        self.failed = self.failed + 1 if status == "failed" else 0
        if self.failed >= self.max_failures and not self.closed:  # reported, not retried
            self.log(f"cells: {self.failed} cells failed in a row, stopping the queue")
            self.closed = True

    def _signal(self, proc: subprocess.Popen, sig: int) -> float:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        return time.time()

    def pack(self) -> None:
        """``cells.tar``: every touched run dir without its checkpoint, and the cells log;
        ``ckpt.tar``: the unfinished cells' checkpoints that fit one returned file."""
        small, ckpts = [], []
        for d in dict.fromkeys(self.touched):
            for p in sorted(d.rglob("*")) if d.is_dir() else []:
                if p.is_file() and p.suffix != ".tmp":  # (a file being written: next time)
                    (ckpts if p.name == CKPT else small).append(p)
        members = [(p, str(rel(p, self.root))) for p in small]
        for log in (self.log_file, *self.child_logs):
            if log.is_file():
                members.append((log, log.name))
        write_tar(self.tar_path, members)
        travel = [(src, str(rel(p, self.root))) for p, src in self.travelling(ckpts)]
        if travel:
            write_tar(self.ckpt_path, travel)
        else:
            self.ckpt_path.unlink(missing_ok=True)

    def travelling(self, ckpts: list[Path]) -> list[tuple[Path, Path]]:
        """(checkpoint, the file sent for it: itself or its light copy), latest cell first,
        while the tar stays within one returned file."""
        out, total = [], tarfile.RECORDSIZE  # the end blocks, padded to a whole record
        for p in reversed(ckpts):
            if (p.parent / SUMMARY).is_file():
                continue
            src = p if self._cost(p) <= OUT_MAX_FILE - tarfile.RECORDSIZE else self.light_of(p)
            if src is not None and total + self._cost(src) <= OUT_MAX_FILE:
                out.append((p, src))
                total += self._cost(src)
                continue
            if src is None and p not in self.mid_run:
                key = sibling_key(p.parent)
                if key not in self.too_big:
                    self.log(f"cells: {p.parent.name}: its checkpoint ({p.stat().st_size / MiB:.0f}"
                             " MiB) is too large to come back; the cell must finish here")  # fmt: skip
                self.too_big[key] = p.stat().st_size
        return out

    @staticmethod
    def _cost(p: Path) -> int:
        return 512 + -(-p.stat().st_size // 512) * 512

    def light_of(self, p: Path) -> Path | None:
        """A light copy of checkpoint ``p`` (cached by its mtime), or None: too big even so,
        or not written at a clean stop (then in ``self.mid_run``: the stop's may still)."""
        from dpsub.training.checkpoint import checkpoint_is_clean

        mtime = p.stat().st_mtime_ns
        cached = self.light.get(p)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        self.mid_run.discard(p)
        try:
            clean = checkpoint_is_clean(p)
        except Exception:  # not a readable checkpoint (e.g. a test's stand-in): sent whole or not
            clean = None
        if clean is False:
            self.mid_run.add(p)
            return None
        dest = self._write_light(p) if clean else None
        self.light[p] = (mtime, dest)
        return dest

    def _write_light(self, p: Path) -> Path | None:
        from dpsub.training.checkpoint import light_copy

        dest = Path(self.work or self.tar_path.parent) / "light" / rel(p, self.root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dropped = light_copy(p, dest)
        if not dropped or self._cost(dest) + tarfile.RECORDSIZE > OUT_MAX_FILE:
            return None
        self.log(f"cells: {p.parent.name}: its checkpoint ({p.stat().st_size / MiB:.0f} MiB)"
                 f" comes back light ({dest.stat().st_size / MiB:.1f} MiB, without"
                 f" {', '.join(dropped)}: recomputed on resume)")  # fmt: skip
        return dest


def logged_step(run_dir: Path) -> int:
    """The last step in the run's ``metrics.jsonl`` (logged every ``train.log_every``), or 0."""
    import json

    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


def sibling_key(run_dir: Path) -> tuple:
    """Cells that cost about the same: one folder (table, setting, variant), one mechanism."""
    return (Path(run_dir).parent, Path(run_dir).name.split(",")[0])


def write_tar(path: Path, members: list[tuple[Path, str]]) -> None:
    """Atomically; a file the running trainer replaced meanwhile is left for the next pack."""
    tmp = path.with_name(path.name + ".part")
    with tarfile.open(tmp, "w") as tar:
        for p, arcname in members:
            try:
                tar.add(p, arcname=arcname)
            except FileNotFoundError:
                continue
    os.replace(tmp, path)


def harvest_cells(tar_path: Path, root: Path, ckpt_tar: Path | None = None) -> list[str]:
    """Finished cells -> ``results/tables/...`` (no checkpoint); unfinished -> ``.gpu/cells``
    with their checkpoint from ``ckpt_tar`` (or, in the kit's first format, from ``tar_path``);
    an unfinished cell whose checkpoint did not come back is dropped: it restarts."""
    from dpsub.experiments.gpu.harvest import safe_members

    root = Path(root)
    written = []
    with tarfile.open(tar_path) as tar:
        members = safe_members(tar)
        dirs = {Path(m.name).parent for m in members if m.name.startswith("results/")}
        for d in sorted(dirs):
            summary = next((m for m in members if Path(m.name) == d / SUMMARY), None)
            done = summary is not None
            dest = root / d if done else root / GPU_DIR / "cells" / d
            clash = done and _another_run(root / d / SUMMARY, tar.extractfile(summary).read())
            if clash:  # a CPU lane finished it too: the one here stays, this one is set aside
                dest = root / GPU_DIR / "conflicts" / d
            shutil.rmtree(root / GPU_DIR / "cells" / d, ignore_errors=True)  # older state
            for m in members:
                if Path(m.name).parent != d or (
                    done and Path(m.name).name in (CKPT, FINGERPRINT_KEY)
                ):
                    continue
                dest.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(dest / Path(m.name).name, "wb") as out:
                    shutil.copyfileobj(src, out)
            state = "finished" if done else "in progress"
            if clash:
                state = (f"finished, but {d} already holds another finished run of this cell "
                         "(kept; settle by hand), this one set aside")  # fmt: skip
            if not done and not (dest / CKPT).is_file() and not _extract(ckpt_tar, d / CKPT, dest):
                shutil.rmtree(dest, ignore_errors=True)
                state = "in progress, its checkpoint did not come back (it restarts)"
            written.append(f"{state}: {dest}")
    return written


def _another_run(summary: Path, incoming: bytes) -> bool:
    """Whether ``summary`` exists and is not the incoming run's (another finished run)."""
    return summary.is_file() and summary.read_bytes() != incoming


def _extract(tar_path: Path | None, name: Path, dest: Path) -> bool:
    """Copy the member ``name`` of ``tar_path`` into ``dest``; False when it is not there."""
    from dpsub.experiments.gpu.harvest import safe_members

    if tar_path is None or not Path(tar_path).is_file():
        return False
    with tarfile.open(tar_path) as tar:
        m = next((m for m in safe_members(tar) if Path(m.name) == name), None)
        if m is None:
            return False
        with tar.extractfile(m) as src, open(dest / name.name, "wb") as out:
            shutil.copyfileobj(src, out)
    return True
