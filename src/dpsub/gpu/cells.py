"""Table cells on a GPU machine: a priority queue, run across commands and machines.

The queue is GEP Table 1's CIFAR-10 row (``conf/paper/gep1-cifar10.yaml``) in the paper
setting: seed 0 of every cell first; within a seed epsilon 8, then 2, then 5; within an
epsilon GP (DP-SGD), then GEP, then B-GEP. Each cell is an ordinary table job
(:func:`dpsub.tables.plan_jobs`: its run dir is where ``scripts/reproduce.py`` puts it,
``results/tables/gep1-cifar10/paper/paper/<cell>,seed=<s>``), trained by ``python -m
dpsub.train`` in a child process that checkpoints every ``checkpoint_every`` steps. The
runner packs the cells it touched into ``$OUT/cells.tar`` after every new checkpoint, and
sends SIGTERM before its deadline (the trainer finishes the step, checkpoints and exits), so
a cell continues exactly where it stopped: ``--harvest`` puts unfinished cells (with their
checkpoint) into ``.gpu/cells/``, which travels with the next command, and finished ones
(without it) into ``results/tables/``.
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

from dpsub.gpu.stage import GPU_DIR

TABLE = "gep1-cifar10"
EPSILON_ORDER = (8, 2, 5)
MECHANISM_ORDER = ("dpsgd", "gep", "bgep")
CKPT, CKPT_TMP, SUMMARY = "checkpoint.pt", "checkpoint.tmp", "summary.json"

#: the tiny setting (CPU tests): synthetic MNIST-shaped data, a small model and subspace
TINY_OVERRIDES = {
    "all": [
        "dataset=synthetic", "dataset.synthetic.n_train=64", "dataset.synthetic.n_test=32",
        "dataset.synthetic.channels=1", "dataset.synthetic.size=28", "model=mnist_cnn",
        "train.batch_size=16", "train.epochs=10", "grads.microbatch=16", "train.eval_every=0",
        "train.log_every=20", "device=cpu",
    ],
    "gep": ["aux=gaussian", "aux.num_samples=16", "mechanism.num_bases=4"],
    "bgep": ["aux=gaussian", "aux.num_samples=16", "mechanism.num_bases=4"],
}  # fmt: skip


def priority(job) -> tuple:
    eps, mech = job.cell["epsilon"], job.cell["mechanism"]
    rank = lambda seq, v: seq.index(v) if v in seq else len(seq)  # noqa: E731
    return (job.seed, rank(EPSILON_ORDER, eps), rank(MECHANISM_ORDER, mech))


def queue(root: Path, tiny: bool = False, passthrough: list[str] = ()) -> list:
    """Every job of the table in priority order (finished ones included)."""
    from dpsub import tables

    table = tables.load_table(TABLE)
    setting = "paper"
    if tiny:
        setting = "tiny"
        table.settings["tiny"] = tables.Setting(
            "tiny", "CPU test of the GPU kit", TINY_OVERRIDES, seeds=[0]
        )
    jobs = tables.plan_jobs(
        table, setting, Path(root) / "results" / "tables", "paper", passthrough=list(passthrough)
    )
    return sorted(jobs, key=priority)


def rel(path: Path, root: Path) -> Path:
    return Path(path).resolve().relative_to(Path(root).resolve())


def restore_carried(job, root: Path) -> bool:
    """Put a cell in progress that travelled in ``.gpu/cells`` back in its run dir."""
    carried = Path(root) / GPU_DIR / "cells" / rel(job.dir, root)
    if (carried / CKPT).is_file() and not (job.dir / CKPT).is_file():
        shutil.copytree(carried, job.dir, dirs_exist_ok=True)
        return True
    return False


@dataclass
class CellRunner:
    """Runs cells until ``deadline`` (time.time()), packing them into ``tar_path``."""

    root: Path
    tar_path: Path
    env: dict
    deadline: float
    data_root: str | None = None
    checkpoint_every: int = 50
    grace_s: float = 45.0  # for the step in flight and the checkpoint after SIGTERM
    min_cell_s: float = 60.0  # do not start a cell with less time than this left
    interrupt_at_checkpoint: bool = False  # tests: SIGTERM at a cell's first checkpoint
    poll_s: float = 1.0
    log: Callable[[str], None] = print
    work: Path | None = None  # where the children's output goes (default: beside the tar)

    def __post_init__(self) -> None:
        self.touched: list[Path] = []
        self.log_file = Path(self.work or self.tar_path.parent) / "cells.log"

    def argv(self, job) -> list[str]:
        base = [sys.executable, "-m", "dpsub.train"]
        keep = [f"train.checkpoint_every={self.checkpoint_every}"]
        if self.data_root:
            keep.append(f"data.root={self.data_root}")
        if (job.dir / CKPT).is_file():
            return [*base, f"resume={job.dir}", *keep]
        ov = job.hydra_overrides()
        return [*base, *ov, "logger=disabled", "train.progress=false", *keep]

    def run(self, jobs: list) -> list[dict]:
        """Run the unfinished ``jobs`` in order while time is left; one record per job run."""
        out = []
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.write_text("")
        for job in jobs:
            if job.finished:
                continue
            if self.deadline - time.time() < self.min_cell_s:
                self.log(f"cells: {self.deadline - time.time():.0f} s left, stopping the queue")
                break
            restored = restore_carried(job, self.root)
            status = self.run_one(job)
            out.append({"cell": job.name, "status": status, "restored": restored})
            if status == "failed":
                break  # a failure is reported, not retried in a loop
        return out

    def run_one(self, job) -> str:
        """finished | interrupted (checkpointed) | failed."""
        argv = self.argv(job)
        self.log(
            f"cells: {'resume' if 'resume=' in argv[3] else 'start'} {rel(job.dir, self.root)}"
        )
        self.touched.append(job.dir)
        with self.log_file.open("a") as f:
            f.write(f"\n$ {' '.join(argv)}\n")
            f.flush()
            proc = subprocess.Popen(
                argv, cwd=Path(__file__).resolve().parents[3], env=self.env,
                stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            rc = self._watch(proc, job)
        self.pack()
        if job.finished and rc == 0:
            return "finished"
        if (job.dir / CKPT).is_file() and rc in (0, 128 + signal.SIGTERM):
            return "interrupted"
        self.log(f"cells: {job.name} failed (exit {rc}); see cells.log")
        return "failed"

    def _watch(self, proc: subprocess.Popen, job) -> int:
        seen, stopped_at = None, None
        while proc.poll() is None:
            time.sleep(self.poll_s)
            ck = job.dir / CKPT
            mtime = ck.stat().st_mtime_ns if ck.is_file() else None
            if mtime is not None and mtime != seen:
                seen = mtime
                self.pack()
                if self.interrupt_at_checkpoint and stopped_at is None:
                    stopped_at = self._signal(proc, signal.SIGTERM)
            if stopped_at is None and time.time() > self.deadline - self.grace_s:
                stopped_at = self._signal(proc, signal.SIGTERM)
            if stopped_at is not None and time.time() > stopped_at + self.grace_s:
                self._signal(proc, signal.SIGKILL)
        return proc.returncode

    def _signal(self, proc: subprocess.Popen, sig: int) -> float:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        return time.time()

    def pack(self) -> None:
        """``tar_path``: every touched run dir (checkpoint included) and the cells log."""
        tmp = self.tar_path.with_name(self.tar_path.name + ".part")
        with tarfile.open(tmp, "w") as tar:
            for d in dict.fromkeys(self.touched):
                if d.is_dir():
                    for p in sorted(d.rglob("*")):
                        if p.is_file() and p.name != CKPT_TMP:
                            tar.add(p, arcname=str(rel(p, self.root)))
            if self.log_file.is_file():
                tar.add(self.log_file, arcname="cells.log")
        os.replace(tmp, self.tar_path)


def harvest_cells(tar_path: Path, root: Path) -> list[str]:
    """Finished cells -> ``results/tables/...`` (no checkpoint); unfinished -> ``.gpu/cells``."""
    from dpsub.gpu.harvest import safe_members

    root = Path(root)
    written = []
    with tarfile.open(tar_path) as tar:
        members = safe_members(tar)
        dirs = {Path(m.name).parent for m in members if m.name.startswith("results/")}
        for d in sorted(dirs):
            done = any(Path(m.name) == d / SUMMARY for m in members)
            dest = root / d if done else root / GPU_DIR / "cells" / d
            for m in members:
                if Path(m.name).parent != d or (done and Path(m.name).name == CKPT):
                    continue
                dest.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(dest / Path(m.name).name, "wb") as out:
                    shutil.copyfileobj(src, out)
            if done:
                shutil.rmtree(root / GPU_DIR / "cells" / d, ignore_errors=True)
            written.append(f"{'finished' if done else 'in progress'}: {dest}")
    return written
