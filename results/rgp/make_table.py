"""Print the Markdown table of results/rgp/README.md from the saved run folders.

    .venv/bin/python results/rgp/make_table.py --collect outputs/rgp_cpu   # copy, then print
    .venv/bin/python results/rgp/make_table.py                             # print only

Reads results/rgp/runs/<name>/{summary.json, config.yaml, validation.json}; ``--collect
DIR`` first copies summary.json, config.yaml, metrics.jsonl and validation.json (never
checkpoints) of every finished run DIR/<name> into runs/<name>.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

RUNS = Path(__file__).resolve().parent / "runs"
FILES = ("summary.json", "config.yaml", "metrics.jsonl", "validation.json")
NAMES = {"dpsgd": "DP-SGD", "dppowersgd": "DP-PowerSGD", "rgp_random": "RGP-random", "rgp": "RGP"}
#: Yu et al. (ICML 2021) Table 2: CIFAR-10 validation accuracy (%), WRN28-4, epsilon 8.
PAPER = {"dpsgd": 55.9, "dppowersgd": 57.1, "rgp_random": 51.0, "rgp": 63.4}


def collect(src: Path) -> None:
    for run in sorted(src.glob("*")):
        if (run / "summary.json").is_file():
            (RUNS / run.name).mkdir(parents=True, exist_ok=True)
            for f in FILES:
                if (run / f).is_file():
                    shutil.copy2(run / f, RUNS / run.name / f)


def row(name: str) -> tuple:
    d = RUNS / name
    s = json.loads((d / "summary.json").read_text())
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    val = d / "validation.json"
    v = json.loads(val.read_text())["val_accuracy"] if val.is_file() else None
    return cfg["mechanism"], cfg["optim"]["lr"], s, v


def table() -> None:
    """One row per run; in each mechanism's lr grid, the best held-out accuracy is bold."""
    print("| mechanism | rank | lr | held-out acc | test acc | epsilon | z | paper (Table 2) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = [row(p.name) for p in sorted(RUNS.iterdir()) if (p / "summary.json").is_file()]
    for mech in NAMES:
        for ef in (False, True):
            grid = [
                r for r in rows if r[0]["name"] == mech and bool(r[0].get("error_feedback")) == ef
            ]
            best = max((r[3] for r in grid if r[3] is not None), default=None)
            for m, lr, s, v in sorted(grid, key=lambda r: r[1]):
                b = "**" if v is not None and v == best and len(grid) > 1 else ""
                val = "-" if v is None else f"{b}{100 * v:.2f}%{b}"
                label = NAMES[mech] + (" + error feedback" if ef else "")
                print(
                    f"| {label} | {m.get('rank', '-')} | {lr} | {val} | "
                    f"{b}{100 * s['test_accuracy']:.2f}%{b} | {s['epsilon']:.3f} | "
                    f"{s['noise_multiplier']:.4f} | {PAPER[mech]}% |"
                )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect", type=Path, help="copy the small files of DIR/<run> first")
    args = ap.parse_args()
    if args.collect is not None:
        collect(args.collect)
    table()
