"""Table and figure of the PDP-SGD study: accuracy against epsilon, mean +- std over seeds.

    python scripts/pdpsgd_study.py RUN_DIR... --out results/pdpsgd/study.md \\
        --png results/pdpsgd/accuracy_vs_epsilon.png --csv results/pdpsgd/runs.csv

Runs are grouped by (dataset, noise multiplier, mechanism); each group's final test
accuracy and epsilon are averaged over its seeds. Two tables per dataset: the final
test accuracy (what dpsub reports) and, for comparison with the paper, the best test
accuracy over the run's evaluations (the authors' code reports the maximum over its
per-epoch test evaluations, an optimistic choice). Each row also gives the paper's
epsilon for that noise multiplier (Zhou et al. 2021, Section 5: delta = 1e-5, N = 10,000,
B = 250, 30 epochs). ``--csv`` writes one row per run (the numbers behind the tables).
The figure marks our epsilon at the paper's threshold noise level (PDP-SGD ahead of
DP-SGD up to epsilon 0.42 on MNIST, sigma 10; 0.72 on Fashion-MNIST, sigma 6). A run dir without summary.json / config.yaml / metrics.jsonl is one
line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

MECHS = ("dpsgd", "rpdpsgd", "pdpsgd")
LABELS = {"dpsgd": "DP-SGD", "rpdpsgd": "RPDP-SGD", "pdpsgd": "PDP-SGD"}
#: The paper's epsilon for each sigma (Section 5, "Privacy parameters").
PAPER_EPS = {
    "mnist": {4: 1.09, 6: 0.72, 8: 0.53, 10: 0.42, 14: 0.30, 18: 0.23},
    "fashion_mnist": {2: 2.41, 4: 1.09, 6: 0.72, 10: 0.42, 14: 0.30, 18: 0.23},
}
DATASET_NAMES = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}
#: The sigma of the paper's largest epsilon at which PDP-SGD beats DP-SGD (Section 5).
PAPER_THRESHOLD_SIGMA = {"mnist": 10, "fashion_mnist": 6}
CSV_FIELDS = ("dataset", "mechanism", "sigma", "seed", "lr", "epochs", "steps", "epsilon",
              "final", "best")  # fmt: skip


class RunError(Exception):
    pass


def read(run: Path) -> dict:
    """What the study needs from one finished run dir."""
    files = {n: run / n for n in ("summary.json", "config.yaml", "metrics.jsonl")}
    for f in files.values():
        if not f.is_file():
            raise RunError(f"{f}: missing (not a finished dpsub run?)")
    s = json.loads(files["summary.json"].read_text())
    c = OmegaConf.load(files["config.yaml"])
    evals = [json.loads(line) for line in files["metrics.jsonl"].read_text().splitlines()]
    accs = [e["test/accuracy"] for e in evals if "test/accuracy" in e]
    return {
        "dataset": c.dataset.name,
        "mechanism": c.mechanism.name,
        "sigma": float(s["noise_multiplier"]),
        "seed": int(c.seed),
        "lr": float(c.optim.lr),
        "epochs": int(c.train.epochs),
        "steps": int(s["steps"]),
        "epsilon": float(s["epsilon"]),
        "final": float(s["test_accuracy"]),
        "best": max(accs) if accs else float("nan"),
    }


def mean_std(xs: list[float]) -> str:
    """Mean +- std in percent; the mean alone for a single seed."""
    m = f"{100 * statistics.mean(xs):.2f}"
    return f"{m} +- {100 * statistics.stdev(xs):.2f}" if len(xs) > 1 else m


def mean(rs: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rs)


def table_row(ds: str, sigma: float, groups: dict, key: str) -> str:
    """One noise level: epsilons, each mechanism's accuracy, PDP-SGD's lead over DP-SGD."""
    gs = [groups.get((ds, sigma, m), []) for m in MECHS]
    cells = [mean_std([r[key] for r in g]) if g else "-" for g in gs]
    pdp, dp = gs[MECHS.index("pdpsgd")], gs[MECHS.index("dpsgd")]
    lead = f"{100 * (mean(pdp, key) - mean(dp, key)):+.2f}" if pdp and dp else "-"
    paper = PAPER_EPS.get(ds, {}).get(round(sigma), "-")
    ours = statistics.mean(r["epsilon"] for g in gs for r in g)
    seeds = "/".join(str(len(g)) for g in gs)
    return f"| {sigma:g} | {paper} | {ours:.3f} | {' | '.join(cells)} | {lead} | {seeds} |"


TITLES = {
    "final": "final test accuracy",
    "best": "best test accuracy over the evaluations (the authors' metric)",
}


def lr_of(runs: list[dict], ds: str, mech: str) -> str:
    return "/".join(
        f"{x:g}"
        for x in sorted({r["lr"] for r in runs if (r["dataset"], r["mechanism"]) == (ds, mech)})
    )


def tables(runs: list[dict]) -> str:
    groups = defaultdict(list)
    for r in runs:
        groups[(r["dataset"], r["sigma"], r["mechanism"])].append(r)
    out = []
    for ds in sorted({r["dataset"] for r in runs}):
        lrs = [f"{LABELS[m]} {lr_of(runs, ds, m)}" for m in MECHS]
        for key, title in TITLES.items():
            out.append(
                f"\n### {ds}: {title} (%), mean +- std over seeds where > 1 (lr: {', '.join(lrs)})\n"
            )
            names = " | ".join(LABELS[m] for m in MECHS)
            out.append(f"| sigma | paper eps | our eps (RDP) | {names} | PDP - DP-SGD | seeds |")
            out.append("|---:|---:|---:|" + "---:|" * len(MECHS) + "---:|---:|")
            sigmas = sorted({r["sigma"] for r in runs if r["dataset"] == ds}, reverse=True)
            out += [table_row(ds, sigma, groups, key) for sigma in sigmas]
    return "\n".join(out) + "\n"


def mark_threshold(ax, runs: list[dict], ds: str) -> None:
    """A dotted line at our epsilon for the paper's threshold sigma, if that sigma was run."""
    sigma = PAPER_THRESHOLD_SIGMA.get(ds)
    eps = [r["epsilon"] for r in runs if round(r["sigma"]) == sigma]
    if eps:
        paper = PAPER_EPS[ds][sigma]
        label = f"sigma {sigma} (paper: PDP-SGD ahead up to eps {paper})"
        ax.axvline(statistics.mean(eps), color="gray", ls=":", label=label)


