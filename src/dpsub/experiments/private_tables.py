"""A table's cells tuned privately: ``dpsub-reproduce TABLE --private-tune`` (docs/tables.md).

The papers tune on un-noised validation scores and do not count the choice. Here each cell's
tuning grid (the same lr x clip points as ``--tune``, ``tune:`` of the table) is searched by
``dpsub-select`` (Papernot and Steinke's procedure, :mod:`dpsub.cli.select`): a secret number
of runs on candidates drawn from the grid, each scored on ``tune.validation_size`` held-out
training examples with Gaussian noise, only the best run kept. One search per seed of the
cell; its released model's test accuracy is the row's value and the search's epsilon its cost.

A search lives in ``<setting>/private/<cell>,seed=<s>/`` (``selection.json``, ``select.log``,
the kept run's ``config.yaml`` and ``ledger.json``; its checkpoint is not committed). A folder
holding ``selection.json`` whose record matches the planned search (its law, candidates and
overrides, less those a run may change: ``checkpoint.may_change``) is finished and skipped;
one that no longer matches is stale: set aside under ``<setting>/.stale/private/`` and
searched again. An unfinished folder (a search killed part way) is deleted and searched
again from the start: a search cannot be resumed, since its K is secret. While a process
searches, it holds ``<setting>/private/.locks/<search>/.lock``: another lane skips that
search. The grid is fixed before the search: no edge extension (that would choose on
un-noised scores). Searches run seeded (``--seed``: the cell's seed), so anyone holding the
seed can recompute K, the draws and the score noise, as for any seeded run's noise: tables
made to be cited, not a deployment.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpsub.errors import ConfigError
from dpsub.experiments import tables
from dpsub.rundir import CONFIG, LEDGER, SELECTION

VARIANT = "private"
LOG = "select.log"
LOCKS = ".locks"  # <setting>/private/.locks/<search>/.lock (git-ignored)
#: what a search folder keeps in results (never the checkpoint)
KEPT = (SELECTION, LOG, CONFIG, LEDGER)


@dataclass(frozen=True)
class Law:
    """How many runs a search trains (K ~ Repetitions(mean, shape)) and its score noise."""

    mean: float
    sigma: float
    shape: float = 1.0


def check_law(law: Law) -> Law:
    """``law`` if ``dpsub-select`` accepts it (ConfigError naming the flag, before any search)."""
    from dpsub.privacy.selection import Repetitions

    if not law.sigma > 0:
        raise ConfigError(f"--select-sigma: must be > 0, got {law.sigma:g}")
    try:
        Repetitions(mean=law.mean, shape=law.shape)
    except ValueError as e:
        raise ConfigError(f"--select-mean/--select-shape: {e}") from None
    return law


@dataclass
class Search:
    cell: dict
    seed: int
    dir: Path
    candidates: list[list[str]]
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def finished(self) -> bool:
        return (self.dir / SELECTION).is_file()

    def record(self) -> dict:
        return json.loads((self.dir / SELECTION).read_text())

    def changed(self, law: Law) -> list[str]:
        """What a finished search's record has that this planned search does not."""
        from dpsub.training.checkpoint import may_change

        r = self.record()
        fixed = lambda ov: [o for o in ov if not may_change(o.split("=", 1)[0].lstrip("+~"))]  # noqa: E731
        rep = r.get("repetitions") or {}
        return [name for name, same in (
            ("mean", rep.get("mean") == law.mean),
            ("shape", rep.get("shape") == law.shape),
            ("score noise", r.get("score_sigma") == law.sigma),
            ("candidates", r.get("candidates") == [shlex.join(c) for c in self.candidates]),
            ("overrides", fixed(r.get("overrides") or []) == fixed(self.overrides)),
            ("held-out pick", r.get("validation_pick", "uniform") == _forced_pick()),
        ) if not same]  # fmt: skip


def plan_searches(table, setting: str, root: Path, extra=(), passthrough=()) -> list[Search]:
    """One search per cell and seed of the setting, over the cell's tuning grid."""
    tune = table.tune_of(setting)
    if tune is None:
        raise ConfigError(f"table {table.name}: no tune section (cannot --private-tune)")
    base = tables.setting_dir(root, table, setting, list(extra)) / VARIANT
    out = []
    for cell in table.cells(setting):
        mech = cell["mechanism"]
        cands = [tables.tune_overrides(tune, mech, lr, ci, validation=False)
                 for lr, ci in tune.points(mech)]  # fmt: skip
        ov = [*table.overrides_of(cell, setting), f"dataset.validation_size={tune.validation_size}",
              *extra, *_allowed(passthrough)]  # fmt: skip
        for seed in table.seeds_of(setting, cell):
            out.append(Search(cell, seed, base / f"{tables.cell_id(cell)},seed={seed}", cands, ov))
    return out


