"""Every bench row timed alone, and the rule a README figure must meet (issue 43).

Interleaved rounds share a process: rows that run beside each other share caches, the
allocator's free lists and the page cache, so a row's time can depend on its neighbours
(ghost DP-SGD on resnet20 read 1.17-1.42x non-private with different rows beside it).
``--standalone`` therefore also times every row *alone*, in a child process of its own
(``python -m dpsub.experiments.benchmark`` with the parent's options and ``--only-row``),
the non-private baseline included, and the standalone ratio (row alone over non-private
alone) is the figure that counts for a README.

The README rule (:func:`readme_problems`): a standalone timing, at least
:data:`MIN_ROUNDS` timed rounds, and a 1-minute load average of at most 1 per core at the
start and at the end of the run. ``--for-readme`` refuses to write anything that breaks
it; without it the page says which part of the rule the figures miss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: the fewest timed rounds a README figure may come from
MIN_ROUNDS = 20
#: the rule, as a page states it
RULE = (f"a README quotes only `alone` figures (each row in its own process) over >= {MIN_ROUNDS} "
        "rounds, with a 1-minute load <= 1 per core at start and at end")  # fmt: skip
#: options a child never gets (the parent's outputs, its modes, its selection of models)
PARENT_ONLY = {"help", "models", "out", "markdown", "append", "standalone", "for_readme",
               "only_row", "peers", "opacus_modes", "gep_authors", "note"}  # fmt: skip
#: what a record takes from its row's child (child key -> record key)
FIELDS = {"time_ms": "standalone_ms", "median_ms": "standalone_median_ms",
          "q1_ms": "standalone_q1_ms", "q3_ms": "standalone_q3_ms",
          "peak_extra_mib": "standalone_peak_extra_mib"}  # fmt: skip


# ------------------------------------------------------------ the README rule
def load1(text: str | None) -> float | None:
    """The 1-minute figure of a ``"1min 5min 15min"`` loadavg string (None if unknown)."""
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def load_problem(text: str | None, when: str, cores: int) -> str | None:
    """Why the load ``when`` ("at start", "at end") breaks the rule, or None."""
    value = load1(text)
    if value is None:
        return f"load unknown {when}"
    if value > cores:
        return f"load {value:g} {when} on {cores} cores (> 1 per core)"
    return None


def readme_problems(steps: int, standalone: bool, env: dict) -> list[str]:
    """Every way a run breaks the README rule (empty: its standalone figures may be quoted)."""
    cores = env.get("cpu_count") or os.cpu_count() or 1
    out = [] if steps >= MIN_ROUNDS else [f"--steps {steps} < {MIN_ROUNDS} rounds"]
    if not standalone:
        out.append("no standalone timing (--standalone)")
    for key, when in (("loadavg_start", "at start"), ("loadavg_end", "at end")):
        if key in env and (why := load_problem(env[key], when, cores)):
            out.append(why)
    return out


def refuse(why: str) -> int:
    """One line on stderr, exit code 2 (the caller writes nothing)."""
    print(f"bench: --for-readme refused: {why}; stop other work and run again"
          if "per core" in why else f"bench: --for-readme refused: {why}",
          file=sys.stderr, flush=True)  # fmt: skip
    return 2


# ------------------------------------------------------------------ children
def child_argv(parser: argparse.ArgumentParser, args, model: str, row: int, out: Path) -> list:
    """The parent's options (as parsed, outputs and modes aside) for row ``row`` of ``model``."""
    argv = ["--models", model, "--only-row", str(row), "--out", str(out)]
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        unset = value is None or value is False  # (0 is a value: --warmup 0)
        if unset or action.dest in PARENT_ONLY or not action.option_strings:
            continue
        flag = action.option_strings[-1]
        if value is True:
            argv.append(flag)
        elif isinstance(value, list) and isinstance(action, argparse._AppendAction):
            for v in value:
                argv += [flag, str(v)]
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def run_child(argv: list[str]) -> int:
    """``python -m dpsub.experiments.benchmark ARGV`` (its table to /dev/null, its log shown)."""
    cmd = [sys.executable, "-m", "dpsub.experiments.benchmark", *argv]
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False).returncode


def time_alone(parser, args, model: str, row: int) -> dict:
    """Row ``row`` of ``model`` alone in a child process: its record, or an error record."""
    with tempfile.TemporaryDirectory(prefix="dpsub-bench-") as tmp:
        out = Path(tmp) / "row.json"
        rc = run_child(child_argv(parser, args, model, row, out))
        try:
            (rec,) = json.loads(out.read_text())
        except (OSError, ValueError) as e:
            return {"status": "error", "error": f"child exit {rc}: {type(e).__name__}"}
    return rec


def add_standalone(parser, args, model: str, records: list[dict]) -> None:
    """Time every ok row of ``model`` alone; add its standalone fields and ratio."""
    alone = {}
    for i, rec in enumerate(records):
        if rec["status"] == "ok":
            print(f"  alone: {rec['mechanism']} [{rec['backend']}]", file=sys.stderr, flush=True)
            alone[i] = time_alone(parser, args, model, i)
    base = alone.get(0, {}) if records and records[0]["mechanism"] == "nonprivate" else {}
    for i, rec in enumerate(records):
        rec.update(dict.fromkeys([*FIELDS.values(), "standalone_ratio"]))
        rec.update(standalone_rounds=None, standalone_error=None)
        got = alone.get(i)
        if got is None:
            continue
        if got["status"] != "ok":
            rec["standalone_error"] = got["error"]
            continue
        rec.update({mine: got.get(theirs) for theirs, mine in FIELDS.items()})
        rec["standalone_rounds"] = len(got.get("step_ms", []))
        if base.get("status") == "ok":
            rec["standalone_ratio"] = got["time_ms"] / base["time_ms"]
