"""Plot test accuracy against steps and against epsilon spent for one or more runs.

    uv run python scripts/plot_runs.py outputs/runs/<date>/<run> [...] [--out FILE.png]
    uv run python scripts/plot_runs.py outputs/multirun/<date>/<time>     # a Hydra sweep

Each argument is a run dir or a folder holding runs (a sweep folder). Runs that differ only
in their seed are drawn in one colour with one legend entry (labelled by the config keys
that vary between settings). Without --out the figure goes next to the runs, to
<common parent of the arguments>/runs.png; the path written is printed. A path that is
missing or holds no finished run (summary.json, config.yaml, metrics.jsonl) is reported on
one line (exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from omegaconf import OmegaConf

from dpsub.rundir import METRICS, RunDir, RunError, expand, group_by_setting


def load(paths: list[Path]) -> list[tuple[str, list[list[dict]]]]:
    """(legend label, the metrics records of each seed) per setting: the runs under
    ``paths`` (run dirs or sweep folders) that differ only in their seed share one label."""
    runs = expand(paths, marker=METRICS)
    groups = group_by_setting(runs) if len(runs) > 1 else {label(runs[0]): runs}
    return [(name, [r.metrics() for r in group]) for name, group in groups.items()]


def label(run: RunDir) -> str:
    """Mechanism, dataset, epsilon and lr from config.yaml; the dir name without one."""
    if not run.config_path.is_file():
        return run.path.name
    c = run.config()
    get = lambda key: OmegaConf.select(c, key, default="?")  # noqa: E731
    return (
        f"{get('mechanism.name')} ({get('dataset.name')}, eps={get('privacy.epsilon')}, "
        f"lr={get('optim.lr')})"
    )


def default_out(runs: list[Path]) -> Path:
    """``runs.png`` in the common parent folder of the run dirs."""
    return Path(os.path.commonpath([r.resolve().parent for r in runs])) / "runs.png"


def plot(runs: list[tuple[str, list[dict]]], metrics: list[str], out: Path) -> None:
    """Accuracy vs steps, accuracy vs epsilon and each extra metric vs steps."""
    n = 2 + len(metrics)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4))
    ax1, ax2 = axes[0], axes[1]
    for i, (name, seeds) in enumerate(runs):
        for j, rows in enumerate(seeds):  # one colour per setting, one legend entry per setting
            kw = dict(color=f"C{i % 10}", label=name if j == 0 else None, alpha=0.8)
            ev = [r for r in rows if "test/accuracy" in r]
            acc = [100 * r["test/accuracy"] for r in ev]
            ax1.plot([r["step"] for r in ev], acc, marker=".", **kw)
            eps = [r for r in ev if isinstance(r.get("epsilon"), (int, float))]
            if eps:
                acc_eps = [100 * r["test/accuracy"] for r in eps]
                ax2.plot([r["epsilon"] for r in eps], acc_eps, marker=".", **kw)
            for ax, key in zip(axes[2:], metrics, strict=True):
                pts = [r for r in rows if isinstance(r.get(key), (int, float))]
                ax.plot([r["step"] for r in pts], [r[key] for r in pts], **kw)
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
    ap.add_argument("runs", nargs="+", type=Path, help="run dirs or sweep folders")
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
        runs = load(args.runs)
    except RunError as e:
        print(f"plot_runs: {e}", file=sys.stderr)
        return 2
    out = args.out or default_out(args.runs)
    plot(runs, args.metric, out)
    print(f"wrote {out}")
    return 0


def cli() -> None:
    """The console command (pyproject.toml's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
