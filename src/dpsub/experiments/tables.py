"""Paper tables as data: ``conf/paper/<table>.yaml`` -> a grid of runs beside the paper's values.

A table file holds (docs/tables.md has the full format):

* ``experiment``: a pattern naming the experiment config of a cell, e.g.
  ``"{mechanism}_mnist_eps{epsilon}"`` (formatted with the cell's axis values);
* ``axes``: the grid, an ordered mapping axis -> values (``mechanism`` is required);
  the cells are the product of the axes, and ``seeds`` repeat every cell;
* ``overrides``: per axis, the Hydra overrides a value adds beyond the experiment (a list
  of templates such as ``mechanism.num_bases={k}``, or a mapping value -> list);
* ``paper``: the paper's value of every cell (``value: null`` where the paper only plots it);
* ``settings``: named reductions (``note``, ``overrides``, a subset of ``axes``, ``seeds``,
  ``axis_overrides`` replacing the table's ``overrides`` of some axes);
* ``tune``: the lr x clip grid every mechanism is tuned on, on a validation split.

An override list may instead be a mapping ``{all: [...], <mechanism>: [...]}``: the ``all``
entries apply to every cell, the others only to cells of that mechanism (a dpsgd cell has
no ``mechanism.num_bases``).

Jobs live in ``<root>/<table>/<setting>/<variant>/<job name>`` with variant ``paper`` (the
paper's hyper-parameters), ``tune`` (the tuning grid, evaluated on the validation split) or
``tuned`` (the pick of the tuning grid, evaluated on the test set); a job is finished when
its directory holds ``summary.json``.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsub.errors import ConfigError
from dpsub.overrides import quote_value
from dpsub.paths import conf_dir
from dpsub.rundir import SUMMARY

__all__ = [
    "Job",
    "Table",
    "finished",
    "load_table",
    "pick_best",
    "plan_jobs",
    "seed_stats",
    "table_names",
]

VARIANTS = ("paper", "tune", "tuned")
TOP_KEYS = {
    "title", "source", "metric", "kind", "layout", "experiment", "axes", "seeds", "labels",
    "overrides", "paper", "settings", "tune", "notes", "baseline",
}  # fmt: skip


def tables_dir() -> Path:
    return conf_dir() / "paper"


def table_names() -> list[str]:
    return sorted(p.stem for p in tables_dir().glob("*.yaml"))


# ------------------------------------------------------------------- spec
@dataclass
class Setting:
    """A named variant of the paper setting (``paper``: the setting itself)."""

    name: str
    note: str = "the paper's setting"
    overrides: Any = field(default_factory=list)  # list, or {all: [...], <mechanism>: [...]}
    #: restriction of the table's axes, or a new axis of its own (its values' overrides in
    #: ``axis_overrides``, their names in ``labels``)
    axes: dict[str, list] = field(default_factory=dict)
    #: a list, or a mapping {all: [...], "AXIS=VALUE": [...]}: the first key a cell matches
    seeds: list[int] | dict[str, list[int]] | None = None
    axis_overrides: dict[str, Any] = field(default_factory=dict)  # replace the table's entries
    tune: Tune | None = None  # the setting's own tuning grid (default: the table's)
    #: some runs draw a simulated noise level (privacy.simulate): NOT a privacy guarantee, and
    #: the rendered table must say so (make_table refuses simulated runs in an unmarked setting)
    simulated: bool = False
    metric: str | None = None  # the summary key its table reports (default: the table's)
    #: a scaling check rendered under the table: {axis, reference, steps, n} (make_table.py)
    check: dict | None = None
    #: rows of other settings this setting's rows are Welch-tested against, each
    #: {setting, variant, cell: {axis: value}} (make_table.py, "Against other settings")
    compare: list[dict] = field(default_factory=list)
    #: a decision rule on gains: {axis, from, to, variant, reference: {setting, cell}}: does
    #: each of this setting's rows gain from axis=from to axis=to, and by more or less than
    #: the reference setting's row (make_table.py, "Gains")
    gains: dict | None = None
    #: a decision rule on one row against another: {row, against, variant, holds, above,
    #: below, max_seeds} (make_table.py, "Decision rule"): row - against >= holds with Welch
    #: p < 0.05 -> ``above``; <= 0 -> ``below``; else add seeds up to max_seeds, then unresolved
    decision: dict | None = None
    #: learning curves rendered under the table: every evaluation of the runs, per row, and
    #: each row against the baseline at the same step (make_table.py, "Learning curves")
    curves: bool = False


@dataclass
class Tune:
    """The grid each mechanism is tuned on: every lr x every clip setting of the mechanism."""

    validation_size: int
    seed: int
    #: the learning rates, or per mechanism where the grids' axes differ (docs/tables.md)
    lr: list[float] | dict[str, list[float]]
    clip: dict[str, list[list[str]]]  # mechanism -> clip settings (each a list of overrides)
    extend: int = (
        0  # a best lr at the grid's edge adds the next lr beyond it, up to this many times a side
    )

    def points(self, mechanism: str, lrs: list[float] | None = None) -> list[tuple[float, int]]:
        """(lr, clip index) of every grid point of ``mechanism`` (over ``lrs``: the grid's
        learning rates, extended for a cell)."""
        clips = self.clip.get(mechanism)
        if not clips:
            raise ConfigError(f"tune.clip: no clip settings for mechanism {mechanism!r}")
        return [(lr, i) for lr in (lrs or self.lrs_of(mechanism)) for i in range(len(clips))]

    def lrs_of(self, mechanism: str) -> list[float]:
        """The grid's learning rates for ``mechanism``."""
        if not isinstance(self.lr, dict):
            return list(self.lr)
        if mechanism not in self.lr:
            raise ConfigError(f"tune.lr: no learning rates for mechanism {mechanism!r}")
        return list(self.lr[mechanism])

    def step(self, mechanism: str | None = None) -> float:
        """The ratio between the grid's neighbouring learning rates (the extension's step)."""
        lrs = sorted(self.lrs_of(mechanism) if mechanism else self.lr)
        return lrs[1] / lrs[0] if len(lrs) > 1 and lrs[0] > 0 else 10.0