def _forced_pick() -> str:
    """The held-out pick ``dpsub-select`` forces now (a search made with another is stale)."""
    from dpsub.cli.select import FORCED

    return next(f for f in FORCED if f.startswith("dataset.validation_pick=")).split("=", 1)[1]


def _allowed(passthrough) -> list[str]:
    """The pass-through overrides less those ``dpsub-select`` sets itself (progress bars and
    W&B are off in a search whatever the campaign asks)."""
    from dpsub.cli.select import FORCED

    forced = {f.split("=", 1)[0] for f in FORCED}
    return [o for o in passthrough if o.split("=", 1)[0].lstrip("+~") not in forced]


def command(s: Search, law: Law) -> list[str]:
    """The ``dpsub-select`` command line of one search (``--seed``: the cell's seed)."""
    flags = [x for c in s.candidates for x in ("--candidate", shlex.join(c))]
    return [sys.executable, "-m", "dpsub.cli.select", *flags, "--mean", f"{law.mean:g}",
            "--shape", f"{law.shape:g}", "--score-sigma", f"{law.sigma:g}", "--seed",
            str(s.seed), "--out", str(s.dir), *s.overrides]  # fmt: skip


def status(s: Search, law: Law) -> str:
    """done | stale:<what> | again (a folder left by a killed search) | todo."""
    if s.finished:
        changed = s.changed(law)
        return "stale:" + ",".join(changed) if changed else "done"
    return "again" if s.dir.exists() else "todo"


def run_searches(searches: list[Search], law: Law, stop: Callable[[], bool], say,
                 fits: Callable[[Search], bool] = lambda s: True) -> int:  # fmt: skip
    """Run the searches not done one after another (a child process each) until ``stop()``,
    each only if ``fits(search)`` (``--fit``: expected to end before the deadline) and no
    other process holds it; the number that failed."""
    failed = 0
    for s in searches:
        if status(s, law) == "done":
            continue
        if stop():
            say("private: stopped at --stop-at before the next search; the same command resumes")
            return failed
        if not fits(s):
            say(f"private: {s.name} not started: its expected time would end after --stop-at "
                "(--fit); the next period runs it")  # fmt: skip
            continue
        release = _lock(s, say)
        if release is None:
            continue
        try:
            failed += not _search(s, law, say)
        finally:
            release()
    return failed


def _lock(s: Search, say) -> Callable[[], None] | None:
    """The search's lock (outside its folder, which dpsub-select needs empty), or None when
    another process holds it."""
    from dpsub.errors import RunDirInUse
    from dpsub.training.checkpoint import lock_run_dir

    where = s.dir.parent / LOCKS / s.name
    where.mkdir(parents=True, exist_ok=True)
    try:
        return lock_run_dir(where, "private")
    except RunDirInUse:
        say(f"private: {s.name} skipped: another process is searching it")
        return None


def _search(s: Search, law: Law, say) -> bool:
    """One search (the lock held): set a stale or half-made folder aside, run dpsub-select,
    keep its log without clock times; whether it finished."""
    st = status(s, law)  # again: another process may have finished it meanwhile
    if st == "done":
        return True
    if st.startswith("stale:"):
        dest = tables.set_aside(s.dir, s.dir.parent.parent, VARIANT)
        say(f"private: {s.name} stale (changed: {st[6:]}) -> {dest}; searched again")
    elif st == "again":
        say(f"private: {s.dir} was left by a search killed part way: deleted and searched "
            "again from the start (a search is not resumed)")  # fmt: skip
        shutil.rmtree(s.dir)
    say(f"private: searching {s.dir}")
    proc = run_select(command(s, law), s.dir)
    if proc.returncode != 0 or not s.finished:
        say(f"private: {s.name} failed (exit code {proc.returncode}): "
            f"{_last(proc.stderr or proc.stdout)}")  # fmt: skip
        return False
    say(f"private: {s.name} done: {_last(untimed(proc.stdout + proc.stderr))}")
    return True


