"""Render a paper table from its runs: measured mean +- std beside the paper's value, as
Markdown, and PNG figures.

    python scripts/make_table.py gep1-mnist --setting cpu   # outputs/tables -> results/tables

Without ``outputs/tables/<table>/<setting>`` (a fresh clone) it re-renders from the runs
committed in ``results/tables``, keeping the commit, date, hardware and notes recorded in
``provenance.json`` at the first render (``--restamp`` replaces them, for new runs).
Cells are mean ± std with a 95% t-interval; every mechanism is compared with GP (DP-SGD)
of the same variant and column by a two-sided Welch test (``≈``: not significant at 0.05).

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

``--study speed|rgp|dphero|pate [--collect DIR]`` prints the table of ``results/<study>/README.md``
from ``results/<study>/runs`` (``dpsub.experiments.studies``), after copying in the finished runs under DIR.

Override arguments (``train.epochs=3``) select the folder of runs reproduce.py made with
the same overrides. A missing table or setting is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dpsub.errors import ConfigError
from dpsub.experiments import curves, private_tables, stats, studies, tables
from dpsub.experiments.commands import how_to_run
from dpsub.experiments.curves import eval_curve, split_of
from dpsub.paths import project_root
from dpsub.privacy.simulate import NOT_A_GUARANTEE
from dpsub.rundir import CHECKPOINT, NOT_RECORDED, SUMMARY, RunDir, provenance

PROJECTION = "public_projection.json"
PROVENANCE = "provenance.json"


def die(msg: str) -> None:
    print(f"make_table: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# --------------------------------------------------------------- collect
def plan(table: tables.Table, args, variant: str, **kw) -> list[tables.Job]:
    """The variant's jobs under ``args.runs``; a job not finished there is taken from the
    committed runs in ``args.out`` when it is finished there (``make table`` on a clone whose
    outputs/tables holds only the jobs it re-ran or linked renders the whole table)."""
    jobs, committed = _both(args, lambda root: tables.plan_jobs(
        table, args.setting, root, variant, extra=args.extra, **kw))  # fmt: skip
    if committed is None:
        return jobs
    # matched by run directory, not by position: a tuning grid is extended only where all of
    # a cell's points are finished, so each plan can hold jobs the other lacks (the union)
    done = {Path(c.dir).relative_to(args.out): c for c in committed if c.finished}
    rel = [Path(j.dir).relative_to(args.runs) for j in jobs]
    merged = [j if j.finished else done.get(r, j) for j, r in zip(jobs, rel, strict=True)]
    planned = set(rel)
    return merged + [c for r, c in done.items() if r not in planned]


def _both(args, make):
    """``make(args.runs)``, and ``make(args.out)`` when a committed ``args.out`` other than the
    runs folder is given (else None): the plan where runs are made and the committed one."""
    out = getattr(args, "out", None)
    if out is None or Path(out).resolve() == Path(args.runs).resolve():
        return make(args.runs), None
    return make(args.runs), make(out)


def collect(table: tables.Table, args) -> dict[str, dict[str, list[tables.Job]]]:
    """variant -> cell id -> finished jobs."""
    has_tune = table.tune_of(args.setting) is not None
    tune_jobs = plan(table, args, "tune") if has_tune else []
    picks = tables.pick_best(table, tune_jobs) if tune_jobs else {}
    by_variant = {
        "paper": plan(table, args, "paper"),
        "tuned": plan(table, args, "tuned", picks={c: p["overrides"] for c, p in picks.items()}),
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
    out["searches"] = private_searches(table, args)
    out["private"] = private_tables.collect(out["searches"])
    return out


def private_searches(table: tables.Table, args) -> list:
    """The ``--private-tune`` searches under ``args.runs``, a finished one from the committed
    ``args.out`` where the runs lack it (as :func:`plan`; a search's grid is fixed, so the two
    plans match by position)."""
    if table.tune_of(args.setting) is None:
        return []
    searches, committed = _both(args, lambda root: private_tables.plan_searches(
        table, args.setting, root, args.extra))  # fmt: skip
    if committed is None:
        return searches
    return [s if s.finished else c for s, c in zip(searches, committed, strict=True)]


def simulation_marks(table: tables.Table, found, setting: str) -> dict[str, list[tuple]]:
    """variant/cell id -> (reference, own epsilon) of each run, for the cells whose runs
    draw a simulated noise level (privacy.simulate: not a privacy guarantee). ConfigError
    for a cell that mixes simulated and real runs, and for simulated runs in a setting not
    marked ``simulated: true`` (their table would not say what they are)."""
    marks = {}
    for variant in ("paper", "tuned", "tune"):
        for cid, jobs in found[variant].items():
            runs = [tables.read_summary(j.dir) for j in jobs]
            sims = [r.get("simulated") for r in runs]
            n = sum(x is not None for x in sims)
            if n and n != len(sims):
                raise ConfigError(f"{variant}/{cid}: {n} of {len(sims)} runs draw a simulated "
                                  "noise level (privacy.simulate), the others do not")  # fmt: skip
            if n:
                marks[f"{variant}/{cid}"] = [(r["simulated"], r.get("epsilon")) for r in runs]
    if marks and not table.setting(setting).simulated:
        raise ConfigError(
            f"setting {setting}: {next(iter(marks))} holds runs at a simulated noise level "
            f"({NOT_A_GUARANTEE}); mark the setting `simulated: true` in its table file so the "
            "rendered table says so"
        )
    return marks


def simulation_note(marks: dict[str, list[tuple]]) -> list[str]:
    """The rendered table's warning, one line per simulated reference."""
    if not marks:
        return []
    refs: dict[tuple, list[float]] = {}
    for pairs in marks.values():
        for sim, own in pairs:
            key = (sim["run_batch_size"], sim["batch_size"], sim["noise_multiplier_ref"],
                   sim["epsilon_ref"], sim["delta_ref"], sim["dataset_size_ref"])  # fmt: skip
            refs.setdefault(key, []).append(own)
    lines = [f"> **{NOT_A_GUARANTEE[0].upper()}{NOT_A_GUARANTEE[1:]}.** Cells marked "
             f"*{tables.SIM_MARK.strip()}* come from runs that drew the noise of a larger reference "
             "batch on their mean gradient (privacy.simulate); the reference's epsilon only "
             "names that noise level and covers none of them:"]  # fmt: skip
    for (b, b_ref, z_ref, eps_ref, delta, n_ref), own in refs.items():
        lines.append(
            f"> - batch {b} drawing the noise of batch {b_ref} at z_ref {z_ref:.4g} (epsilon "
            f"{eps_ref:.3g}, delta {delta:g}, N {n_ref}); the runs' own epsilon, from the "
            f"noise they drew: {span(own)}"
        )
    return [*lines, ""]