@dataclass
class Table:
    name: str
    title: str
    source: str
    metric: str
    kind: str
    layout: dict[str, str]
    experiment: str
    axes: dict[str, list]
    seeds: list[int]
    labels: dict[str, dict]
    overrides: dict[str, Any]
    paper: list[dict]
    settings: dict[str, Setting]
    tune: Tune | None
    notes: list[str]
    baseline: tuple[str, Any] = ("mechanism", "dpsgd")  # (axis, value) every cell is tested against

    # --------------------------------------------------------------- cells
    def setting(self, name: str) -> Setting:
        if name == "paper":
            return self.settings.get("paper", Setting("paper"))
        if name not in self.settings:
            known = ", ".join(["paper", *self.settings])
            raise ConfigError(f"--setting: table {self.name} has no setting {name!r} ({known})")
        return self.settings[name]

    def axes_of(self, setting: str = "paper") -> dict[str, list]:
        """The setting's axes: the table's, restricted, then any of the setting's own."""
        return {**self.axes, **self.setting(setting).axes}

    def cells(self, setting: str = "paper") -> list[dict]:
        """The grid's cells (axis -> value), in axis order, restricted by the setting."""
        axes = self.axes_of(setting)
        return [
            dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())
        ]

    def seeds_of(self, setting: str, cell: dict | None = None) -> list[int]:
        """The seeds of ``setting`` (of ``cell``, where they depend on an axis value)."""
        s = self.setting(setting).seeds
        if isinstance(s, dict):  # {all: [...], "AXIS=VALUE": [...]}: the first key matched
            match = [k for k in s if "=" in k and _matches(k, cell or {})]
            s = s[match[0]] if match else s.get("all")
        return list(self.seeds if s is None else s)

    def metric_of(self, setting: str) -> str:
        return self.setting(setting).metric or self.metric

    def paper_cell(self, cell: dict) -> dict | None:
        """The paper's entry (value, std, note) of a cell, if it has one."""
        for entry in self.paper:
            if all(entry.get(a) == cell[a] for a in self.axes):
                return entry
        return None

    def tune_of(self, setting: str) -> Tune | None:
        """The tuning grid of ``setting``: its own, else the table's."""
        return self.setting(setting).tune or self.tune

    def label(self, axis: str, value: Any) -> str:
        return str(self.labels.get(axis, {}).get(value, value))

    def overrides_of(self, cell: dict, setting: str) -> list[str]:
        """Hydra overrides of a cell: experiment, axis overrides, the setting's."""
        try:
            out = [f"experiment={self.experiment.format(**cell)}"]
        except KeyError as e:
            raise ConfigError(f"{self.name}: experiment pattern names no axis {e}") from None
        s = self.setting(setting)
        for axis, entry in {**self.overrides, **s.axis_overrides}.items():
            if isinstance(entry, dict):  # value -> overrides
                entry = entry.get(cell[axis], [])
            out += _select(entry, cell)
        return out + _select(s.overrides, cell)


