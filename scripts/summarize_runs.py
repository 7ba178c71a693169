"""Print a Markdown table of finished dpsub runs, one row per run dir.

    uv run python scripts/summarize_runs.py outputs/runs/2026-11-22/* [--out results/table.md]

Each run dir must hold the two files a finished run writes: summary.json (steps,
noise multiplier, epsilon spent, delta, final test accuracy) and config.yaml (the
resolved config: dataset, model, mechanism, epochs, batch size, learning rate).
The table has the columns: run, dataset (train_size), model, mechanism, epochs,
batch, lr, steps, z (noise multiplier), epsilon, delta, test acc (%). It is printed
to stdout and, with --out, also written to that file. A run dir that is missing or
lacks one of the two files is reported on one line on stderr (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

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


class RunError(Exception):
    """A run dir that cannot be summarized; the message names it."""


def read_run(run: Path) -> tuple[dict, DictConfig]:
    """summary.json and config.yaml of a finished run dir."""
    if not run.is_dir():
        raise RunError(f"{run}: {'not a directory' if run.exists() else 'no such run directory'}")
    for name in ("summary.json", "config.yaml"):
        if not (run / name).is_file():
            raise RunError(f"{run}: no {name} in this directory (not a finished dpsub run?)")
    try:
        summary = json.loads((run / "summary.json").read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{run / 'summary.json'}: not valid JSON ({e.msg})") from None
    try:
        config = OmegaConf.load(run / "config.yaml")
    except Exception as e:  # YAML syntax errors have several classes
        problem = f"not a readable YAML file ({type(e).__name__})"
        raise RunError(f"{run / 'config.yaml'}: {problem}") from None
    return summary, config


def row(run: Path) -> list[str]:
    """The table row of a run dir."""
    s, c = read_run(run)
    try:
        eps, z = s["epsilon"], s["noise_multiplier"]
        return [
            run.name,
            c.dataset.name + (f" ({c.dataset.train_size})" if c.dataset.get("train_size") else ""),
            c.model.name,
            c.mechanism.name,
            f"{c.train.epochs:g}",
            str(c.train.batch_size),
            f"{c.optim.lr:g}",
            str(s["steps"]),
            f"{z:.3f}" if isinstance(z, float) else "-",
            eps if isinstance(eps, str) else f"{eps:.3f}",
            f"{s['delta']:g}",
            f"{100 * s['test_accuracy']:.2f}",
        ]
    except (KeyError, AttributeError) as e:
        missing = str(e).splitlines()[0]  # OmegaConf's messages go on for several lines
        raise RunError(f"{run}: summary.json or config.yaml lacks a key ({missing})") from None


def table(rows: list[list[str]]) -> str:
    """A Markdown table with a header row."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path, help="finished run dirs")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args()
    try:
        text = table([row(r) for r in args.runs])
    except RunError as e:
        print(f"summarize_runs: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
