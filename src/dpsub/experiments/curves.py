"""Learning curves under a rendered table (a setting's ``curves: true``; docs/tables.md).

Per row (a cell of the setting, per variant), the metric at every evaluation its runs made
(``<split>/accuracy`` in metrics.jsonl: mean ± std [95% interval] over seeds), the same runs'
raw weights beside it where they scored them (``train.ema_eval=both``), and each row against
the table's baseline row at the same step (Welch, with the difference's interval): two
mechanisms are then compared along training, not only at its end. ``curves.png`` draws them.
A step enters a row only if every run of the row evaluated at it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from dpsub.experiments import stats, tables
from dpsub.rundir import RunDir

FIGURE = "curves.png"


def eval_curve(job: tables.Job, split: str, metric: str = "accuracy") -> dict[int, float]:
    """step -> the ``<split>/<metric>`` of each evaluation in a run's metrics.jsonl."""
    key = f"{split}/{metric}"
    return {int(m["step"]): m[key] for m in RunDir(job.dir).metrics() if key in m}


def split_of(table, setting: str) -> str:
    """The split a setting's runs evaluate: validation for tuning metrics, else test."""
    return "validation" if "validation" in table.metric_of(setting) else "test"


METRICS = ("accuracy", "raw_accuracy")  # the averaged (or only) weights, then the raw ones


def run_curves(job: tables.Job, split: str) -> dict[str, dict[int, float]]:
    """metric -> step -> value of each of a run's evaluations (its metrics.jsonl read once)."""
    records = RunDir(job.dir).metrics()
    keys = {m: f"{split}/{m}" for m in METRICS}
    return {m: {int(r["step"]): r[k] for r in records if k in r} for m, k in keys.items()}


def seed_curves(curves: list[dict[int, float]]) -> dict[int, list[float]]:
    """step -> each run's value there, in %, at the steps every run evaluated."""
    if not curves or not all(curves):
        return {}
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return {s: [100.0 * c[s] for c in curves] for s in steps}


def rows(table, found, setting: str) -> list[tuple[str, dict, str, dict[int, list[float]]]]:
    """(variant, cell, metric, step -> values) of every cell with curves: the averaged (or
    only) weights' ``accuracy``, then the raw weights' ``raw_accuracy`` where scored."""
    split, out = split_of(table, setting), []
    for variant in ("paper", "tuned"):
        for cell in table.cells(setting):
            jobs = found[variant].get(tables.cell_id(cell), [])
            runs = [run_curves(j, split) for j in jobs if RunDir(j.dir).metrics_path.is_file()]
            for metric in METRICS:
                curve = seed_curves([r[metric] for r in runs])
                if curve:
                    out.append((variant, cell, metric, curve))
    return out


def label(table, found, setting: str, variant: str, cell: dict, metric: str = "accuracy") -> str:
    """The row's name: its axes' labels, the variant, the raw weights and the simulated mark."""
    text = ", ".join(table.label(a, cell[a]) for a in table.axes_of(setting))
    raw = ", raw weights" if metric == "raw_accuracy" else ""
    return f"{text} ({variant}){raw}{tables.sim_mark(found, variant, cell)}"


def against_baseline(table, found, setting: str, found_rows) -> list[list[str]]:
    """Each averaged row minus the baseline row of its variant at the same steps: the row's
    label and one Welch comparison per step."""
    axis, ref = table.baseline
    by_key = {(v, tables.cell_id(c), m): curve for v, c, m, curve in found_rows}
    out = []
    for variant, cell, metric, curve in found_rows:
        if metric != "accuracy" or cell.get(axis) in (None, ref):
            continue
        ref_cell = {**cell, axis: ref}
        base = by_key.get((variant, tables.cell_id(ref_cell), metric))
        if base:
            ref_name = table.label(axis, ref) + tables.sim_mark(found, variant, ref_cell)
            name = f"*{label(table, found, setting, variant, cell)} − {ref_name}*"
            out.append([name, *[(s, stats.compare(base[s], curve[s])) for s in curve if s in base]])
    return out


def curve_lines(table, found, setting: str) -> list[str]:
    """The "Learning curves" section (empty unless the setting asks for it and runs have
    evaluations)."""
    if not table.setting(setting).curves:
        return []
    found_rows = rows(table, found, setting)
    if not found_rows:
        return []
    steps = sorted({s for *_, curve in found_rows for s in curve})
    head = [f"**Learning curves** ({split_of(table, setting)} accuracy, %, at each evaluation: "
            "mean ± std [95% interval] (seeds); *italic* rows: a row minus the "
            f"{table.label(*table.baseline)} row of the same variant at the same step [95% "
            f"Welch-Satterthwaite interval], Welch p, `{stats.TIE}` not significant at "
            f"{stats.ALPHA}; figure `{FIGURE}`):", "",
            "| row | " + " | ".join(f"step {s}" for s in steps) + " |",
            "|---" + "|---:" * len(steps) + "|"]  # fmt: skip
    body = []
    for variant, cell, metric, curve in found_rows:
        texts = [stats.summarize(curve[s]).text() if s in curve else "–" for s in steps]
        body.append(
            f"| {label(table, found, setting, variant, cell, metric)} | " + " | ".join(texts) + " |"
        )
    for name, *cmp in against_baseline(table, found, setting, found_rows):
        at = dict(cmp)
        texts = [at[s].text() if s in at else "–" for s in steps]
        body.append(f"| {name} | " + " | ".join(texts) + " |")
    return [*head, *body, ""]


def figure(table, found, setting: str, out: Path) -> list[Path]:
    """The figure :func:`plot` draws for this setting, if any."""
    wanted = table.setting(setting).curves and rows(table, found, setting)
    return [out / FIGURE] if wanted else []


def plot(table, found, setting: str, out: Path) -> list[Path]:
    """curves.png: each row's mean ± std against the step (raw weights dashed)."""
    found_rows = rows(table, found, setting) if table.setting(setting).curves else []
    if not found_rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    colors: dict[tuple, str] = {}
    for variant, cell, metric, curve in found_rows:
        color = colors.setdefault((variant, tables.cell_id(cell)), f"C{len(colors)}")
        summary = [stats.summarize(v) for v in curve.values()]
        raw = metric == "raw_accuracy"
        ax.errorbar(list(curve), [s.mean for s in summary], [s.std for s in summary],
                    fmt="s--" if raw else "o-", color=color,
                    alpha=0.5 if raw else 1.0, capsize=3,
                    label=label(table, found, setting, variant, cell, metric))  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel(f"{split_of(table, setting)} accuracy (%)")
    ax.set_title("\n".join(textwrap.wrap(table.title, 90)), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / FIGURE, dpi=120)
    plt.close(fig)
    return [out / FIGURE]