def _matches(key: str, cell: dict) -> bool:
    """Does ``cell`` have the value ``key`` (``AXIS=VALUE``) names?"""
    axis, value = key.split("=", 1)
    return axis in cell and str(cell[axis]) == value


def _select(entry: Any, cell: dict) -> list[str]:
    """Templates of an override entry for ``cell``, formatted with its values (a mapping
    ``{all: [...], <mechanism>: [...]}`` gives ``all`` and the cell's mechanism's). Braces
    that are not an axis are doubled (``aux.path=$${{data.root}}/x.npz``)."""
    if isinstance(entry, dict):
        entry = [*entry.get("all", []), *entry.get(cell["mechanism"], [])]
    try:
        return [str(t).format(**cell) for t in entry]
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"override templates {entry}: {e!r} is not an axis (write a literal brace twice: "
            "'${{data.root}}')"
        ) from None


def load_table(name: str | Path) -> Table:
    """The table ``conf/paper/<name>.yaml`` (or a path); ConfigError naming a bad key."""
    import yaml

    path = Path(name) if str(name).endswith(".yaml") else tables_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"table {name}: no such file {path} (tables: {', '.join(table_names())})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a table file is a mapping")
    return _parse(path, raw)


def _need(path: Path, raw: dict, key: str, kind: type) -> Any:
    if not isinstance(raw.get(key), kind):
        raise ConfigError(f"{path}: {key}: required, a {kind.__name__}")
    return raw[key]


def _check_by_mechanism(path: Path, key: str, entry: Any, axes: dict) -> None:
    if isinstance(entry, dict):
        bad = set(entry) - {"all", *axes["mechanism"]}
        if bad:
            raise ConfigError(f"{path}: {key}: {sorted(bad)[0]!r} is neither 'all' nor a mechanism")
    elif not isinstance(entry, list):
        raise ConfigError(f"{path}: {key}: a list of overrides or a mapping by mechanism")


def _parse(path: Path, raw: dict) -> Table:
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise ConfigError(f"{path}: {sorted(unknown)[0]}: unknown key (known: {sorted(TOP_KEYS)})")
    axes = _need(path, raw, "axes", dict)
    if "mechanism" not in axes or not all(isinstance(v, list) and v for v in axes.values()):
        raise ConfigError(f"{path}: axes: a mapping axis -> values, with a 'mechanism' axis")
    kind = raw.get("kind", "table")
    if kind not in ("table", "figure"):
        raise ConfigError(f"{path}: kind: table or figure, got {kind!r}")
    layout = _need(path, raw, "layout", dict)
    roles = {"table": ("rows", "columns"), "figure": ("x", "lines")}[kind]
    for role, axis in layout.items():
        if role not in roles:
            raise ConfigError(f"{path}: layout.{role}: unknown role (a {kind} has {roles})")
        if axis not in axes:
            raise ConfigError(f"{path}: layout.{role}: {axis!r} is not an axis")
    labels = dict(raw.get("labels") or {})
    settings = {
        sname: _parse_setting(path, sname, s, axes, labels)
        for sname, s in (raw.get("settings") or {}).items()
    }
    for sname, s in settings.items():
        _check_compare(f"{path}: settings.{sname}.compare", s.compare, settings, axes)
        _check_gains(f"{path}: settings.{sname}.gains", s, settings, axes)
        _check_decision(f"{path}: settings.{sname}.decision", s.decision, {**axes, **s.axes})
    tune = _parse_tune(path, "tune", raw.get("tune"))
    paper = _need(path, raw, "paper", list)
    for i, entry in enumerate(paper):
        if set(axes) - set(entry) or "value" not in entry:
            raise ConfigError(f"{path}: paper[{i}]: needs every axis ({list(axes)}) and value")
    return Table(
        name=path.stem, title=raw.get("title", path.stem), source=raw.get("source", ""),
        metric=raw.get("metric", "test_accuracy"), kind=kind, layout=layout,
        experiment=_need(path, raw, "experiment", str), axes=axes,
        seeds=list(raw.get("seeds", [0])), labels=labels,
        overrides=raw.get("overrides") or {}, paper=paper, settings=settings, tune=tune,
        notes=list(raw.get("notes") or []), baseline=_baseline(path, raw, axes),
    )  # fmt: skip


