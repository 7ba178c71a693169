"""Render a paper table from its runs: measured mean +- std beside the paper's value, as
Markdown, and PNG figures.

    python scripts/make_table.py gep1-mnist --setting cpu          # outputs/tables -> results/tables
    python scripts/make_table.py gep1-mnist --setting cpu --runs results/tables   # re-render

Reads the runs ``scripts/reproduce.py`` made (``<runs>/<table>/<setting>/{paper,tune,tuned}/``)
and writes ``<out>/<table>/<setting>/``: ``README.md`` (the table, the tuning grid and its
picks, the setting, commit, commands, hardware), ``accuracy.png`` (the metric against the
table's column / x axis, one line per row, the paper's values dashed) and, where GEP or
B-GEP runs have checkpoints, ``projection.png``: the relative projection error of
test-set gradients of the final model onto its final anchor subspace. That error is
computed here from the model and the test set, never from the private training data
(the private-batch error a run logs with ``privacy.private_diagnostics=true`` is not
covered by its epsilon). Each run's config.yaml, summary.json and metrics.jsonl (and the
cached public_projection.json) are copied beside the table, checkpoints are not.

Override arguments (``train.epochs=3``) select the folder of runs reproduce.py made with
the same overrides. A missing table or setting is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import dpsub  # noqa: F401
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(ROOT / "src"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpsub import tables  # noqa: E402
from dpsub.errors import ConfigError  # noqa: E402
from dpsub.paths import project_root  # noqa: E402

COPIED = ("config.yaml", "summary.json", "metrics.jsonl", "public_projection.json")
PROJECTION = "public_projection.json"


def die(msg: str) -> None:
    print(f"make_table: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# --------------------------------------------------------------- collect
def collect(table: tables.Table, args) -> dict[str, dict[str, list[tables.Job]]]:
    """variant -> cell id -> finished jobs."""
    kw = dict(extra=args.extra)
    tune_jobs = tables.plan_jobs(table, args.setting, args.runs, "tune", **kw) if table.tune else []
    picks = tables.pick_best(table, tune_jobs) if tune_jobs else {}
    by_variant = {
        "paper": tables.plan_jobs(table, args.setting, args.runs, "paper", **kw),
        "tuned": tables.plan_jobs(
            table,
            args.setting,
            args.runs,
            "tuned",
            picks={c: p["overrides"] for c, p in picks.items()},
            **kw,
        ),  # fmt: skip
        "tune": tune_jobs,
    }
    out = {}
    for variant, jobs in by_variant.items():
        cells: dict[str, list[tables.Job]] = {}
        for j in jobs:
            if j.finished:
                cells.setdefault(tables.cell_id(j.cell), []).append(j)
        out[variant] = cells
    out["picks"] = picks
    return out


def metric_values(table: tables.Table, jobs: list[tables.Job]) -> list[float]:
    """The table's metric of each run, in % for accuracies."""
    vals = [tables.read_summary(j.dir).get(table.metric) for j in jobs]
    scale = 100.0 if "accuracy" in table.metric else 1.0
    return [scale * v for v in vals if isinstance(v, (int, float))]


# ----------------------------------------------------------- projection
def public_projection(run_dir: Path, data_root: str | None, n: int) -> dict | None:
    """Relative projection error of ``n`` test examples' gradients (final model) onto the
    run's final anchor subspace; cached in the run dir. None without a checkpoint/basis."""
    cache = run_dir / PROJECTION
    if cache.is_file():
        return json.loads(cache.read_text())
    if not (run_dir / "checkpoint.pt").is_file():
        return None
    import torch
    from omegaconf import OmegaConf

    from dpsub.training.checkpoint import load_checkpoint
    from dpsub.training.run import build_run, load_run_state

    cfg = OmegaConf.load(run_dir / "config.yaml")
    if data_root:
        cfg.data.root = data_root
    if cfg.dataset.get("validation_size") or cfg.mechanism.name not in ("gep", "bgep"):
        return None  # a tuning run evaluates on private examples; no anchor subspace
    run = build_run(cfg)
    load_run_state(run, load_checkpoint(run_dir, map_location=run.device)["state"])
    basis = run.mechanism.basis
    x, y = run.data.test_x[:n], run.data.test_y[:n]
    g_sum = torch.zeros(basis.dim, device=x.device)
    r_sum = torch.zeros_like(g_sum)
    row_err = []
    for chunk in run.engine.per_example(x, y):
        g_sum += chunk.grads.sum(0)
        res = basis.residual(chunk.grads)
        r_sum += res.sum(0)
        row_err.append(res.norm(dim=1) / chunk.grads.norm(dim=1).clamp_min(1e-12))
    out = {
        "mean_gradient": float(r_sum.norm() / g_sum.norm().clamp_min(1e-12)),
        "per_example_mean": float(torch.cat(row_err).mean()),
        "n_test_examples": int(x.shape[0]),
        "k": int(basis.k),
        "what": "||residual|| / ||gradient|| of test-set gradients of the final model on the "
        "final anchor subspace (public data: not the private training set)",
    }
    cache.write_text(json.dumps(out, indent=1))
    return out


