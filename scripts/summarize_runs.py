"""Markdown table of finished runs (summary.json + config.yaml of each run dir).

uv run python scripts/summarize_runs.py outputs/runs/2026-11-22/* [--out results/table.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

COLUMNS = (
    "run",
    "dataset",
    "model",
    "mechanism",
    "epochs",
    "batch",
    "lr",
    "steps",
    "z",
    "epsilon",
    "delta",
    "test acc (%)",
)


def row(run: Path) -> list[str]:
    s = json.loads((run / "summary.json").read_text())
    c = OmegaConf.load(run / "config.yaml")
    eps = s["epsilon"]
    return [
        run.name,
        c.dataset.name + (f" ({c.dataset.train_size})" if c.dataset.get("train_size") else ""),
        c.model.name,
        c.mechanism.name,
        f"{c.train.epochs:g}",
        str(c.train.batch_size),
        f"{c.optim.lr:g}",
        str(s["steps"]),
        f"{s['noise_multiplier']:.3f}" if isinstance(s["noise_multiplier"], float) else "-",
        eps if isinstance(eps, str) else f"{eps:.3f}",
        f"{s['delta']:g}",
        f"{100 * s['test_accuracy']:.2f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = [row(r) for r in args.runs if (r / "summary.json").exists()]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