SETTING_KEYS = {"note", "overrides", "axes", "seeds", "axis_overrides", "tune", "simulated",
                "metric", "labels", "check", "compare", "gains", "decision", "curves"}  # fmt: skip


def _parse_setting(path: Path, name: str, s: dict, axes: dict, labels: dict) -> Setting:
    """One ``settings.<name>`` entry. A new axis of its own needs its values' overrides
    (``axis_overrides``); its ``labels`` join the table's (one label per axis value)."""
    key = f"{path}: settings.{name}"
    new = set(s.get("axes", {})) - set(axes)
    bad = new - set(s.get("axis_overrides", {}))
    if bad:
        raise ConfigError(f"{key}.axes: {sorted(bad)[0]} is not an axis (a setting's own axis "
                          "needs its axis_overrides)")  # fmt: skip
    _check_by_mechanism(path, f"settings.{name}.overrides", s.get("overrides", []), axes)
    bad = set(s) - SETTING_KEYS
    if bad:
        raise ConfigError(f"{key}.{sorted(bad)[0]}: unknown key")
    _check_simulated(path, name, s)
    if not isinstance(s.get("curves", False), bool):
        raise ConfigError(f"{key}.curves: true or false")
    _check_check(key, s.get("check"), {**axes, **s.get("axes", {})})
    for axis, names in (s.get("labels") or {}).items():
        for value, label in names.items():
            if labels.get(axis, {}).get(value, label) != label:
                raise ConfigError(f"{key}.labels.{axis}.{value}: the table labels it otherwise")
            labels.setdefault(axis, {})[value] = label
    return Setting(
        name, s.get("note", ""), s.get("overrides", []), s.get("axes", {}), s.get("seeds"),
        s.get("axis_overrides", {}), _parse_tune(path, f"settings.{name}.tune", s.get("tune")),
        bool(s.get("simulated", False)), s.get("metric"), s.get("check"),
        list(s.get("compare") or []), s.get("gains"), s.get("decision"), s.get("curves", False),
    )  # fmt: skip


def _check_check(key: str, check: dict | None, axes: dict) -> None:
    """``check: {axis, reference, steps, n}``: a value of one of the setting's axes, the
    evaluation steps compared, and the number of examples each evaluation scores."""
    if check is None:
        return
    ok = (isinstance(check, dict) and set(check) == {"axis", "reference", "steps", "n"}
          and check["reference"] in axes.get(check["axis"], []))  # fmt: skip
    if not ok:
        raise ConfigError(f"{key}.check: {{axis, reference (one of its values), steps, n}}")


def _check_compare(key: str, compare: list, settings: dict, axes: dict) -> None:
    """``compare: [{setting, variant, cell}]``: another setting of the table, a variant with
    test-set cells (paper or tuned), and values of that setting's axes replacing the row's."""
    for i, ref in enumerate(compare):
        ok = isinstance(ref, dict) and set(ref) == {"setting", "variant", "cell"}
        other = settings.get(ref.get("setting")) if ok else None
        if ok and ref["setting"] == "paper":
            other = Setting("paper")
        ok = ok and other is not None and ref["variant"] in ("paper", "tuned")
        ref_axes = {**axes, **other.axes} if ok else {}
        ok = (
            ok
            and isinstance(ref["cell"], dict)
            and all(v in ref_axes.get(a, []) for a, v in ref["cell"].items())
        )
        if not ok:
            raise ConfigError(f"{key}[{i}]: {{setting (another of the table's), variant (paper "
                              "or tuned), cell (values of that setting's axes)}}")  # fmt: skip