def projections(table, found, args) -> dict[str, list[float]]:
    """variant/cell id -> public projection errors of the mean test gradient (per seed)."""
    out: dict[str, list[float]] = {}
    for variant in ("paper", "tuned"):
        for cid, jobs in found[variant].items():
            for j in jobs:
                p = public_projection(j.dir.resolve(), args.data_root, args.projection_examples)
                if p is not None:
                    out.setdefault(f"{variant}/{cid}", []).append(p["mean_gradient"])
    return out


# -------------------------------------------------------------- markdown
def row_axes(table: tables.Table) -> list[str]:
    col = table.layout.get("columns") or table.layout.get("x")
    return [a for a in table.axes if a != col]


def col_axis(table: tables.Table) -> str | None:
    return table.layout.get("columns") or table.layout.get("x")


def fmt(mean: float, std: float, n: int) -> str:
    if n <= 1:  # no spread from a single seed
        return "–" if n == 0 else f"{mean:.2f} (1)"
    return f"{mean:.2f} ± {std:.2f} ({n})"


def cell_text(table, found, variant, cell) -> tuple[str, str, str]:
    """(measured, paper, difference) of one cell."""
    mean, std, n = tables.seed_stats(
        metric_values(table, found[variant].get(tables.cell_id(cell), []))
    )
    entry = table.paper_cell(cell)
    paper = entry.get("value") if entry else None
    ptxt = (
        "–"
        if paper is None
        else f"{paper:g}" + (f" ± {entry['std']:g}" if entry.get("std") else "")
    )
    diff = "–" if paper is None or n == 0 else f"{mean - paper:+.2f}"
    return fmt(mean, std, n), ptxt, diff