def run_select(cmd: list[str], out: Path) -> subprocess.CompletedProcess:
    """One ``dpsub-select`` command (a child process) searching into ``out``; when it finished,
    its output is kept as ``out/select.log`` without clock times (:func:`untimed`)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode == 0 and (out / SELECTION).is_file():
        (out / LOG).write_text(untimed(proc.stdout + proc.stderr))
    return proc


def _last(text: str) -> str:
    return (text.strip().splitlines() or ["(no output)"])[-1]


def untimed(text: str) -> str:
    """``text`` without the log lines' clock times: two times of one search bound how long
    it took, and with it how many runs it trained (K, which must stay secret)."""
    return _CLOCK.sub("", text)


_CLOCK = re.compile(r"^\[\d\d:\d\d:\d\d\]", re.MULTILINE)


def collect(searches: list[Search]) -> dict[str, list[dict]]:
    """cell id -> the finished searches' records (each with its ``seed``)."""
    out: dict[str, list[dict]] = {}
    for s in searches:
        if s.finished:
            out.setdefault(tables.cell_id(s.cell), []).append({**s.record(), "seed": s.seed})
    return out


def copy(searches: list[Search], dest: Path) -> None:
    """The finished searches' kept small files into ``dest/private/<search>``."""
    for s in searches:
        if not s.finished:
            continue
        target = dest / VARIANT / s.name
        if target.resolve() == s.dir.resolve():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (s.dir / name).is_file():
                shutil.copy2(s.dir / name, target / name)


def law_text(r: dict) -> str:
    """A record's search law, as the README states it."""
    rep = r.get("repetitions") or {}
    return (f"K ~ Repetitions(mean {rep.get('mean', float('nan')):g}, shape "
            f"{rep.get('shape', float('nan')):g}), score noise {r.get('score_sigma', float('nan')):g} "
            f"on {r.get('validation_size')} held-out examples")  # fmt: skip


def lines(table, private: dict[str, list[dict]], tuned: Callable[[dict], list[float]],
          setting: str) -> list[str]:  # fmt: skip
    """The README section of the privately tuned rows; ``tuned(cell)``: the cell's tuned
    (uncounted) test accuracies in %, to compare against."""
    from dpsub.experiments.stats import compare, summarize

    if not private:
        return []
    laws = {law_text(r) for recs in private.values() for r in recs}
    one = next(iter(laws)) if len(laws) == 1 else None
    out = [
        "### Tuned privately (the choice counted)",
        "",
        "Each cell's tuning grid searched by `dpsub-select` (`--private-tune`; "
        + (one if one else "each row's law below")
        + "): a secret number K of runs on candidates drawn from the grid (the held-out "
        "examples picked one by one by their hash), each scored with Gaussian noise on its count of "
        "correct held-out examples, only the best kept. A row's value is the kept models' test "
        "accuracy (%), one search per seed; its cost is the search's epsilon, which covers the "
        "choice. The searches ran seeded (each `selection.json` names its seed): whoever holds "
        "a seed can recompute its K, draws and score noise, as for any seeded run's noise.",
        "",
        "| cell | searches | test (%) | epsilon of a run | epsilon of the search | kept "
        "(lr, clip) | vs tuned without counting |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for cell in table.cells(setting):
        recs = private.get(tables.cell_id(cell))
        if recs:
            out.append(_row(table, cell, recs, tuned(cell), one, compare, summarize))
    return [*out, ""]


def _row(table, cell: dict, recs: list[dict], base: list[float], one, compare, summarize) -> str:
    accs = [100 * r["test_accuracy"] for r in recs if r.get("candidate")]
    kept = "; ".join(" ".join(r["candidate"]) if r.get("candidate") else "none (K = 0)"
                     for r in recs)  # fmt: skip
    vs = compare(base, accs).text() if base and accs else "–"
    label = ", ".join(table.label(a, v) for a, v in cell.items())
    n = str(len(recs)) if one else f"{len(recs)}: " + "; ".join(sorted({law_text(r) for r in recs}))
    return (
        f"| {label} | {n} | {summarize(accs).text()} | "
        f"{max(r['epsilon_of_each_run'] for r in recs):.3f} | "
        f"{max(r['epsilon'] for r in recs):.3f} | {kept} | {vs} |"
    )