def _check_gains(key: str, s: Setting, settings: dict, axes: dict) -> None:
    """``gains: {axis, from, to, variant, reference: {setting, cell}}``: two values of one of
    the setting's axes, a test-set variant, and another setting whose axes hold both values
    and the reference ``cell``'s."""
    g = s.gains
    if g is None:
        return
    ok = isinstance(g, dict) and set(g) == {"axis", "from", "to", "variant", "reference"}
    mine = {**axes, **s.axes}
    ok = ok and g["from"] in mine.get(g["axis"], []) and g["to"] in mine.get(g["axis"], [])
    ok = ok and g["from"] != g["to"] and g["variant"] in ("paper", "tuned")
    ref = g["reference"] if ok else None
    ok = ok and isinstance(ref, dict) and set(ref) == {"setting", "cell"}
    other = settings.get(ref["setting"]) if ok else None
    theirs = {**axes, **other.axes} if other is not None else {}
    ok = ok and other is not None and isinstance(ref["cell"], dict)
    ok = ok and all(v in theirs.get(a, []) for a, v in ref["cell"].items())
    ok = ok and {g["from"], g["to"]} <= set(theirs.get(g["axis"], []))
    if not ok:
        raise ConfigError(f"{key}: {{axis, from, to (two of its values), variant (paper or "
                          "tuned), reference: {setting (another of the table's, with both "
                          "values), cell (values of its axes)}}")  # fmt: skip


DECISION_KEYS = {"row", "against", "variant", "holds", "above", "below", "max_seeds"}


def _check_decision(key: str, d: dict | None, axes: dict) -> None:
    """``decision``: two cells of the setting (``row``, ``against``: values of its axes), a
    test-set variant, a margin ``holds`` > 0, the two verdicts' words, ``max_seeds`` >= 2."""
    if d is None:
        return
    ok = isinstance(d, dict) and set(d) == DECISION_KEYS
    ok = ok and all(isinstance(d[c], dict) and d[c] and
                    all(v in axes.get(a, []) for a, v in d[c].items()) for c in ("row", "against"))  # fmt: skip
    ok = ok and d["variant"] in ("paper", "tuned") and isinstance(d["holds"], (int, float))
    ok = ok and d["holds"] > 0 and isinstance(d["max_seeds"], int) and d["max_seeds"] >= 2
    if not ok:
        raise ConfigError(f"{key}: {{row, against (values of the setting's axes), variant "
                          "(paper or tuned), holds (> 0), above, below (the verdicts), "
                          "max_seeds (>= 2)}")  # fmt: skip


def _check_simulated(path: Path, name: str, raw: dict) -> None:
    """A setting whose overrides simulate a noise level must say so (``simulated: true``)."""
    if raw.get("simulated") or "privacy.simulate." not in repr(
        (raw.get("overrides"), raw.get("axis_overrides"))
    ):
        return
    raise ConfigError(
        f"{path}: settings.{name}.simulated: its overrides set privacy.simulate (a simulated "
        "noise level, not a privacy guarantee); mark the setting `simulated: true` so its "
        "table says so"
    )


def _baseline(path: Path, raw: dict, axes: dict) -> tuple[str, Any]:
    """``baseline: {axis: value}``: the cells every other cell is compared with (default GP)."""
    b = raw.get("baseline") or {"mechanism": "dpsgd"}
    if not isinstance(b, dict) or len(b) != 1:
        raise ConfigError(f"{path}: baseline: one axis -> value, e.g. {{mechanism: dpsgd}}")
    ((axis, value),) = b.items()
    if axis not in axes or ("baseline" in raw and value not in axes[axis]):
        raise ConfigError(f"{path}: baseline: {axis}={value} is not a value of the table's axes")
    return axis, value