def markdown_table(table, found, setting: str) -> list[str]:
    col = col_axis(table)
    cells = table.cells(setting)
    cols = list(dict.fromkeys(c[col] for c in cells)) if col else [None]
    head = ["mechanism / setting"]
    for v in cols:
        name = table.label(col, v) if col else ""
        head += [f"{name} measured", f"{name} paper", "Δ"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    rows = list(dict.fromkeys(tuple((a, c[a]) for a in row_axes(table)) for c in cells))
    for variant in ("paper", "tuned"):
        if variant == "tuned" and not found["tuned"]:
            continue
        for r in rows:
            label = ", ".join(table.label(a, v) for a, v in r)
            label += " (tuned)" if variant == "tuned" else " (paper's hyper-parameters)"
            texts = []
            for v in cols:
                cell = {**dict(r), **({col: v} if col else {})}
                texts += cell_text(table, found, variant, {a: cell[a] for a in table.axes})
            lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return lines


def tuning_lines(table, found) -> list[str]:
    if not found["tune"]:
        return []
    t = table.tune
    n_runs = sum(len(v) for v in found["tune"].values())
    lines = [
        "## Tuning",
        "",
        f"Grid, the same for every mechanism: lr in {t.lr} x the clip settings below; each point "
        f"trained once (seed {t.seed}) on the private set minus {t.validation_size} held-out "
        "training examples and scored on those (the test set is not used). "
        f"**{n_runs} tuning runs**; their privacy cost is **not** included in the epsilons "
        "reported (as in the papers).",
        "",
        "| cell | lr | clip | validation accuracy (%) | picked |",
        "|---|---:|---|---:|---|",
    ]
    for cid, jobs in found["tune"].items():
        pick = found["picks"].get(cid)
        for j in jobs:
            lr, ci = j.point
            acc = 100 * tables.read_summary(j.dir).get("validation_accuracy", math.nan)
            clip = " ".join(t.clip[j.cell["mechanism"]][ci])
            chosen = "**yes**" if pick and (pick["lr"], pick["clip"]) == (lr, ci) else ""
            lines.append(f"| {cid} | {lr:g} | `{clip}` | {acc:.2f} | {chosen} |")
    return lines + [""]


# ---------------------------------------------------------------- figures
def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


def _dodge(ax, xs: list, n: int):
    """With a single x value (a reduced setting), series ``j`` of ``n`` is drawn beside the
    others instead of on top of them; ``shift(j, x)`` is where its points go."""
    if len(xs) != 1:
        return lambda j, x: x
    x0, width = float(xs[0]), 0.1 * max(abs(float(xs[0])), 1.0)
    ax.set_xlim(x0 - width, x0 + width)
    ax.set_xticks([x0])
    step = 1.6 * width / max(n, 1)
    return lambda j, x: x + (j - (n - 1) / 2) * step


def plot_metric(table, found, setting: str, proj: dict, out: Path) -> list[Path]:
    """accuracy.png (metric vs column/x axis per row) and, with data, projection.png."""
    col = col_axis(table)
    cells = table.cells(setting)
    if col is None or not _numeric([c[col] for c in cells]):
        return []
    rows = list(dict.fromkeys(tuple((a, c[a]) for a in row_axes(table)) for c in cells))
    xs = list(dict.fromkeys(c[col] for c in cells))
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    shift = _dodge(ax, xs, 3 * len(rows))
    for i, r in enumerate(rows):
        color = f"C{i}"
        label = ", ".join(table.label(a, v) for a, v in r)
        for j, (variant, style) in enumerate((("paper", "o-"), ("tuned", "s:"))):
            pts = []
            for x in xs:
                cell = {**dict(r), col: x}
                m, s, n = tables.seed_stats(
                    metric_values(table, found[variant].get(tables.cell_id(cell), []))
                )
                if n:
                    pts.append((shift(3 * i + j, x), m, s))
            if pts:
                suffix = ": tuned" if variant == "tuned" else ": paper's hyper-parameters"
                ax.errorbar(
                    *zip(*pts, strict=True), fmt=style, color=color, capsize=3, label=label + suffix
                )
        ppts = [(shift(3 * i + 2, x), e["value"]) for x in xs
                if (e := table.paper_cell({**dict(r), col: x})) and e.get("value") is not None]  # fmt: skip
        if ppts:
            ax.plot(
                *zip(*ppts, strict=True),
                "x--",
                color=color,
                alpha=0.6,
                label=f"{label}: paper's value",
            )
    ax.set_xlabel(table.label("_axis", col))
    ax.set_ylabel(f"{table.metric} (%)" if "accuracy" in table.metric else table.metric)
    ax.set_title(table.title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)
    written.append(out / "accuracy.png")
    if proj:
        written.append(plot_projection(table, proj, rows, xs, col, out))
    return written


def plot_projection(table, proj, rows, xs, col, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    shift = _dodge(ax, xs, 2 * len(rows))
    for i, r in enumerate(rows):
        for j, (variant, style) in enumerate((("paper", "o-"), ("tuned", "s:"))):
            pts = []
            for x in xs:
                vals = proj.get(f"{variant}/{tables.cell_id({**dict(r), col: x})}", [])
                if vals:
                    m, s, _ = tables.seed_stats(vals)
                    pts.append((shift(2 * i + j, x), m, s))
            if pts:
                label = ", ".join(table.label(a, v) for a, v in r)
                label += " (tuned)" if variant == "tuned" else ""
                ax.errorbar(
                    *zip(*pts, strict=True), fmt=style, color=f"C{i}", capsize=3, label=label
                )
    ax.set_xlabel(table.label("_axis", col))
    ax.set_ylabel("relative projection error (test-set gradient)")
    ax.set_title("final model, final anchor subspace; public (test) data", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "projection.png", dpi=120)
    plt.close(fig)
    return out / "projection.png"


# ------------------------------------------------------------ provenance
def git_commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10)

    try:
        rev = git("rev-parse", "--short", "HEAD").stdout.strip()
        dirty = git("status", "--porcelain", "-uno").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev + ("-dirty" if dirty else "")) or "unknown"


def hardware() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"{cpu}, {os.cpu_count()} cores; GPU: {gpu}; torch {torch.__version__}"


