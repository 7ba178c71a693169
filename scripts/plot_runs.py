"""Plot test accuracy against steps and against epsilon spent for one or more runs.

    uv run python scripts/plot_runs.py outputs/runs/<date>/<run> [...] [--out FILE.png]

Reads each run dir's metrics.jsonl (and config.yaml, if present, for the legend);
works on multirun job dirs too. Without --out the figure goes next to the runs, to
<common parent of the run dirs>/runs.png; the path written is printed. A run dir
that is missing or has no readable metrics.jsonl is reported on one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402


class RunError(Exception):
    """A run dir that cannot be plotted; the message names it."""


def read_rows(run: Path) -> list[dict]:
    """The records of ``run/metrics.jsonl``."""
    path = run / "metrics.jsonl"
    if not run.is_dir():
        raise RunError(f"{run}: {'not a directory' if run.exists() else 'no such run directory'}")
    if not path.is_file():
        raise RunError(f"{run}: no metrics.jsonl in this directory (not a dpsub run dir?)")
    rows = []
    for num, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise RunError(f"{path}:{num}: not a JSON line ({e.msg})") from None
    return rows


def label(run: Path) -> str:
    """Mechanism, dataset, epsilon and lr from config.yaml; the dir name without one."""
    path = run / "config.yaml"
    if not path.is_file():
        return run.name
    try:
        c = OmegaConf.load(path)
    except Exception as e:  # YAML syntax errors have several classes
        raise RunError(f"{path}: not a readable YAML file ({type(e).__name__})") from None
    get = lambda key: OmegaConf.select(c, key, default="?")  # noqa: E731
    return (
        f"{get('mechanism.name')} ({get('dataset.name')}, eps={get('privacy.epsilon')}, "
        f"lr={get('optim.lr')})"
    )


def load(run: Path) -> tuple[str, list[dict]]:
    """The legend label and the metrics records of a run dir."""
    rows = read_rows(run)
    return label(run), rows


def default_out(runs: list[Path]) -> Path:
    """``runs.png`` in the common parent folder of the run dirs."""
    return Path(os.path.commonpath([r.resolve().parent for r in runs])) / "runs.png"


def plot(runs: list[tuple[str, list[dict]]], metrics: list[str], out: Path) -> None:
    """Accuracy vs steps, accuracy vs epsilon and each extra metric vs steps."""
    n = 2 + len(metrics)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4))
    ax1, ax2 = axes[0], axes[1]
    for name, rows in runs:
        ev = [r for r in rows if "test/accuracy" in r]
        acc = [100 * r["test/accuracy"] for r in ev]
        ax1.plot([r["step"] for r in ev], acc, marker=".", label=name)
        eps = [r for r in ev if isinstance(r.get("epsilon"), (int, float))]
        if eps:
            acc_eps = [100 * r["test/accuracy"] for r in eps]
            ax2.plot([r["epsilon"] for r in eps], acc_eps, marker=".", label=name)
        for ax, key in zip(axes[2:], metrics, strict=True):
            pts = [r for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot([r["step"] for r in pts], [r[key] for r in pts], label=name)
    ax1.set(xlabel="step", ylabel="test accuracy (%)", title="accuracy vs steps")
    ax2.set(xlabel="epsilon spent", ylabel="test accuracy (%)", title="accuracy vs privacy spent")
    for ax, key in zip(axes[2:], metrics, strict=True):
        ax.set(xlabel="step", ylabel=key, title=key)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path, help="run dirs (each with a metrics.jsonl)")
    ap.add_argument(
        "--out", type=Path, help="PNG to write (default: <common parent of the runs>/runs.png)"
    )
    ap.add_argument(
        "--metric",
        action="append",
        default=[],
        help="also plot this metrics.jsonl key against steps (e.g. mech/projection_error)",
    )
    args = ap.parse_args()
    try:
        runs = [load(run) for run in args.runs]
    except RunError as e:
        print(f"plot_runs: {e}", file=sys.stderr)
        return 2
    out = args.out or default_out(args.runs)
    plot(runs, args.metric, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
