"""Print a Markdown table of finished dpsub runs, one row per run, then one row per setting
(mean ± std over its seeds).

    uv run python scripts/summarize_runs.py outputs/runs/2026-11-22/* [--out results/table.md]
    uv run python scripts/summarize_runs.py outputs/multirun/2026-11-22/10-00-00   # a sweep

Each argument is a finished run dir or a folder holding them (the folder a Hydra sweep
makes); a run dir holds summary.json (steps, noise multiplier, epsilon spent, delta, final
test accuracy) and config.yaml (the resolved config). The first table has the columns: run,
seed, dataset (train_size), model, mechanism, epochs, batch, lr, steps, z (noise multiplier),
epsilon, delta, test acc (%). The second groups the runs that differ only in their seed
(labelled by the config keys that vary between groups) and gives the number of seeds and
the test accuracy's mean ± sample std [95% t-interval]. Printed to stdout and, with --out,
also written to that file. A missing path, or one with no finished run, is reported on one
line on stderr (exit code 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpsub.experiments import stats
from dpsub.rundir import RunDir, RunError, expand, group_by_setting

COLUMNS = (
    "run",
    "seed",
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


def row(run: RunDir) -> list[str]:
    """The table row of a run dir."""
    s, c = run.summary(), run.config()
    try:
        eps, z = s["epsilon"], s["noise_multiplier"]
        return [
            run.path.name,
            str(c.get("seed", "-")),
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


def table(rows: list[list[str]], columns=COLUMNS) -> str:
    """A Markdown table with a header row."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def over_seeds(runs: list[RunDir]) -> str:
    """One row per setting: seeds, test accuracy mean ± std [95% interval], epsilon."""
    rows = []
    for label, group in group_by_setting(runs).items():
        acc = stats.summarize([100 * r.summary()["test_accuracy"] for r in group])
        seeds = ",".join(str(r.config().get("seed", "-")) for r in group)
        eps = max(float(r.summary()["epsilon"]) for r in group)
        rows.append([label, seeds, acc.text(), f"{eps:.3f}"])
    return table(rows, ("setting", "seeds", "test acc (%): mean ± std [95% CI] (n)", "max epsilon"))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path, help="finished run dirs or sweep folders")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args()
    try:
        runs = expand(args.runs)
        text = table([row(r) for r in runs]) + "\n" + over_seeds(runs)
    except RunError as e:
        print(f"summarize_runs: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def cli() -> None:
    """The console command (pyproject.toml's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