def train_hours(found) -> tuple[float, int]:
    """Wall-clock training time summed over the runs (from metrics.jsonl's steps_per_s)."""
    total, seen = 0.0, set()
    for variant in ("paper", "tuned", "tune"):
        for jobs in found[variant].values():
            for j in jobs:
                if j.dir.resolve() in seen:  # a reused run counts once
                    continue
                seen.add(j.dir.resolve())
                last = 0
                for line in (j.dir / "metrics.jsonl").read_text().splitlines():
                    row = json.loads(line)
                    if row.get("steps_per_s"):
                        total += (row["step"] - last) / row["steps_per_s"]
                        last = row["step"]
    return total / 3600, len(seen)


def header(table, args, found) -> list[str]:
    setting = table.setting(args.setting)
    hours, n = train_hours(found)
    extra = " ".join(args.extra)
    tune = " --tune" if found["tune"] else ""
    cmd = f"python scripts/reproduce.py {table.name} --setting {args.setting}{tune}"
    cmd += f" {extra}" if extra else ""
    return [
        f"# {table.title}",
        "",
        f"Source: {table.source}",
        "",
        f"**Setting `{args.setting}`**: {setting.note}"
        + (f" Overrides: `{extra}`." if extra else ""),
        "",
        *[line for note in args.note for line in (f"> **Note.** {note}", "")],
        f"- commit: `{git_commit()}`; rendered {dt.datetime.now().isoformat(timespec='minutes')}",
        f"- runs: `{cmd}` (OMP_NUM_THREADS=1), then `python scripts/make_table.py {table.name} "
        f"--setting {args.setting}`",
        f"- hardware: {hardware()}",
        f"- {n} runs, {hours:.2f} h of training wall-clock in total",
        "",
        "Cells: mean ± sample std over seeds (number of seeds); Δ = measured mean minus the paper.",
        "",
    ]


# ------------------------------------------------------------------ main
def copy_runs(found, dest: Path) -> None:
    for variant in ("paper", "tuned", "tune"):
        for jobs in found[variant].values():
            for j in jobs:
                target = dest / variant / j.name
                if target.resolve() == j.dir.resolve():
                    continue
                target.mkdir(parents=True, exist_ok=True)
                for name in COPIED:
                    if (j.dir / name).is_file():
                        shutil.copyfile(j.dir / name, target / name)


def render(table, args) -> Path:
    found = collect(table, args)
    if not any(found[v] for v in ("paper", "tuned")):
        die(
            f"no finished runs of {table.name} under {tables.setting_dir(args.runs, table, args.setting, args.extra)}"
        )
    dest = tables.setting_dir(args.out, table, args.setting, args.extra)
    dest.mkdir(parents=True, exist_ok=True)
    proj = {} if args.no_projection else projections(table, found, args)
    copy_runs(found, dest)
    lines = header(table, args, found) + markdown_table(table, found, args.setting) + [""]
    figs = plot_metric(table, found, args.setting, proj, dest)
    lines += [f"![{f.stem}]({f.name})" for f in figs] + [""]
    if proj:
        lines += ["Projection error: " + PROJECTION_NOTE, ""]
    lines += tuning_lines(table, found)
    lines += [f"- {n}" for n in table.notes]
    (dest / "README.md").write_text("\n".join(lines).rstrip() + "\n")
    return dest


PROJECTION_NOTE = (
    "relative projection error ||r|| / ||g|| of the mean gradient of 1000 test examples, final "
    "model, onto the run's final anchor subspace (computed by make_table.py from the "
    "checkpoint; public data, so not a privacy cost)."
)


def parse(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("table")
    p.add_argument("overrides", nargs="*", help="the run-changing overrides given to reproduce.py")
    p.add_argument("--setting", default="paper")
    p.add_argument(
        "--runs", type=Path, default=project_root() / "outputs" / "tables", help="runs root"
    )
    p.add_argument(
        "--out", type=Path, default=project_root() / "results" / "tables", help="output root"
    )
    p.add_argument("--no-projection", action="store_true", help="skip the projection errors")
    p.add_argument("--data-root", default=None, help="data.root for the projection errors")
    p.add_argument("--projection-examples", type=int, default=1000)
    p.add_argument("--note", action="append", default=[],
                   help="a paragraph for the rendered README, e.g. how the runs were made")  # fmt: skip
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from dpsub.training.checkpoint import may_change

    args.extra = [o for o in args.overrides if not may_change(o.lstrip("+~").split("=")[0])
                  and not o.startswith("hydra")]  # fmt: skip
    try:
        table = tables.load_table(args.table)
        table.setting(args.setting)
    except ConfigError as e:
        die(str(e))
    dest = render(table, args)
    print(f"wrote {dest / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
