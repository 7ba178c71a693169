"""Audit every mechanism at epsilon 1, 2, 4, 8 (white-box) and render results/audit/.

    uv run python scripts/audit_table.py run [--only NAME]   # one run dir per (mechanism, epsilon)
    uv run python scripts/audit_table.py dist                # DP-SGD over 2 ranks (torchrun, gloo)
    uv run python scripts/audit_table.py onerun              # the one-run input-space audits
    uv run python scripts/audit_table.py table               # table.md + lower_vs_upper.png
    uv run python scripts/audit_table.py pate                # PATE's aggregators (audit=pate)

A thin wrapper over dpsub.cli.audit.run_audit; the setting is SETTING below.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpsub.paths import project_root

ROOT = project_root()  # the repository (an install: the working directory)

OUT = ROOT / "results" / "audit" / "runs"
EPSILONS = (1, 2, 4, 8)
#: one full-batch step (q = 1) of LeNet on 64 MNIST training images
SETTING = ("dataset=mnist", "+dataset.train_size=64", "train.batch_size=64", "train.max_steps=1",
           "model=lenet", "logger=disabled", "audit.trials=1000000", "audit.direct_trials=1000")  # fmt: skip
AUX = ("aux=gaussian", "aux.num_samples=64", "mechanism.num_bases=32")
MECHANISMS = {
    "dpsgd-vmap": ("mechanism=dpsgd", "grads.backend=vmap"),
    "dpsgd-opacus": ("mechanism=dpsgd", "grads.backend=opacus"),
    "dpsgd-ghost": ("mechanism=dpsgd", "grads.backend=ghost"),
    "gep": ("mechanism=gep", *AUX, "audit.view=releases"),  # both releases, each / its noise std
    "gep-update": ("mechanism=gep", *AUX),  # the update, where the two releases' noise adds up
    "bgep": ("mechanism=bgep", *AUX),
    "pdpsgd": ("mechanism=pdpsgd", "aux.num_samples=32", "mechanism.num_bases=16", "+dataset.train_size=96"),
    "rpdpsgd": ("mechanism=rpdpsgd", "mechanism.num_bases=16"),
    "rgp": ("mechanism=rgp", "mechanism.rank=4"),
    "rgp_random": ("mechanism=rgp_random", "mechanism.rank=4"),
    "dppowersgd": ("mechanism=dppowersgd", "mechanism.rank=4"),
    "dphero-honest": ("mechanism=dphero", "audit.direction=least_noisy"),
    "dphero-nominal": ("mechanism=dphero", "mechanism.accounting=nominal", "audit.direction=least_noisy"),
    "dphero_floor": ("mechanism=dphero_floor", "audit.direction=least_noisy"),
}  # fmt: skip


#: DP-Hero with honest (measured) accounting needs a fixed multiplier (dpsub.config): the one
#: the RDP accountant calibrates for DP-SGD at each epsilon in this setting (summary.json)
FIXED_Z = {1: 4.0625, 2: 2.158203125, 4: 1.15966796875, 8: 0.6378173828125}


def overrides(name: str, eps: int) -> list[str]:
    extra = list(MECHANISMS[name])
    if name == "dphero-honest":
        return [
            *SETTING,
            *extra,
            f"privacy.noise_multiplier={FIXED_Z[eps]}",
            "privacy.epsilon=1e12",
        ]
    base = [
        o
        for o in SETTING
        if not (
            o.startswith("+dataset.train_size")
            and any(e.startswith("+dataset.train_size") for e in extra)
        )
    ]
    return [*base, *extra, f"privacy.epsilon={eps}"]


def run(only: str | None) -> None:
    from dpsub.cli.audit import run_audit
    from dpsub.config import compose

    for name in MECHANISMS:
        if only and name != only:
            continue
        for eps in EPSILONS:
            d = OUT / f"{name}_eps{eps}"
            if (d / "audit.json").is_file():
                continue
            cfg = compose(overrides(name, eps), config_name="dpsub_audit")
            r = run_audit(cfg, d)
            print(name, eps, r["lower_bound"]["epsilon"], r["epsilon_upper"], flush=True)


DIST = "dpsgd-2ranks"  # DP-SGD through the distributed path (torchrun --nproc_per_node 2)
ONERUN = {  # MNIST, 10,000 training images, mnist_cnn, 1,000 mislabeled canaries
    "onerun-dpsgd-eps8": ("mechanism=dpsgd", "privacy.epsilon=8"),
    "onerun-dpsgd-eps2": ("mechanism=dpsgd", "privacy.epsilon=2"),
    # lr 0.5 diverges without clipping (10.1% accuracy): the non-private run uses 0.05
    "onerun-nonprivate": ("mechanism=nonprivate", "optim.lr=0.05"),
}
ONERUN_SETTING = ("dataset=mnist", "dataset.train_size=10000", "model=mnist_cnn", "logger=disabled",
                  "train.batch_size=256", "train.epochs=10", "optim.lr=0.5", "audit=onerun",
                  "audit.canaries=1000", "audit.guesses=100")  # fmt: skip


def dist() -> None:
    import os
    import subprocess

    for eps in EPSILONS:
        d = OUT / f"{DIST}_eps{eps}"
        if (d / "audit.json").is_file():
            continue
        args = ["torchrun", "--nproc_per_node", "2", "-m", "dpsub.cli.audit",
                *overrides("dpsgd-vmap", eps), "device=cpu", f"out_dir={d}"]  # fmt: skip
        subprocess.run(args, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def onerun() -> None:
    from dpsub.cli.audit import run_audit
    from dpsub.config import compose

    for name, extra in ONERUN.items():
        d = OUT / name
        if (d / "audit.json").is_file():
            continue
        cfg = compose([*ONERUN_SETTING, *extra], config_name="dpsub_audit")
        r = run_audit(cfg, d)
        print(name, r["lower_bound"]["epsilon"], r["epsilon_upper"], r["trials"], flush=True)


#: PATE's aggregators (audit=pate): one query's noise, from small to large claimed epsilon
PATE = {
    "pate-gnmax-sigma8": ("audit.aggregator=gnmax", "audit.sigma2=8"),
    "pate-gnmax-sigma4": ("audit.aggregator=gnmax", "audit.sigma2=4"),
    "pate-gnmax-sigma2": ("audit.aggregator=gnmax", "audit.sigma2=2"),
    "pate-gnmax-sigma1": ("audit.aggregator=gnmax", "audit.sigma2=1"),
    "pate-lnmax-b4": ("audit.aggregator=lnmax", "audit.laplace_scale=4"),
    "pate-lnmax-b1": ("audit.aggregator=lnmax", "audit.laplace_scale=1"),
    "pate-confident-s4-T35": ("audit.aggregator=confident", "audit.sigma1=4", "audit.sigma2=4",
                              "audit.threshold=35"),
}  # fmt: skip
PATE_SETTING = ("audit=pate", "logger=disabled", "audit.leads=[25,26,27,28,29,30,31,32,33,34,35,"
                "36,37,38,39,40,41,42,43,44,45,46,47,48,49,50]")  # fmt: skip


def pate() -> None:
    from dpsub.cli.audit import run_audit
    from dpsub.config import compose

    for name, extra in PATE.items():
        d = OUT / name
        if not (d / "audit.json").is_file():
            run_audit(compose([*PATE_SETTING, *extra], config_name="dpsub_audit"), d)
    rows = []
    for name in PATE:
        r = json.loads((OUT / name / "audit.json").read_text())
        lb, t = r["lower_bound"], r["test"]
        rows.append(
            f"| {name.removeprefix('pate-')} | {r['epsilon_upper']:.3f} | {lb['epsilon']:.3f} | "
            f"H = {r['neighbours']['H'][:2]}, H' = {r['neighbours']['H_prime'][:2]} | "
            f"output {'==' if t['when'] else '!='} {t['output']} | {lb['false_pos']} / {lb['n_out']}, "
            f"{lb['false_neg']} / {lb['n_in']} | {'**yes**' if r['exceeds_upper'] else 'no'} |"
        )
    head = ("| aggregator | ledger eps (one query) | lower bound (CP 95%) | neighbours (first two "
            "counts) | test | false pos, false neg | lower > ledger? |\n"
            "|---|---:|---:|---|---|---|---|")  # fmt: skip
    (OUT.parent / "pate_table.md").write_text(head + "\n" + "\n".join(rows) + "\n")
    print(head + "\n" + "\n".join(rows))


def table() -> None:
    rows, pts = [], []
    for name in [*MECHANISMS, DIST]:
        for eps in EPSILONS:
            f = OUT / f"{name}_eps{eps}" / "audit.json"
            if not f.is_file():
                continue
            r = json.loads(f.read_text())
            nominal = r.get("epsilon_nominal")
            lb = r["lower_bound"]["epsilon"]
            rows.append(
                f"| {name} | {eps} | {r['noise_multiplier']:.4f} | {lb:.3f} | {r['gdp']['epsilon']:.3f} "
                f"| {r['gdp']['mu']:.4f} | {r['epsilon_upper']:.4g} | "
                f"{'' if nominal is None else f'{nominal:.3f}'} | {r['trials']['in']}+{r['trials']['out']} "
                f"({r['trials']['mode']}) | {'**yes**' if r['exceeds_upper'] else 'no'}"
                f"{'' if nominal is None else (' (> nominal: **yes**)' if r['exceeds_nominal'] else ' (> nominal: no)')} |"
            )
            pts.append(
                (
                    name,
                    nominal if nominal is not None else r["epsilon_upper"],
                    lb,
                    r["gdp"]["epsilon"],
                )
            )
    head = ("| mechanism | target eps | z | lower bound (CP 95%) | mu-GDP fit eps | fitted mu | "
            "accountant eps | nominal eps | trials (in+out) | lower > accountant? |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---|")  # fmt: skip
    (OUT.parent / "table.md").write_text(head + "\n" + "\n".join(rows) + "\n")
    (OUT.parent / "figure_data.json").write_text(json.dumps(pts, indent=1) + "\n")
    plot(pts)


def plot(pts) -> None:
    """Lower bound (and mu-GDP fit) against the accountant's epsilon; identical series merged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple, list[str]] = {}
    for n in dict.fromkeys(p[0] for p in pts):
        key = tuple((round(p[1], 3), round(p[2], 3), round(p[3], 3)) for p in pts if p[0] == n)
        series.setdefault(key, []).append(n)
    fig, ax = plt.subplots(figsize=(7.5, 8))
    ax.plot([0.9, 8.5], [0.9, 8.5], "k-", lw=1, label="accountant epsilon (lower = upper)")
    for i, (key, names) in enumerate(series.items()):
        xs, lb, fit = zip(*key, strict=True)
        color = plt.cm.tab10(i)
        label = ", ".join(names)
        ax.plot(xs, lb, "o-", color=color, label=f"{label}: valid bound (CP 95%)")
        ax.plot(
            xs,
            [min(f, 13) for f in fit],
            "x:",
            color=color,
            label=f"{label}: mu-GDP fit (shown up to 13)",
        )
    ax.set_xlabel("accountant epsilon (DP-Hero: the paper's nominal epsilon)")
    ax.set_ylabel("measured epsilon (delta = 1e-5)")
    ax.set_ylim(0, 13)
    ax.set_title("White-box gradient-canary audit: one full-batch step, LeNet, 64 MNIST images")
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    fig.savefig(OUT.parent / "lower_vs_upper.png", dpi=120)


def main(argv: list[str] | None = None) -> int | None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["run", "dist", "onerun", "table", "pate"])
    ap.add_argument("--only")
    a = ap.parse_args(argv)
    jobs = {"run": lambda: run(a.only), "dist": dist, "onerun": onerun, "table": table}
    return {**jobs, "pate": pate}[a.what]()


if __name__ == "__main__":
    sys.exit(main())
