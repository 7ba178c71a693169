"""Print the Markdown tables of results/dphero/README.md from the saved run folders.

    .venv/bin/python results/dphero/make_tables.py

Reads results/dphero/runs/<name>/{summary.json, config.yaml, metrics.jsonl, mia.json}.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

RUNS = Path(__file__).resolve().parent / "runs"
NAMES = {"dphero": "DP-Hero", "dphero_floor": "DP-Hero floor", "dpsgd": "DP-SGD"}


def load(name: str) -> tuple[dict, dict, list[dict], dict | None]:
    d = RUNS / name
    mia = d / "mia.json"
    return (
        json.loads((d / "summary.json").read_text()),
        yaml.safe_load((d / "config.yaml").read_text()),
        [json.loads(line) for line in (d / "metrics.jsonl").open()],
        json.loads(mia.read_text()) if mia.exists() else None,
    )


def min_scale(metrics: list[dict]) -> str:
    s = [m["mech/min_scale"] for m in metrics if "mech/min_scale" in m]
    return f"{s[0]:.3f} -> {s[-1]:.4f}" if s else "1 (floor)"


def hero_table() -> None:
    print("| sigma | mechanism | test acc | nominal epsilon | honest epsilon | "
          "min v_i/sigma (first -> last step) | MIA success [95% CI] |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---|---|")
    for sigma in (1, 3, 5):
        for mech in ("dphero", "dphero_floor", "dpsgd"):
            name = f"lenet_{mech}_sigma{sigma}"
            if not (RUNS / name).is_dir():
                continue
            s, _, metrics, mia = load(name)
            nominal = s.get("epsilon_nominal", s["epsilon"])
            ms = min_scale(metrics) if mech != "dpsgd" else "1"
            print(
                f"| {sigma} | {NAMES[mech]} | {100 * s['test_accuracy']:.2f}% | {nominal:.3f} | "
                f"{s['epsilon']:.4g} | {ms} | {mia_cell(mia)} |"
            )


def mia_cell(mia: dict | None) -> str:
    if mia is None:
        return "-"
    return (
        f"{100 * mia['success']:.2f}% [{100 * mia['ci_low']:.2f}, {100 * mia['ci_high']:.2f}]"
        f" (n={mia['examples']})"
    )


def mia_table() -> None:
    print("| model | mechanism | epsilon | test acc | MIA success [95% CI] |")
    print("|---|---|---:|---:|---|")
    for name in sorted(p.name for p in RUNS.iterdir() if p.name.startswith("mia_")):
        s, cfg, _, mia = load(name)
        eps = "inf" if s["epsilon"] == float("inf") else f"{s['epsilon']:.3f}"
        print(
            f"| {name} | {cfg['mechanism']['name']} | {eps} | {100 * s['test_accuracy']:.2f}% | "
            f"{mia_cell(mia)} |"
        )


if __name__ == "__main__":
    hero_table()
    print()
    mia_table()