def span(values: list[float]) -> str:
    lo, hi = f"{min(values):.3g}", f"{max(values):.3g}"
    return lo if lo == hi else f"{lo}-{hi}"


def metric_values(table: tables.Table, jobs: list[tables.Job]) -> list[float]:
    """The table's metric of each run, in % for accuracies."""
    metric = table.metric_of(jobs[0].setting) if jobs else table.metric
    vals = [tables.read_summary(j.dir).get(metric) for j in jobs]
    scale = 100.0 if "accuracy" in metric else 1.0
    return [scale * v for v in vals if isinstance(v, (int, float))]


# ----------------------------------------------------------- projection
def public_projection(
    run_dir: Path, data_root: str | None, n: int, compute: bool = True
) -> dict | None:
    """Relative projection error of ``n`` test examples' gradients (final model) onto the
    run's final anchor subspace; cached in the run dir. None without a checkpoint/basis, or
    (``compute=False``: a dry run) without the cache."""
    cache = run_dir / PROJECTION
    if cache.is_file():
        return json.loads(cache.read_text())
    if not compute or not (run_dir / CHECKPOINT).is_file():
        return None
    import torch

    from dpsub.config import typed_group
    from dpsub.training.build import load_finished_run

    cfg = RunDir(run_dir).config()
    tuning = typed_group("dataset", cfg.dataset).validation_size
    if tuning or cfg.mechanism.name not in ("gep", "bgep"):
        return None  # a tuning run evaluates on private examples; no anchor subspace
    run = load_finished_run(run_dir, data_root)
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


def projections(table, found, args, compute: bool = True) -> dict[str, list[float]]:
    """variant/cell id -> public projection errors of the mean test gradient (per seed);
    ``compute=False``: the cached ones only (a dry run writes nothing)."""
    out: dict[str, list[float]] = {}
    for variant in ("paper", "tuned"):
        for cid, jobs in found[variant].items():
            for j in jobs:
                where = j.dir.resolve()
                p = public_projection(where, args.data_root, args.projection_examples, compute)
                if p is not None:
                    out.setdefault(f"{variant}/{cid}", []).append(p["mean_gradient"])
    return out


# -------------------------------------------------------------- markdown
def row_axes(table: tables.Table, setting: str = "paper") -> list[str]:
    col = table.layout.get("columns") or table.layout.get("x")
    return [a for a in table.axes_of(setting) if a != col]


def col_axis(table: tables.Table) -> str | None:
    return table.layout.get("columns") or table.layout.get("x")


BASELINE_AXIS, BASELINE = "mechanism", "dpsgd"  # the default baseline (a table's `baseline`)


def cell_values(table, found, variant, cell) -> list[float]:
    return metric_values(table, found[variant].get(tables.cell_id(cell), []))


def cell_text(table, found, variant, cell) -> list[str]:
    """(measured, paper, difference, vs GP) of one cell."""
    vals = cell_values(table, found, variant, cell)
    s = stats.summarize(vals)
    entry = table.paper_cell(cell)
    paper = entry.get("value") if entry else None
    ptxt = (
        "–"
        if paper is None
        else f"{paper:g}" + (f" ± {entry['std']:g}" if entry.get("std") else "")
    )
    diff = "–" if paper is None or s.n == 0 else f"{s.mean - paper:+.2f}"
    vs = "–"
    axis, ref = table.baseline
    if cell.get(axis) not in (None, ref) and s.n:
        base = cell_values(table, found, variant, {**cell, axis: ref})
        if base:
            vs = stats.compare(base, vals).text()
    return [s.text() + tables.sim_mark(found, variant, cell), ptxt, diff, vs]


