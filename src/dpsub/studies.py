"""The tables of the results studies that are not paper tables (``results/<study>/``).

``render(study, runs)`` returns the Markdown table of ``results/<study>/README.md`` from the
run folders under ``runs`` (default ``results/<study>/runs``); ``collect(study, src)``
first copies the small files of the finished runs under ``src`` there (never checkpoints).
``python scripts/make_table.py --study <name> [--collect DIR]`` is the command line.

* ``speed``: GEP's test accuracy against the subspace cadence s, mean ± std [95% interval]
  over seeds, each row compared with the paper's procedure (s = 1, random starts) on the same
  dataset by a Welch test;
* ``rgp``: one row per run (mechanism x lr), held-out and test accuracy;
* ``dphero``: DP-Hero's scales and the membership-inference runs;
* ``pdpsgd``: Welch tests of the historical PDP-SGD study from its ``runs.csv``;
* ``pate``: the PATE rows of GEP's Table 1 beside the paper, both epsilons, the tuning
  grid (:mod:`dpsub.pate.study`; runs made by ``scripts/pate_study.py``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dpsub import stats
from dpsub.paths import project_root
from dpsub.runs import RunDir, find_runs

__all__ = ["STUDIES", "collect", "render", "study_dir"]


def study_dir(study: str) -> Path:
    return project_root() / "results" / study / "runs"


# ----------------------------------------------------------------- speed
def _speed_cell(run: RunDir) -> tuple[str, int, bool, int, dict]:
    cfg = run.config_dict()
    m = cfg["mechanism"]
    return cfg["dataset"]["name"], m["subspace_every"], m["warm_start"], cfg["seed"], run.summary()


def _speed_dest(run: RunDir) -> str:
    ds, s, warm, seed, _ = _speed_cell(run)
    return f"{ds}/seed{seed}/s{s}_{'warm' if warm else 'cold'}"


def speed(runs: Path) -> str:
    groups: dict[tuple, dict[int, float]] = defaultdict(dict)
    eps = []
    for run in find_runs(runs):
        ds, s, warm, seed, summary = _speed_cell(run)
        groups[(ds, s, warm)][seed] = 100 * summary["test_accuracy"]
        eps.append(summary["epsilon"])
    lines = [
        "| dataset | s | start of each refit | test accuracy (%) | per seed | vs s = 1, random |",
        "|---|---:|---|---:|---|---:|",
    ]
    for (ds, s, warm), accs in sorted(groups.items()):
        vals = [accs[k] for k in sorted(accs)]
        base = groups.get((ds, 1, False))
        vs = (
            "–"
            if (s, warm) == (1, False) or not base
            else stats.compare(list(base.values()), vals).text()
        )
        start = "previous basis" if warm else "random (the paper)"
        each = ", ".join(f"{a:.2f}" for a in vals)
        lines.append(f"| {ds} | {s} | {start} | {stats.summarize(vals).text()} | {each} | {vs} |")
    return "\n".join(lines) + f"\n\nEpsilon at most {max(eps):.4f} in every run.\n"


# ------------------------------------------------------------------- rgp
RGP_NAMES = {
    "dpsgd": "DP-SGD",
    "dppowersgd": "DP-PowerSGD",
    "rgp_random": "RGP-random",
    "rgp": "RGP",
}
#: Yu et al. (ICML 2021) Table 2: CIFAR-10 validation accuracy (%), WRN28-4, epsilon 8.
RGP_PAPER = {"dpsgd": 55.9, "dppowersgd": 57.1, "rgp_random": 51.0, "rgp": 63.4}


def _rgp_row(run: RunDir) -> tuple:
    cfg, s = run.config_dict(), run.summary()
    v = (run.json("validation.json") or {}).get("val_accuracy")
    return cfg["mechanism"], cfg["optim"]["lr"], s, v


def rgp(runs: Path) -> str:
    """One row per run; in each mechanism's lr grid, the best held-out accuracy is bold."""
    lines = [
        "| mechanism | rank | lr | held-out acc | test acc | epsilon | z | paper (Table 2) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [_rgp_row(r) for r in find_runs(runs)]
    for mech in RGP_NAMES:
        for ef in (False, True):
            grid = [
                r for r in rows if r[0]["name"] == mech and bool(r[0].get("error_feedback")) == ef
            ]
            best = max((r[3] for r in grid if r[3] is not None), default=None)
            for m, lr, s, v in sorted(grid, key=lambda r: r[1]):
                b = "**" if v is not None and v == best and len(grid) > 1 else ""
                val = "-" if v is None else f"{b}{100 * v:.2f}%{b}"
                label = RGP_NAMES[mech] + (" + error feedback" if ef else "")
                lines.append(
                    f"| {label} | {m.get('rank', '-')} | {lr} | {val} | "
                    f"{b}{100 * s['test_accuracy']:.2f}%{b} | {s['epsilon']:.3f} | "
                    f"{s['noise_multiplier']:.4f} | {RGP_PAPER[mech]}% |"
                )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- dphero
HERO_NAMES = {"dphero": "DP-Hero", "dphero_floor": "DP-Hero floor", "dpsgd": "DP-SGD"}


def _scales(metrics: list[dict]) -> str:
    """Smallest v_i / sigma over all layers (first -> last logged step); the largest, last."""
    lo = [m["mech/min_scale"] for m in metrics if "mech/min_scale" in m]
    hi = [m["mech/max_scale"] for m in metrics if "mech/max_scale" in m]
    return f"{lo[0]:.3g} -> {lo[-1]:.3g} | {hi[-1]:.3g}" if lo else "1 | 1"


def _mia_cell(mia: dict | None) -> str:
    if mia is None:
        return "-"
    return f"{100 * mia['success']:.2f}% [{100 * mia['ci_low']:.2f}, {100 * mia['ci_high']:.2f}]"


def dphero(runs: Path) -> str:
    lines = [
        "| sigma | mechanism | test acc | nominal epsilon | honest epsilon | "
        "min v_i/sigma (step 30 -> 3000) | max v_i/sigma | MIA success [95% CI] |",
        "|---:|---|---:|---:|---:|---|---:|---|",
    ]
    for sigma in (1, 3, 5):
        for mech in HERO_NAMES:
            run = RunDir(Path(runs) / f"lenet_{mech}_sigma{sigma}")
            if not run.finished:
                continue
            s = run.summary()
            nominal = s.get("epsilon_nominal", s["epsilon"])
            lines.append(
                f"| {sigma} | {HERO_NAMES[mech]} | {100 * s['test_accuracy']:.2f}% | {nominal:.3f} | "
                f"{s['epsilon']:.4g} | {_scales(run.metrics())} | {_mia_cell(run.json('mia.json'))} |"
            )
    lines += [
        "",
        "| run | mechanism | private set | epochs | epsilon | test acc | MIA success [95% CI] | "
        "n (eval half) |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for run in find_runs(runs):
        if not run.path.name.startswith("mia_"):
            continue
        s, cfg, mia = run.summary(), run.config_dict(), run.json("mia.json")
        eps = float(s["epsilon"])  # "inf" for the non-private run
        eps = "inf" if eps == float("inf") else f"{eps:.3f}"
        size = cfg["dataset"].get("train_size") or 60_000  # null: all of MNIST's training set
        lines.append(
            f"| {run.path.name} | {cfg['mechanism']['name']} | {size:,} | {cfg['train']['epochs']} "
            f"| {eps} | {100 * s['test_accuracy']:.2f}% | {_mia_cell(mia)} | "
            f"{mia['examples'] if mia else '-'} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- pdpsgd
def pdpsgd(runs: Path) -> str:
    """Welch tests of the historical PDP-SGD study (``results/pdpsgd/runs.csv``: one row per
    run; the run folders were not kept): each mechanism against DP-SGD per dataset and sigma."""
    import csv

    cells: dict[tuple, list[float]] = defaultdict(list)
    with open(Path(runs).parent / "runs.csv") as f:
        for r in csv.DictReader(f):
            cells[(r["dataset"], r["mechanism"], float(r["sigma"]))].append(100 * float(r["final"]))
    lines = ["| dataset | sigma | PDP-SGD - DP-SGD | RPDP-SGD - DP-SGD |", "|---|---:|---|---|"]
    names = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}
    for ds in names:
        for sigma in sorted({k[2] for k in cells if k[0] == ds}, reverse=True):
            base = cells[(ds, "dpsgd", sigma)]
            vs = [stats.compare(base, cells[(ds, m, sigma)]).text() for m in ("pdpsgd", "rpdpsgd")]
            lines.append(f"| {names[ds]} | {sigma:g} | {vs[0]} | {vs[1]} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ pate
def pate(runs: Path) -> str:
    from dpsub.pate.study import render

    return render(runs)


# ------------------------------------------------------------------ API
#: study -> (table renderer, where a collected run goes under runs/ (None: its dir name),
#: which collected runs belong to it)
STUDIES = {
    "speed": (speed, _speed_dest, lambda r: True),
    "rgp": (rgp, None, lambda r: True),
    "dphero": (dphero, None, lambda r: r.path.name.startswith(("lenet_", "mia_"))),
    "pdpsgd": (pdpsgd, None, lambda r: False),  # the historical study: runs.csv only
    "pate": (pate, None, lambda r: False),  # scripts/pate_study.py copies its own runs
}


def render(study: str, runs: Path | None = None) -> str:
    return STUDIES[study][0](Path(runs) if runs else study_dir(study))


def collect(study: str, src: Path, runs: Path | None = None) -> int:
    """Copy the small files of every finished run under ``src``; returns how many."""
    _, dest_of, keep = STUDIES[study]
    base = Path(runs) if runs else study_dir(study)
    found = [r for r in find_runs(src) if keep(r)]
    for run in found:
        run.copy_small_files(base / (dest_of(run) if dest_of else run.path.name))
    return len(found)