def _parse_tune(path: Path, key: str, raw: dict | None) -> Tune | None:
    if raw is None:
        return None
    bad = set(raw) - {"validation_size", "seed", "lr", "clip", "extend"}
    if bad or not {"validation_size", "lr", "clip"} <= set(raw):
        what = sorted(bad)[0] if bad else "validation_size, lr and clip"
        raise ConfigError(f"{path}: {key}: {what} (known: validation_size, seed, lr, clip, extend)")
    lr = raw["lr"]
    grids = lr.values() if isinstance(lr, dict) else [lr]
    if not all(isinstance(g, list) and g and min(map(float, g)) > 0 for g in grids):
        raise ConfigError(f"{path}: {key}.lr: a list of positive learning rates (or one per "
                          "mechanism)")  # fmt: skip
    if isinstance(lr, dict) and set(lr) != set(raw["clip"]):
        raise ConfigError(f"{path}: {key}.lr: one grid per mechanism of {key}.clip")
    lr = (
        {m: [float(x) for x in g] for m, g in lr.items()}
        if isinstance(lr, dict)
        else [float(x) for x in lr]
    )
    return Tune(int(raw["validation_size"]), int(raw.get("seed", 0)), lr, raw["clip"],
                int(raw.get("extend", 0)))  # fmt: skip


# ------------------------------------------------------------------- jobs
@dataclass
class Job:
    """One run of a table: a cell, a seed (or a tuning point), its overrides and its dir."""

    table: str
    setting: str
    variant: str  # paper | tune | tuned
    cell: dict
    seed: int
    overrides: list[str]
    dir: Path
    point: tuple[float, int] | None = None  # tuning grid point (lr, clip index)

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def finished(self) -> bool:
        return finished(self.dir)

    def hydra_overrides(self) -> list[str]:
        """Everything that composes this job's config, run dir included."""
        run_name = f"{self.table}-{self.setting}-{self.variant}-{self.name}"
        return [
            *self.overrides,
            f"out_dir={quote_value(str(self.dir))}",
            f"run_name={quote_value(run_name)}",
        ]


def finished(run_dir: Path) -> bool:
    return (Path(run_dir) / SUMMARY).is_file()


def cell_id(cell: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in cell.items())


SIM_MARK = " (simulated)"  # beside every number from runs that drew a simulated noise level


def sim_mark(found: dict, variant: str, cell: dict) -> str:
    """SIM_MARK for a cell whose runs make_table marked simulated (``found["simulated"]``)."""
    return SIM_MARK if f"{variant}/{cell_id(cell)}" in found.get("simulated", {}) else ""


def setting_dir(root: Path, table: Table, setting: str, extra: list[str]) -> Path:
    """``<root>/<table>/<setting>``; overrides that change a run are appended to the name."""
    name = setting + "".join(f"+{o}" for o in sorted(extra))
    return Path(root) / table.name / name.replace("/", "_")


STALE = ".stale"  # <setting>/.stale/<variant>/<run>@<time> (git-ignored)


def set_aside(run_dir: Path, setting: Path, variant: str) -> Path:
    """Move a stale run or search to ``<setting>/.stale/<variant>/<name>@<time>``, where its
    files are kept and the table no longer sees them; the new place."""
    dest = setting / STALE / variant / f"{run_dir.name}@{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(run_dir), str(dest))
    return dest


def plan_jobs(
    table: Table,
    setting: str,
    root: Path,
    variant: str = "paper",
    extra: list[str] = (),
    passthrough: list[str] = (),
    picks: dict[str, list[str]] | None = None,
) -> list[Job]:
    """Every job of a variant. ``extra``: overrides that change runs (they name the folder);
    ``passthrough``: overrides that do not (data.root, logging); ``picks``: cell id ->
    overrides of the tuned pick (variant ``tuned``)."""
    if variant not in VARIANTS:
        raise ValueError(variant)
    base = setting_dir(root, table, setting, list(extra)) / variant
    tail = [*extra, *passthrough]
    jobs = []
    for cell in table.cells(setting):
        cov = table.overrides_of(cell, setting)
        cid = cell_id(cell)
        if variant == "tune":
            tune = _tune_of(table, setting)
            jobs += _tune_jobs(table, setting, tune, cell, base, cov, tail)
            continue
        pick = []
        if variant == "tuned":
            if picks is None or cid not in picks:
                continue  # not tuned yet
            pick = picks[cid]
        for seed in table.seeds_of(setting, cell):
            d = base / f"{cid},seed={seed}"
            jobs.append(
                Job(
                    table.name,
                    setting,
                    variant,
                    cell,
                    seed,
                    [*cov, *pick, f"seed={seed}", *tail],
                    d,
                )
            )
    return jobs