def markdown_table(table, found, setting: str) -> list[str]:
    col = col_axis(table)
    cells = table.cells(setting)
    cols = list(dict.fromkeys(c[col] for c in cells)) if col else [None]
    head = ["mechanism / setting"]
    for v in cols:
        name = table.label(col, v) if col else ""
        head += [f"{name} measured", f"{name} paper", "Δ", f"{name} vs {baseline_label(table)}"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    rows = list(dict.fromkeys(tuple((a, c[a]) for a in row_axes(table, setting)) for c in cells))
    for variant in ("paper", "tuned"):
        if not found[variant]:
            continue
        for r in rows:
            label = ", ".join(table.label(a, v) for a, v in r)
            label += " (tuned)" if variant == "tuned" else " (paper's hyper-parameters)"
            texts = []
            for v in cols:
                cell = {**dict(r), **({col: v} if col else {})}
                axes = table.axes_of(setting)
                texts += cell_text(table, found, variant, {a: cell[a] for a in axes})
            lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return lines


def verdict_lines(table, found, setting: str) -> list[str]:
    """What the Welch tests say, one line per variant and column: every row against the
    baseline (significant or **not significant**) and whether the paper orders the two the
    same way; computed from the runs like the table, so it cannot drift from it."""
    axis, ref = table.baseline
    col, base = col_axis(table), baseline_label(table)
    out = []
    for variant in ("paper", "tuned"):
        by_col: dict = {}
        for cell in table.cells(setting):
            if cell.get(axis) in (None, ref):
                continue
            text = verdict(table, found, variant, cell, base, setting)
            if text:
                by_col.setdefault(column_name(table, cell, col, axis), []).append(text)
        tag = "tuned" if variant == "tuned" else "the paper's hyper-parameters"
        out += [f"- {c + ', ' if c else ''}{tag}: " + "; ".join(t) + "." for c, t in by_col.items()]
    head = f"**What the runs say** (Welch, {stats.ALPHA}; the paper's difference beside it):"
    return [head, "", *out, ""] if out else []


def check_lines(table, found, setting: str) -> list[str]:
    """The setting's scaling check (``check: {axis, reference, steps, n}``), as its note
    states it: per row, accepted when at every step the reference run's accuracy p lies in
    the other runs' [min, max] widened by sqrt(p (1 - p) / n) on both sides."""
    chk = table.setting(setting).check
    if not chk:
        return []
    axis, ref = chk["axis"], chk["reference"]
    split = split_of(table, setting)
    out = [f"**Scaling check** ({split} accuracy, %, at steps {chk['steps']}; {axis} = "
           f"{table.label(axis, ref)} against the others' seeds, widened by sqrt(p (1 - p) / "
           f"{chk['n']})):", "", "| cell | step | reference p | others (seeds) | interval | inside |",
           "|---|---:|---:|---|---|---|"]  # fmt: skip
    verdicts = []
    for cell in table.cells(setting):
        if cell[axis] == ref:
            continue
        label = ", ".join(table.label(a, cell[a]) for a in row_axes(table, setting))
        ref_jobs = found["paper"].get(tables.cell_id({**cell, axis: ref}), [])
        jobs = found["paper"].get(tables.cell_id(cell), [])
        if not ref_jobs or len(jobs) < 2:
            verdicts.append(f"{label}: waiting for runs")
            continue
        rows, word = check_row(label, eval_curve(ref_jobs[0], split),
                               [eval_curve(j, split) for j in jobs], chk)  # fmt: skip
        out += rows
        verdicts.append(f"{label}: {word}")
    return [*out, "", *[f"- {v}" for v in verdicts], ""]


def raw_final(job: tables.Job, split: str) -> float | None:
    """A run's last ``<split>/raw_accuracy`` (the raw weights beside the averaged ones:
    ``train.ema_eval=both``), in %; None without one."""
    if not RunDir(job.dir).metrics_path.is_file():
        return None
    curve = eval_curve(job, split, "raw_accuracy")
    return 100.0 * curve[max(curve)] if curve else None


def ema_lines(table, found, setting: str) -> list[str]:
    """Parameter averaging, where the runs also scored their raw weights: per cell, the
    averaged weights' final accuracy against the raw weights' of the same runs (paired)."""
    split, out = split_of(table, setting), []
    for variant in ("paper", "tuned"):
        for cell in table.cells(setting):
            jobs = found[variant].get(tables.cell_id(cell), [])
            pairs = [(raw_final(j, split), metric_values(table, [j])) for j in jobs]
            pairs = [(r, v[0]) for r, v in pairs if r is not None and v]
            if not pairs:
                continue
            c = stats.paired([r for r, _ in pairs], [e for _, e in pairs])
            raw, avg = (stats.summarize([p[i] for p in pairs]).text() for i in (0, 1))
            label = ", ".join(table.label(a, cell[a]) for a in table.axes_of(setting))
            out.append(f"| {label} ({variant}) | {avg} | {raw} | {c.text()} |")
    if not out:
        return []
    head = [f"**Parameter averaging** ({split} accuracy, %: the averaged weights against the raw "
            f"weights of the same runs, paired t-test, {stats.ALPHA}; the mean difference [its "
            "95% interval]):", "",
            "| row | averaged | raw | averaged - raw |", "|---|---:|---:|---:|"]  # fmt: skip
    return [*head, *out, ""]


def compare_lines(table, args, found, setting: str) -> list[str]:
    """The setting's rows against rows of other settings (``compare``), one Welch test each:
    a reference takes the row's values of the axes its ``cell`` does not name."""
    refs = table.setting(setting).compare
    if not refs:
        return []
    out = [f"**Against other settings** (Welch, {stats.ALPHA}; Δ = this row minus the "
           "reference [95% interval]):", "", "| row | this setting | reference | reference value | Δ | p |",
           "|---|---:|---|---:|---:|---:|"]  # fmt: skip
    for ref in refs:
        other = collect(table, argparse.Namespace(**{**vars(args), "setting": ref["setting"]}))
        ref_axes = table.axes_of(ref["setting"])
        for variant in ("paper", "tuned"):
            for cell in table.cells(setting):
                vals = cell_values(table, found, variant, cell)
                if not vals:
                    continue
                rcell = {a: ref["cell"].get(a, cell.get(a)) for a in ref_axes}
                name = ", ".join(table.label(a, rcell[a]) for a in row_axes(table, ref["setting"]))
                rlabel = f"`{ref['setting']}` {name} ({ref['variant']})"
                out.append(compare_row(table, cell, setting, vals,
                                       cell_values(table, other, ref["variant"], rcell), rlabel))  # fmt: skip
    return [*out, ""] if len(out) > 4 else []  # no row of this setting has runs yet


def welch_p(c) -> str:
    """A Welch comparison's p for a table cell: "n/a" under 2 seeds, "not significant" marked."""
    if c.mark == "n/a":
        return "n/a (< 2 seeds)"
    return f"{c.p:.2g}" + ("" if c.significant else " (**not significant**)")


def compare_row(table, cell, setting: str, vals: list, ref_vals: list, rlabel: str) -> str:
    """One row of "Against other settings"."""
    label = ", ".join(table.label(a, cell[a]) for a in table.axes_of(setting))
    c = stats.compare(ref_vals, vals)
    p = welch_p(c)
    return (f"| {label} | {stats.summarize(vals).text()} | {rlabel} | "
            f"{stats.summarize(ref_vals).text()} | {c.diff_text()} | {p} |")  # fmt: skip


def gains_lines(table, args, found, setting: str) -> list[str]:
    """The setting's decision rule on gains (``gains``): per row, its gain from axis=from to
    axis=to (Welch), the reference row's, and the difference of the two gains (Welch-
    Satterthwaite over the four cells) with its verdict."""
    g = table.setting(setting).gains
    if not g:
        return []
    axis, v0, v1, variant, ref = g["axis"], g["from"], g["to"], g["variant"], g["reference"]
    other = collect(table, argparse.Namespace(**{**vars(args), "setting": ref["setting"]}))
    out = []
    for cell in (c for c in table.cells(setting) if c[axis] == v0):
        rcell = {a: ref["cell"].get(a, cell.get(a)) for a in table.axes_of(ref["setting"])}
        arms = [(found, cell, ""), (other, rcell, f" (`{ref['setting']}`)")]
        vals = [[cell_values(table, f, variant, {**c, axis: v}) for v in (v0, v1)]
                for f, c, _ in arms]  # fmt: skip
        if not all(vals[0]):
            continue
        gains = [gain_row(table, c, axis, where, x0, x1, out)
                 for (_, c, where), (x0, x1) in zip(arms, vals, strict=True)]  # fmt: skip
        d = stats.difference_of_gains(vals[0][1], vals[0][0], vals[1][1], vals[1][0])
        ci = "" if math.isnan(d.lo) else f" [{d.lo:+.2f}, {d.hi:+.2f}]"  # none below 2 seeds
        p = "" if math.isnan(d.p) else f"{d.p:.2g}: "  # the verdict says n/a below 2 seeds
        out.append(f"| difference of gains (row minus reference) | | | {d.diff:+.2f}{ci} "
                   f"| {p}**{d.verdict(*gains)}** |")  # fmt: skip
    if not out:
        return []
    head = [f"**Gains from {table.label(axis, v1)} over {table.label(axis, v0)}** ({variant}, "
            f"the setting's decision rule; Welch, {stats.ALPHA}; the difference of gains: "
            "Welch-Satterthwaite over the four cells, 95% interval):", "",
            f"| row | {table.label(axis, v0)} | {table.label(axis, v1)} | gain | p |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    return [*head, *out, ""]


def decision_lines(table, found, setting: str) -> list[str]:
    """The setting's decision rule on one row against another (``decision``), per cell of
    the axes neither names: the difference, its Welch test and the verdict the rule gives."""
    d = table.setting(setting).decision
    if not d:
        return []
    named = set(d["row"]) | set(d["against"])
    out = []
    for cell in table.cells(setting):
        if any(cell[a] != v for a, v in d["row"].items()):
            continue
        a = cell_values(table, found, d["variant"], {**cell, **d["against"]})
        b = cell_values(table, found, d["variant"], cell)
        if not (a and b):
            continue
        c = stats.compare(a, b)
        where = ", ".join(table.label(k, v) for k, v in cell.items() if k not in named)
        p = "n/a" if c.mark == "n/a" else f"{c.p:.2g}"
        out.append(f"| {where or '-'} | {len(b)} / {len(a)} | {c.diff_text()} | {p} | "
                   f"**{decide(d, c, min(len(a), len(b)))}** |")  # fmt: skip
    if not out:
        return []
    row = ", ".join(table.label(k, v) for k, v in d["row"].items())
    against = ", ".join(table.label(k, v) for k, v in d["against"].items())
    head = [f"**Decision rule** (fixed before the runs; {d['variant']}): {row} - {against} >= "
            f"+{d['holds']:g} with Welch p < {stats.ALPHA}: {d['above']}; <= 0: {d['below']}; "
            f"in between: seeds added up to {d['max_seeds']}, then unresolved.", "",
            f"| cell | seeds ({row} / {against}) | Δ [95% interval] | p | verdict |", "|---|---:|---:|---:|---|"]  # fmt: skip
    return [*head, *out, ""]


def decide(d: dict, c, seeds: int) -> str:
    """The verdict of a ``decision`` rule for a comparison ``c`` at ``seeds`` seeds."""
    if c.mark == "n/a":
        return "n/a (< 2 seeds)"
    if c.diff >= d["holds"] and c.p < stats.ALPHA:
        return d["above"]
    if c.diff <= 0:
        return d["below"]
    if seeds < d["max_seeds"]:
        return f"in between: add seed {seeds} (the rule allows up to {d['max_seeds']})"
    return "unresolved"


def gain_row(table, cell: dict, axis: str, where: str, x0: list, x1: list, out: list) -> float:
    """One arm's row of "Gains" (appended to ``out``); its gain, mean(x1) - mean(x0)."""
    name = ", ".join(table.label(a, v) for a, v in cell.items() if a != axis)
    c = stats.compare(x0, x1)
    p = welch_p(c)
    out.append(f"| {name}{where} | {stats.summarize(x0).text()} | "
               f"{stats.summarize(x1).text()} | {c.diff_text()} | {p} |")  # fmt: skip
    return c.diff


def check_row(label: str, ref: dict, curves: list[dict], chk: dict) -> tuple[list[str], str]:
    """One row's lines of the scaling check and its verdict."""
    rows, inside = [], []
    for st in chk["steps"]:
        vals, p = [c.get(st) for c in curves], ref.get(st)
        if p is None or None in vals:
            inside.append(None)
            continue
        w = math.sqrt(p * (1 - p) / chk["n"])
        lo, hi = min(vals) - w, max(vals) + w
        inside.append(lo <= p <= hi)
        others = ", ".join(f"{100 * v:.2f}" for v in vals)
        rows.append(f"| {label} | {st} | {100 * p:.2f} | {others} | [{100 * lo:.2f}, "
                    f"{100 * hi:.2f}] | {'yes' if inside[-1] else '**no**'} |")  # fmt: skip
    word = "incomplete" if None in inside else "**accepted**" if all(inside) else "**rejected**"
    return rows, word


def column_name(table, cell: dict, col: str | None, axis: str) -> str:
    """A verdict line's column, named with its axis where its label is the bare value."""
    if not col or col == axis:  # the baseline is a column: each row names its own
        return ""
    label = table.label(col, cell[col])
    return f"{col} {label}" if label == str(cell[col]) else label


def verdict(table, found, variant: str, cell: dict, base: str, setting: str) -> str | None:
    """One row against the baseline in one cell; None when either side has fewer than 2 seeds."""
    axis, ref = table.baseline
    vals = cell_values(table, found, variant, cell)
    c = stats.compare(cell_values(table, found, variant, {**cell, axis: ref}), vals)
    if c.mark == "n/a":
        return None
    axes = row_axes(table, setting) + [
        a for a in [col_axis(table)] if a == axis
    ]  # baseline: a column
    row = ", ".join(table.label(a, cell[a]) for a in axes)
    row += tables.sim_mark(found, variant, cell)
    paper = paper_difference(table, cell)
    tail = "" if paper is None else f"; paper {paper:+.1f}"
    if not c.significant:
        return f"{row} - {base} **not significant** ({c.diff_text()}, p = {c.p:.2g}{tail})"
    if paper:
        same = (paper > 0) == (c.diff > 0)
        tail += ": as in the paper" if same else ": **the ordering reverses in this setting**"
    side = "above" if c.diff > 0 else "below"
    return f"{row} {side} {base} ({c.diff_text()}, p = {c.p:.2g}{tail})"


def paper_difference(table, cell: dict) -> float | None:
    """The paper's value of a cell minus its baseline's, None when the paper lacks either."""
    axis, ref = table.baseline
    mine, theirs = table.paper_cell(cell), table.paper_cell({**cell, axis: ref})
    if not mine or not theirs or mine.get("value") is None or theirs.get("value") is None:
        return None
    return mine["value"] - theirs["value"]


def baseline_label(table) -> str:
    return table.label(*table.baseline).split(" (")[0]  # "GP (DP-SGD)" -> "GP"


TIE_NOTE = (
    "(a tie: the table does not order the two; where its interval reaches differences as large "
    "as those in question, the tie is inconclusive at these seeds, not evidence of no difference)"
)
STATS_NOTE = (
    "Cells: mean ± sample std [95% Student-t interval of the mean] (number of seeds); "
    "Δ = measured mean minus the paper's value. *vs GP* (or *vs DP-SGD*): the difference of the "
    "means from DP-SGD (GP) with the same hyper-parameter variant in the same column [its 95% "
    "Welch-Satterthwaite interval], and a two-sided "
    f"Welch t-test: `>`/`<` significant at {stats.ALPHA}, `{stats.TIE}` **not significant** "
    f"{TIE_NOTE}."
)


def stats_note(table) -> str:
    """The statistics note for a table whose baseline is not GP."""
    axis, ref = table.baseline
    return STATS_NOTE.split(" *vs GP*")[0] + (
        f" *vs {baseline_label(table)}*: the difference of the means from the cells with "
        f"{axis} = {ref} ({table.label(axis, ref)}), same variant [its 95% Welch-Satterthwaite "
        f"interval], and a two-sided Welch t-test: `>`/`<` significant at {stats.ALPHA}, "
        f"`{stats.TIE}` **not significant** {TIE_NOTE}."
    )


TUNED_NOTE = (
    "Rows marked *(tuned)*: their hyper-parameters were picked by validation accuracy, computed "
    "on held-out **private** training examples without noise. Those tuning statistics and the "
    "pick they make are **not covered by the epsilons shown** (as in the papers; each tuning "
    "run's summary.json names them under `not_covered_statistics`, docs/privacy.md)."
)


def tuned_note(found) -> list[str]:
    """Under a table with tuned rows: the tuning statistics are not covered by epsilon."""
    return [TUNED_NOTE, ""] if found["tuned"] else []


def grid_text(t: tables.Tune) -> str:
    """The tuning grid's learning rates, the same for every mechanism or one per mechanism."""
    if not isinstance(t.lr, dict):
        return f"Grid, the same for every mechanism: lr in {t.lr} x the clip settings below"
    per = "; ".join(f"{m}: lr in {lrs}" for m, lrs in t.lr.items())
    return f"Grids per mechanism (their axes differ): {per}; each x the clip settings below"


def ratio_text(t: tables.Tune) -> str:
    return "its grid's ratio" if isinstance(t.lr, dict) else f"x{t.step():g}"


def tuning_lines(table, found, setting: str = "paper") -> list[str]:
    if not found["tune"]:
        return []
    t = table.tune_of(setting)
    n_runs = sum(len(v) for v in found["tune"].values())
    lines = [
        "## Tuning",
        "",
        grid_text(t)
        + (
            f", a best lr at an edge extended by {ratio_text(t)} (at most {t.extend} times a side)"
            if t.extend
            else ""
        )
        + "; each point "
        f"trained once (seed {t.seed}) on the private set minus {t.validation_size} held-out "
        "training examples and scored on those (the test set is not used). "
        f"**{n_runs} tuning runs**; their privacy cost is **not** included in the epsilons "
        "reported (as in the papers), and the validation accuracies below, computed on "
        "held-out private training examples without noise, are not covered by any epsilon.",
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
            if chosen and lr in (min(pick["lrs"]), max(pick["lrs"])):
                chosen += " (lr at the grid's edge)"
            lines.append(f"| {cid} | {lr:g} | `{clip}` | {acc:.2f} | {chosen} |")
    edge = [c for c, p in found["picks"].items() if p["lr"] in (min(p["lrs"]), max(p["lrs"]))]
    if edge:
        lines += [
            "",
            f"**Picked at the edge of the lr grid** ({', '.join(edge)}): "
            + (
                f"the grid was already extended the most times allowed ({t.extend} a side)"
                if t.extend
                else "the grid was not extended"
            )
            + ", so a better lr may lie beyond it; those cells may be under-tuned.",
        ]
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


def figures(table, setting: str, proj: dict, out: Path) -> list[Path]:
    """The figures :func:`plot_metric` draws: accuracy.png when the column / x axis is
    numeric, projection.png beside it where there are projection errors."""
    col = col_axis(table)
    if col is None or not _numeric([c[col] for c in table.cells(setting)]):
        return []
    return [out / "accuracy.png", *([out / "projection.png"] if proj else [])]


def plot_metric(table, found, setting: str, proj: dict, out: Path) -> list[Path]:
    """accuracy.png (metric vs column/x axis per row) and, with data, projection.png."""
    col = col_axis(table)
    cells = table.cells(setting)
    if not figures(table, setting, proj, out):
        return []
    rows = list(dict.fromkeys(tuple((a, c[a]) for a in row_axes(table, setting)) for c in cells))
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
    metric = table.metric_of(setting)
    ax.set_ylabel(f"{metric} (%)" if "accuracy" in metric else metric)
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
def train_hours(found) -> tuple[float, int]:
    """Wall-clock training time summed over the runs (from metrics.jsonl's steps_per_s); a
    run reused by two cells (a link, or a committed copy: same metrics) counts once."""
    runs = {}
    for run in found_runs(found):
        runs.setdefault(run.metrics_path.read_bytes(), run)
    return sum(r.train_seconds() for r in runs.values()) / 3600, len(runs)


def found_runs(found) -> list[RunDir]:
    """The finished runs of every variant, each run dir once."""
    dirs = (j.dir for v in ("paper", "tuned", "tune") for jobs in found[v].values() for j in jobs)
    return [RunDir(d) for d in dict.fromkeys(dirs)]


def hardware_line(found, rendered_on: str) -> str:
    """The recorded machine, and where the runs trained when that is not (only) it (a GPU
    cell, another machine); runs without a record count as the renderer's, which keeps a
    re-render of the older tables byte-identical."""
    counts = runs_hardware(found)
    if set(counts) <= {rendered_on, f"cpu {NOT_RECORDED}"}:
        return f"- hardware: {rendered_on}"
    runs = "; ".join(f"{n} x {hw}" for hw, n in Counter(counts).most_common())
    return f"- hardware: the runs': {runs}; first rendered on {rendered_on}"


def threads_note(found) -> str:
    """How many torch threads the runs had: one (the lanes' default; a record without a
    thread count is one), else each run's own count, which the hardware line gives."""
    found_threads = (re.search(r"(\d+) threads?\b", hw) for hw in runs_hardware(found))
    if {int(m.group(1)) if m else 1 for m in found_threads} <= {1}:
        return "OMP_NUM_THREADS=1"
    return "OMP_NUM_THREADS as each run's hardware entry below says"


def runs_hardware(found) -> dict[str, int]:
    """Where the table's runs trained, from their own records: ``{hardware: runs}``."""
    return dict(Counter(run.hardware() for run in found_runs(found)))


def recorded(dest: Path, args) -> dict:
    """The provenance of the runs (commit, date, hardware, notes): the one recorded in
    ``dest/provenance.json`` when the table was first rendered, kept on re-renders (so a
    re-render never stamps today's commit or machine over the runs'); new with --restamp,
    which keeps the recorded notes unless --note gives new ones."""
    path = dest / PROVENANCE
    old = json.loads(path.read_text()) if path.is_file() else {}
    rec = old if old and not args.restamp else {**provenance(), "notes": old.get("notes", [])}
    if args.note:  # the notes are replaced only by new ones, never dropped by --restamp
        rec["notes"] = list(args.note)
    return rec


def metric_line(table, setting: str) -> list[str]:
    """A setting that reports another summary key than its table's title says it."""
    metric = table.metric_of(setting)
    return [] if metric == table.metric else [f"- reported: `{metric}` (this setting's metric)"]


def header(table, args, found, rec: dict) -> list[str]:
    setting = table.setting(args.setting)
    hours, n = train_hours(found)
    extra = " ".join(args.extra)
    tune = " --tune" if found["tune"] else ""
    cmd = f"{how_to_run('reproduce.py')} {table.name} --setting {args.setting}{tune}"
    cmd += f" {extra}" if extra else ""
    return [
        f"# {table.title}",
        "",
        f"Source: {table.source}",
        "",
        f"**Setting `{args.setting}`**: {setting.note}"
        + (f" Overrides: `{extra}`." if extra else ""),
        "",
        *[line for note in rec.get("notes", []) for line in (f"> **Note.** {note}", "")],
        f"- commit: `{rec['commit']}`; first rendered {rec['date']} (recorded in {PROVENANCE}; "
        "re-renders keep it)",
        f"- runs: `{cmd}` ({threads_note(found)}), then `{how_to_run('make_table.py')} {table.name} "
        f"--setting {args.setting}`",
        hardware_line(found, rec["hardware"]),
        f"- {n} runs, {hours:.2f} h of training wall-clock in total",
        *metric_line(table, args.setting),
        "",
        STATS_NOTE if table.baseline == (BASELINE_AXIS, BASELINE) else stats_note(table),
        "",
    ]


# ------------------------------------------------------------------ main
def copy_runs(found, dest: Path) -> None:
    """Each finished run's small files into ``dest/<variant>/<job>``; nothing when one of them
    would replace another finished run of the same cell there (a GPU and a CPU lane that
    both ran it): one line and exit code 2, to be settled by hand."""
    pairs = [(j.dir, dest / variant / j.name)
             for variant in ("paper", "tuned", "tune")
             for jobs in found[variant].values() for j in jobs]  # fmt: skip
    for src, target in pairs:
        mine, theirs = target / SUMMARY, src / SUMMARY
        same_dir = target.resolve() == src.resolve()
        if not same_dir and mine.is_file() and mine.read_bytes() != theirs.read_bytes():
            die(f"{target}: already holds another finished run of this cell (its summary.json "
                f"differs from {theirs}'s); keep one of them by hand")  # fmt: skip
    for src, target in pairs:
        RunDir(src).copy_small_files(target)
    private_tables.copy(found.get("searches", []), dest)


def render(table, args) -> Path:
    """Write the table's README.md, provenance.json, figures and run copies into its folder
    (``--dry-run``: say what would be written, write nothing)."""
    found = collect(table, args)
    try:
        found["simulated"] = simulation_marks(table, found, args.setting)
    except ConfigError as e:
        die(str(e))
    if not any(found[v] for v in ("paper", "tuned", "tune", "private")):
        die(
            f"no finished runs of {table.name} under {tables.setting_dir(args.runs, table, args.setting, args.extra)}"
        )
    dest = tables.setting_dir(args.out, table, args.setting, args.extra)
    if args.copy_only:  # the finished runs' small files, no README: a table not yet read
        copy_runs(found, dest)
        n = sum(
            len(jobs) for v in ("paper", "tuned", "tune", "private") for jobs in found[v].values()
        )
        print(f"copied the small files of {n} finished runs into {dest}")
        if (dest / "README.md").is_file():  # rendered before: it may no longer match the runs
            print(f"{dest / 'README.md'} was rendered from the runs then: re-render it "
                  f"(python scripts/make_table.py {table.name} --setting {args.setting}) when "
                  "its rows should show these (tests/unit/test_results_traced.py checks)")  # fmt: skip
        return dest
    rec = recorded(dest, args)
    proj = {} if args.no_projection else projections(table, found, args, not args.dry_run)
    if args.dry_run:
        figs = figures(table, args.setting, proj, dest) + curves.figure(
            table, found, args.setting, dest
        )
        kept = (dest / PROVENANCE).is_file() and not args.restamp
        dry_run(dest, rec, readme(table, args, found, rec, figs, proj), figs, found, kept)
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    copy_runs(found, dest)
    (dest / PROVENANCE).write_text(json.dumps(rec, indent=1) + "\n")
    figs = plot_metric(table, found, args.setting, proj, dest)
    figs += curves.plot(table, found, args.setting, dest)
    (dest / "README.md").write_text(readme(table, args, found, rec, figs, proj))
    return dest


def run_sections(table, args, found) -> list[str]:
    """The sections under the table computed from the runs, in the README's order (the
    results-tracing test checks every number of these against a re-render)."""
    s = args.setting
    return (
        check_lines(table, found, s)  # a setting's scaling check
        + compare_lines(table, args, found, s)  # against other settings
        + gains_lines(table, args, found, s)  # a rule on gains
        + decision_lines(table, found, s)  # a decision rule
        + ema_lines(table, found, s)  # averaged vs raw weights
        + curves.curve_lines(table, found, s)  # every evaluation, against the baseline
        + private_tables.lines(  # --private-tune: the choice counted
            table, found["private"], lambda c: cell_values(table, found, "tuned", c), s
        )
    )


def readme(table, args, found, rec: dict, figs: list[Path], proj: dict) -> str:
    """The README.md text: a function of the runs and the recorded provenance only, so a
    re-render of the same runs leaves the file byte-identical."""
    lines = (
        header(table, args, found, rec)
        + simulation_note(found["simulated"])
        + markdown_table(table, found, args.setting)
        + [""]
        + tuned_note(found)
        + verdict_lines(table, found, args.setting)
        + run_sections(table, args, found)
    )
    lines += [f"![{f.stem}]({f.name})" for f in figs] + [""]
    if proj:
        lines += ["Projection error: " + PROJECTION_NOTE, ""]
    lines += tuning_lines(table, found, args.setting)
    lines += [f"- {n}" for n in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def dry_run(dest: Path, rec: dict, text: str, figs: list[Path], found, kept: bool) -> None:
    """What :func:`render` would write into ``dest``, and whether it would change anything."""
    old = dest / "README.md"
    if not old.is_file():
        state = "new"
    elif old.read_text() == text:
        state = "unchanged"
    else:
        diff = set(old.read_text().splitlines()) ^ set(text.splitlines())
        state = f"changed: {len(diff)} lines differ"
    prov = "kept" if kept else "new"
    runs = [j for v in ("paper", "tuned", "tune") for jobs in found[v].values() for j in jobs]
    new = sum(not (dest / j.variant / j.name).is_dir() for j in runs)
    print(f"dry run (nothing written): {dest}")
    print(f"  README.md: {state}")
    print(f"  {PROVENANCE}: {prov} (commit {rec['commit']}, rendered {rec['date']})")
    print(f"  figures: {', '.join(f.name for f in figs) or 'none'}")
    print(
        f"  small files of {len(runs)} runs into {{paper,tuned,tune}}/<job>/ ({new} not there yet)"
    )


PROJECTION_NOTE = (
    "relative projection error ||r|| / ||g|| of the mean gradient of 1000 test examples, final "
    "model, onto the run's final anchor subspace (computed by make_table.py from the "
    "checkpoint; public data, so not a privacy cost)."
)


def parse(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("table", nargs="?", help=f"a paper table: {', '.join(tables.table_names())}")
    p.add_argument("--study", choices=sorted(studies.STUDIES),
                   help="print the table of results/<study>/README.md from results/<study>/runs")  # fmt: skip
    p.add_argument("--collect", type=Path, metavar="DIR",
                   help="with --study: first copy the small files of the finished runs under DIR")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="the run-changing overrides given to reproduce.py")
    p.add_argument("--setting", default="paper", help="a setting of the table (default: paper)")
    p.add_argument("--runs", type=Path, default=None,
                   help="runs root (default: outputs/tables when it holds runs of this table and "
                        "setting, else the committed runs in --out)")  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=project_root() / "results" / "tables", help="output root"
    )
    p.add_argument("--no-projection", action="store_true", help="skip the projection errors")
    p.add_argument("--copy-only", action="store_true",
                   help="only copy the finished runs' small files from --runs beside the table "
                        "(commit runs as they finish without rendering, or reading, the table)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be written (and whether README.md would change); write "
                        "nothing")  # fmt: skip
    p.add_argument("--data-root", default=None, help="data.root for the projection errors")
    p.add_argument("--projection-examples", type=int, default=1000)
    p.add_argument("--note", action="append", default=[],
                   help="a paragraph for the rendered README, e.g. how the runs were made "
                        "(kept in provenance.json for later re-renders)")  # fmt: skip
    p.add_argument("--restamp", action="store_true",
                   help="record this commit and machine as the runs' provenance (new runs); by "
                        "default a re-render keeps the provenance recorded at the first render")  # fmt: skip
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.study:
        if args.collect is not None:
            if not args.collect.is_dir():
                die(f"--collect {args.collect}: no such directory")
            print(f"collected {studies.collect(args.study, args.collect)} runs", file=sys.stderr)
        print(studies.render(args.study))
        return 0
    if not args.table:
        die("name a table (or --study NAME)")
    from dpsub.training.checkpoint import may_change

    args.extra = [o for o in args.overrides if not may_change(o.lstrip("+~").split("=")[0])
                  and not o.startswith("hydra")]  # fmt: skip
    try:
        table = tables.load_table(args.table)
        table.setting(args.setting)
    except ConfigError as e:
        die(str(e))
    if args.runs is None:
        made = tables.setting_dir(
            project_root() / "outputs" / "tables", table, args.setting, args.extra
        )
        args.runs = project_root() / "outputs" / "tables" if made.is_dir() else args.out
    dest = render(table, args)
    if not (args.dry_run or args.copy_only):
        print(f"wrote {dest / 'README.md'}")
    return 0


def cli() -> None:
    """The console command (pyproject.toml's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
