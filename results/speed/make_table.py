"""Print the table of results/speed/README.md: GEP's test accuracy against the cadence s.

    .venv/bin/python results/speed/make_table.py --collect outputs/speed_study   # copy, print
    .venv/bin/python results/speed/make_table.py                                 # print only

Reads every results/speed/runs/**/{summary.json, config.yaml}; one row per (dataset, s,
start of a refit), mean +- sample std of the final test accuracy over seeds, with the
number of seeds and each seed's value. ``--collect DIR`` first copies summary.json,
config.yaml and metrics.jsonl (never checkpoints) of every finished run under DIR into
runs/<dataset>/seed<k>/s<s>_<warm|cold>/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

RUNS = Path(__file__).resolve().parent / "runs"
FILES = ("summary.json", "config.yaml", "metrics.jsonl")


def cell(run: Path) -> tuple[str, int, bool, int, dict]:
    """(dataset, s, warm start, seed, summary) of a finished run dir."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    mech = cfg["mechanism"]
    summary = json.loads((run / "summary.json").read_text())
    return cfg["dataset"]["name"], mech["subspace_every"], mech["warm_start"], cfg["seed"], summary


def collect(src: Path) -> None:
    for summary in sorted(src.rglob("summary.json")):
        ds, s, warm, seed, _ = cell(summary.parent)
        dest = RUNS / ds / f"seed{seed}" / f"s{s}_{'warm' if warm else 'cold'}"
        dest.mkdir(parents=True, exist_ok=True)
        for f in FILES:
            if (summary.parent / f).is_file():
                shutil.copy2(summary.parent / f, dest / f)


def table() -> None:
    groups: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for summary in RUNS.rglob("summary.json"):
        ds, s, warm, seed, result = cell(summary.parent)
        groups[(ds, s, warm)][seed] = result
    print("| dataset | s | start of each refit | test accuracy (%) | seeds | per seed | epsilon |")
    print("|---|---:|---|---:|---:|---|---:|")
    for (ds, s, warm), runs in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])
    ):
        accs = [100 * runs[k]["test_accuracy"] for k in sorted(runs)]
        mean = statistics.mean(accs)
        spread = f" +- {statistics.stdev(accs):.2f}" if len(accs) > 1 else ""
        each = ", ".join(f"{a:.2f}" for a in accs)
        eps = max(r["epsilon"] for r in runs.values())
        start = "previous basis" if warm else "random (the paper)"
        print(f"| {ds} | {s} | {start} | {mean:.2f}{spread} | {len(accs)} | {each} | {eps:.4f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect", type=Path, help="copy the small files of the runs under DIR first")
    args = ap.parse_args()
    if args.collect is not None:
        collect(args.collect)
    table()
