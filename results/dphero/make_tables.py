"""Print the Markdown tables of results/dphero/README.md from the saved run folders.

    .venv/bin/python results/dphero/make_tables.py --collect outputs/dphero   # copy, then print
    .venv/bin/python results/dphero/make_tables.py                            # print only

Reads results/dphero/runs/<name>/{summary.json, config.yaml, metrics.jsonl, mia.json};
``--collect DIR`` first copies those four files (never checkpoints) of every finished run
DIR/<name> (lenet_*, mia_*) into runs/<name>.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

RUNS = Path(__file__).resolve().parent / "runs"
FILES = ("summary.json", "config.yaml", "metrics.jsonl", "mia.json")
NAMES = {"dphero": "DP-Hero", "dphero_floor": "DP-Hero floor", "dpsgd": "DP-SGD"}


def collect(src: Path) -> None:
    for run in sorted(src.glob("*")):
        if run.name.startswith(("lenet_", "mia_")) and (run / "summary.json").is_file():
            (RUNS / run.name).mkdir(parents=True, exist_ok=True)
            for f in FILES:
                if (run / f).is_file():
                    shutil.copy2(run / f, RUNS / run.name / f)


def load(name: str) -> tuple[dict, dict, list[dict], dict | None]:
    d = RUNS / name
    mia = d / "mia.json"
    return (
        json.loads((d / "summary.json").read_text()),
        yaml.safe_load((d / "config.yaml").read_text()),
        [json.loads(line) for line in (d / "metrics.jsonl").open()],
        json.loads(mia.read_text()) if mia.exists() else None,
    )


def scales(metrics: list[dict]) -> str:
    """Smallest v_i / sigma over all layers (first -> last logged step); the largest, last."""
    lo = [m["mech/min_scale"] for m in metrics if "mech/min_scale" in m]
    hi = [m["mech/max_scale"] for m in metrics if "mech/max_scale" in m]
    return f"{lo[0]:.3g} -> {lo[-1]:.3g} | {hi[-1]:.3g}" if lo else "1 | 1"


def hero_table() -> None:
    print("| sigma | mechanism | test acc | nominal epsilon | honest epsilon | "
          "min v_i/sigma (step 30 -> 3000) | max v_i/sigma | MIA success [95% CI] |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---|---:|---|")
    for sigma in (1, 3, 5):
        for mech in ("dphero", "dphero_floor", "dpsgd"):
            name = f"lenet_{mech}_sigma{sigma}"
            if not (RUNS / name).is_dir():
                continue
            s, _, metrics, mia = load(name)
            nominal = s.get("epsilon_nominal", s["epsilon"])
            print(
                f"| {sigma} | {NAMES[mech]} | {100 * s['test_accuracy']:.2f}% | {nominal:.3f} | "
                f"{s['epsilon']:.4g} | {scales(metrics)} | {mia_cell(mia)} |"
            )


def mia_cell(mia: dict | None) -> str:
    if mia is None:
        return "-"
    return f"{100 * mia['success']:.2f}% [{100 * mia['ci_low']:.2f}, {100 * mia['ci_high']:.2f}]"


def mia_table() -> None:
    print("| run | mechanism | private set | epochs | epsilon | test acc | MIA success [95% CI] | "
          "n (eval half) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for name in sorted(p.name for p in RUNS.iterdir() if p.name.startswith("mia_")):
        s, cfg, _, mia = load(name)
        eps = float(s["epsilon"])  # "inf" for the non-private run
        eps = "inf" if eps == float("inf") else f"{eps:.3f}"
        n = mia["examples"] if mia else "-"
        size = cfg["dataset"].get("train_size") or 60_000  # null: all of MNIST's training set
        print(
            f"| {name} | {cfg['mechanism']['name']} | {size:,} | {cfg['train']['epochs']} | {eps} | "
            f"{100 * s['test_accuracy']:.2f}% | {mia_cell(mia)} | {n} |"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect", type=Path, help="copy the small files of DIR/<run> first")
    args = ap.parse_args()
    if args.collect is not None:
        collect(args.collect)
    hero_table()
    print()
    mia_table()
