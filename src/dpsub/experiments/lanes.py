"""CPU lanes for the long campaigns: one ``reproduce.py`` at a time per core, until a deadline.

    python scripts/lanes.py --stop-at 11:35 data.root=/data/cifar10     # two lanes
    python scripts/lanes.py --stop-at +2h --lanes 1 --out /clone/results/tables
    python scripts/lanes.py --plan data.root=/data/cifar10               # what is left

Each lane runs the campaigns of ``conf/lanes/cpu.yaml`` (``--campaigns``: another file) in
their order, each as ``scripts/reproduce.py <campaign> --out OUT --stop-at T`` with
``--threads`` torch threads (``OMP_NUM_THREADS``; 1 by default) at ``nice`` 5; the remaining
overrides go to every campaign. ``--lanes 1 --threads 2`` gives one job both cores: a job
too long for one core in one work period may fit in it. ``--fit-margin`` (passed on to
reproduce.py) scales the recorded step times (one-core CPU-seconds, from whatever machine
ran them) to the lane's pace on this machine; calibrate it from a run's own pace here
(docs/tables.md has the figures of 2026-11-28).
A campaign that is done, or whose remaining jobs another lane holds (each run dir is locked
by its process), returns and the lane goes on to the next; the lanes start ``--stagger``
seconds apart so they do not race for the same job. At ``--stop-at`` every lane's job
finishes its step and writes its checkpoint (reproduce.py's ``--stop-at``), and the lanes
end: the same command in the next work period resumes the jobs where they stopped. A job
whose estimated time (recorded step times) would end after ``--stop-at`` is not started
(``--fit``, the default; ``--no-fit`` starts it): where a work period's machine does not last
into the next one, as on this project's own, its checkpoint would be lost. Finished
runs are not committed here: ``make_table.py TABLE --setting S --runs OUT --copy-only``
copies their small files beside the table (to commit as they finish; without
``--copy-only`` it also renders the table). Each lane's output goes to
``OUT/.lanes/lane<i>.log``. SIGTERM or Ctrl-C to this command ends the lanes early the same
way: every running job checkpoints and no campaign starts after it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dpsub.errors import ConfigError
from dpsub.experiments.reproduce import check_fit_margin, seconds_until
from dpsub.paths import conf_dir, project_root

MARGIN_S = 120  # a campaign is not started with less time than this left


def campaigns(path: Path) -> list[list[str]]:
    """The file's campaigns, each as reproduce.py's argument words, every one naming a table
    and a setting that exist; ConfigError naming the file and the entry."""
    import yaml

    if not path.is_file():
        raise ConfigError(f"--campaigns {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    items = raw.get("campaigns") if isinstance(raw, dict) else None
    if not isinstance(items, list) or not items or not all(isinstance(c, str) for c in items):
        raise ConfigError(f"{path}: campaigns: a non-empty list of reproduce.py arguments")
    for i, item in enumerate(items):
        check_campaign(f"{path}: campaigns[{i}]", shlex.split(item))
    return [shlex.split(c) for c in items]


def check_campaign(key: str, words: list[str]) -> None:
    """reproduce.py would accept ``words``: its flags, a table and one of its settings."""
    from dpsub.experiments import reproduce, tables

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = reproduce.parse(words)
    except SystemExit:
        raise ConfigError(f"{key}: not reproduce.py's arguments: {shlex.join(words)}") from None
    try:
        tables.load_table(args.table).setting(args.setting)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None


class Stop:
    """SIGTERM/SIGINT to the lanes: every running job checkpoints (the signal is passed on)
    and no lane starts another campaign."""

    def __init__(self):
        self.event, self.children, self.lock = threading.Event(), set(), threading.Lock()

    def handle(self, signum, frame) -> None:
        self.event.set()
        with self.lock:
            for proc in self.children:
                proc.send_signal(signal.SIGTERM)

    def run(self, argv: list[str], nice: int = 0, **kw) -> int:
        with self.lock:
            if self.event.is_set():
                return -1
            proc = subprocess.Popen(argv, **kw)
            self.children.add(proc)
        with contextlib.suppress(OSError):  # (not preexec_fn: unsafe beside threads)
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        try:
            return proc.wait()
        finally:
            with self.lock:
                self.children.discard(proc)


def lane(i: int, todo: list[list[str]], args, deadline: float, stop: Stop) -> None:
    """One lane: the campaigns in order while time is left (a child process each)."""
    if stop.event.wait(i * args.stagger):
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    script = project_root() / "scripts" / "reproduce.py"
    log = Path(args.out) / ".lanes" / f"lane{i}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for words in todo:
        left = deadline - time.time()
        if left < MARGIN_S or stop.event.is_set():
            break
        argv = [sys.executable, str(script), *words, "--out", str(args.out),
                "--stop-at", f"+{int(left)}s",
                *(["--fit"] if args.fit else []),
                *(["--fit-margin", str(args.fit_margin)] if args.fit_margin else []),
                *args.overrides]  # fmt: skip
        with log.open("a") as f:
            f.write(f"\n$ {shlex.join(argv)}\n")
            f.flush()
            # a session of its own: a terminal's Ctrl-C reaches it once, from Stop.handle
            # (a second signal would stop a job before its checkpoint)
            rc = stop.run(argv, args.nice, env=env, stdout=f, stderr=subprocess.STDOUT,
                          start_new_session=True)  # fmt: skip
        print(f"lane {i}: {' '.join(words[:3])}: exit {rc}", flush=True)


def plan(todo: list[list[str]], args) -> list[str]:
    """``--plan``: each campaign's jobs by status and what is left, from its ``--dry-run``
    (recorded step times; nothing runs)."""
    script = project_root() / "scripts" / "reproduce.py"
    out = ["| campaign | jobs | done | to run | left (CPU, one core) |", "|---|---:|---:|---:|---|"]
    for words in todo:
        argv = [sys.executable, str(script), *words, "--out", str(args.out), "--dry-run",
                *args.overrides]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True)
        states = [row.split("|")[3].strip() for row in proc.stdout.splitlines()
                  if row.startswith(("| paper |", "| tune |", "| tuned |", "| private |"))]  # fmt: skip
        totals = [line.split("still to run: ")[-1] for line in proc.stdout.splitlines()
                  if "still to run: " in line]  # fmt: skip
        left = " + ".join(totals) if totals else (
            f"dry run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")  # fmt: skip
        done = sum(st in ("done", "reuse") for st in states)
        out.append(f"| `{shlex.join(words)}` | {len(states)} | {done} | {len(states) - done} "
                   f"| {left} |")  # fmt: skip
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("overrides", nargs="*", help="overrides for every campaign (data.root=...)")
    p.add_argument("--stop-at", metavar="HH:MM",
                   help="when the lanes checkpoint and end (or +2h30m / +45m); required to run")  # fmt: skip
    p.add_argument("--plan", action="store_true",
                   help="print each campaign's jobs done and left with their CPU cost (its "
                        "--dry-run); run nothing")  # fmt: skip
    p.add_argument("--lanes", type=int, default=2, choices=range(1, (os.cpu_count() or 1) + 1),
                   metavar="N", help="lanes (default 2)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1, choices=range(1, (os.cpu_count() or 1) + 1),
                   metavar="T", help="torch threads per lane (default 1); lanes x threads "
                                     "should not exceed the cores")  # fmt: skip
    p.add_argument("--campaigns", type=Path, default=conf_dir() / "lanes" / "cpu.yaml")
    p.add_argument("--out", type=Path, default=project_root() / "outputs" / "tables")
    p.add_argument("--stagger", type=float, default=30.0, help="seconds between lane starts")
    p.add_argument("--nice", type=int, default=5)
    p.add_argument("--fit", action=argparse.BooleanOptionalAction, default=True,
                   help="start a job only if its estimated time ends before --stop-at "
                        "(reproduce.py --fit; default): a machine that does not last from one "
                        "period to the next loses an unfinished job's checkpoint")  # fmt: skip
    p.add_argument("--fit-margin", type=float, default=None,
                   help="with --fit: reproduce.py's --fit-margin (the recorded one-core step "
                        "times are multiplied by it; below 1 for a lane of several threads)")  # fmt: skip
    return p.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        todo = campaigns(args.campaigns)
        if args.plan:
            print("\n".join(plan(todo, args)))
            return 0
        if args.stop_at is None:
            raise ConfigError("--stop-at: when the lanes end (HH:MM or +2h30m); or --plan")
        if args.lanes * args.threads > (os.cpu_count() or 1):
            raise ConfigError(f"--lanes {args.lanes} x --threads {args.threads}: more than "
                              f"the {os.cpu_count()} cores")  # fmt: skip
        if args.fit_margin is not None:
            check_fit_margin(args.fit_margin)
        deadline = time.time() + seconds_until(args.stop_at)
    except ConfigError as e:
        print(f"lanes: {e}", file=sys.stderr)
        return 2
    stop = Stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop.handle)
    threads = [threading.Thread(target=lane, args=(i, todo, args, deadline, stop))
               for i in range(args.lanes)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