def write_csv(runs: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        order = sorted(
            runs, key=lambda r: (r["dataset"], MECHS.index(r["mechanism"]), -r["sigma"], r["seed"])
        )
        w.writerows(order)


def figure(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    datasets = sorted({r["dataset"] for r in runs}, key=lambda d: (d != "mnist", d))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets, strict=True):
        for m in MECHS:
            pts = defaultdict(list)
            for r in runs:
                if r["dataset"] == ds and r["mechanism"] == m:
                    pts[r["sigma"]].append(r)
            if not pts:
                continue
            sig = sorted(pts, reverse=True)
            eps = [statistics.mean(r["epsilon"] for r in pts[s]) for s in sig]
            acc = [100 * statistics.mean(r["final"] for r in pts[s]) for s in sig]
            err = [100 * statistics.stdev([r["final"] for r in pts[s]]) if len(pts[s]) > 1 else 0
                   for s in sig]  # fmt: skip
            ax.errorbar(eps, acc, yerr=err, marker="o", capsize=3, label=LABELS[m])
        mark_threshold(ax, [r for r in runs if r["dataset"] == ds], ds)
        ax.set_xscale("log")
        ticks = sorted({round(r["epsilon"], 2) for r in runs if r["dataset"] == ds})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("epsilon (ours: RDP, delta = 1e-5)")
        ax.set_ylabel("final test accuracy (%)")
        epochs = "/".join(str(e) for e in sorted({r["epochs"] for r in runs if r["dataset"] == ds}))
        ax.set_title(f"{DATASET_NAMES.get(ds, ds)}: N = 10,000, B = 250, {epochs} epochs")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path, help="finished run dirs")
    ap.add_argument("--out", type=Path, help="also write the tables to this Markdown file")
    ap.add_argument("--png", type=Path, help="write accuracy against epsilon to this PNG")
    ap.add_argument("--csv", type=Path, help="write one row per run to this CSV file")
    args = ap.parse_args()
    try:
        runs = [read(r) for r in args.runs]
    except (RunError, json.JSONDecodeError) as e:
        print(f"pdpsgd_study: {e}", file=sys.stderr)
        return 2
    text = tables(runs)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.png:
        figure(runs, args.png)
    if args.csv:
        write_csv(runs, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
