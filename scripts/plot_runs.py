"""Plot test accuracy against steps and against epsilon spent for one or more runs.

    uv run python scripts/plot_runs.py outputs/runs/<date>/<run> [...] --out results/mnist_eps2.png

Reads each run's metrics.jsonl (and config.yaml for the legend); works on multirun
job dirs too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402


def load(run: Path) -> tuple[str, list[dict]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    label = run.name
    if (run / "config.yaml").exists():
        cfg = OmegaConf.load(run / "config.yaml")
        label = f"{cfg.mechanism.name} ({cfg.dataset.name}, eps={cfg.privacy.epsilon}, lr={cfg.optim.lr})"
    return label, rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("runs.png"))
    ap.add_argument(
        "--metric",
        action="append",
        default=[],
        help="also plot this metrics.jsonl key against steps (e.g. mech/projection_error)",
    )
    args = ap.parse_args()
    n = 2 + len(args.metric)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4))
    ax1, ax2 = axes[0], axes[1]
    for run in args.runs:
        label, rows = load(run)
        ev = [r for r in rows if "test/accuracy" in r]
        ax1.plot(
            [r["step"] for r in ev], [100 * r["test/accuracy"] for r in ev], marker=".", label=label
        )
        eps = [r for r in ev if isinstance(r.get("epsilon"), (int, float))]
        if eps:
            ax2.plot(
                [r["epsilon"] for r in eps],
                [100 * r["test/accuracy"] for r in eps],
                marker=".",
                label=label,
            )
        for ax, key in zip(axes[2:], args.metric, strict=True):
            pts = [r for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot([r["step"] for r in pts], [r[key] for r in pts], label=label)
    ax1.set(xlabel="step", ylabel="test accuracy (%)", title="accuracy vs steps")
    ax2.set(xlabel="epsilon spent", ylabel="test accuracy (%)", title="accuracy vs privacy spent")
    for ax, key in zip(axes[2:], args.metric, strict=True):
        ax.set(xlabel="step", ylabel=key, title=key)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