def _tune_of(table: Table, setting: str = "paper") -> Tune:
    tune = table.tune_of(setting)
    if tune is None:
        raise ConfigError(f"table {table.name}: no tune section (cannot --tune)")
    return tune


def _tune_jobs(table, setting, tune: Tune, cell, base: Path, cov, tail) -> list[Job]:
    """A cell's tuning jobs over its lr grid, extended while the best lr (by validation
    accuracy, once every point ran) is at an edge, at most ``tune.extend`` times a side."""
    cid, mech = cell_id(cell), cell["mechanism"]
    lrs, grown = sorted(tune.lrs_of(mech)), {"low": 0, "high": 0}
    while True:
        jobs = []
        for lr, ci in tune.points(mech, lrs):
            ov = [*cov, *tune_overrides(tune, mech, lr, ci), f"seed={tune.seed}"]
            d = base / f"{cid},lr={lr},clip={ci}"
            jobs.append(Job(table.name, setting, "tune", cell, tune.seed, ov + tail, d, (lr, ci)))
        if not tune.extend or not all(j.finished for j in jobs):
            return jobs
        scores = [read_summary(j.dir).get("validation_accuracy", -math.inf) for j in jobs]
        best = jobs[max(range(len(jobs)), key=lambda i: (scores[i], -i))].point[0]
        side = "low" if best == lrs[0] else "high" if best == lrs[-1] else None
        if side is None or grown[side] >= tune.extend:
            return jobs
        grown[side] += 1
        new = lrs[0] / tune.step(mech) if side == "low" else lrs[-1] * tune.step(mech)
        lrs = sorted([*lrs, float(f"{new:.6g}")])


def tune_overrides(tune: Tune, mechanism: str, lr: float, clip: int, validation: bool = True):
    """The overrides of one tuning point (with the validation split unless ``validation=False``)."""
    ov = [f"optim.lr={lr}", *tune.clip[mechanism][clip]]
    return [*ov, f"dataset.validation_size={tune.validation_size}"] if validation else ov


# ---------------------------------------------------------------- results
def read_summary(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / SUMMARY).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{Path(run_dir) / SUMMARY}: not readable ({e})") from None


def pick_best(table: Table, jobs: list[Job]) -> dict[str, dict]:
    """Per cell, the tuning point with the best validation accuracy (ties: the first in grid
    order). Cells whose tuning jobs are not all finished are left out."""
    by_cell: dict[str, list[Job]] = {}
    for j in jobs:
        by_cell.setdefault(cell_id(j.cell), []).append(j)
    picks = {}
    for cid, cjobs in by_cell.items():
        if not all(j.finished for j in cjobs):
            continue
        tune = _tune_of(table, cjobs[0].setting)
        scores = [read_summary(j.dir).get("validation_accuracy", -math.inf) for j in cjobs]
        best = max(range(len(cjobs)), key=lambda i: (scores[i], -i))
        lr, ci = cjobs[best].point
        mech = cjobs[best].cell["mechanism"]
        picks[cid] = {
            "lr": lr,
            "clip": ci,
            "overrides": tune_overrides(tune, mech, lr, ci, validation=False),
            "lrs": sorted({j.point[0] for j in cjobs}),
            "validation_accuracy": scores[best],
            "grid": {j.name: s for j, s in zip(cjobs, scores, strict=True)},
        }
    return picks


def seed_stats(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample std (0 for one value), n)."""
    if not values:
        return math.nan, math.nan, 0
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std, len(values)
