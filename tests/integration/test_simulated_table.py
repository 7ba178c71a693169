"""A rendered table never shows a simulated noise level (privacy.simulate) unmarked: it is
not a privacy guarantee, so the setting must be declared ``simulated: true`` and every
simulated cell and verdict carries the mark."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dpsub.errors import ConfigError
from dpsub.experiments import stats, tables

from helpers.tables import SIMULATED, TINY, load_script


def rendered(tmp_path, text: str, gep: str):
    """make_table's pieces over fake finished runs of the tiny table (GP real, GEP ``gep``:
    real, sim or mixed (seed 1 simulated); 2 seeds)."""
    make_table = load_script("make_table")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(text)
    table = tables.load_table(spec)
    for mech, acc in (("dpsgd", 0.5), ("gep", 0.6)):
        for seed in (0, 1):
            d = tables.setting_dir(tmp_path, table, "tiny", []) / "paper"
            d = d / f"mechanism={mech},epsilon=2,seed={seed}"
            d.mkdir(parents=True)
            simulated = mech == "gep" and (gep == "sim" or (gep == "mixed" and seed == 1))
            sim = {"simulated": SIMULATED} if simulated else {}
            summary = {"test_accuracy": acc + seed / 100, "epsilon": 27.0 + seed, **sim}
            (d / "summary.json").write_text(json.dumps(summary))
    found = make_table.collect(table, SimpleNamespace(setting="tiny", extra=[], runs=tmp_path))
    found["simulated"] = make_table.simulation_marks(table, found, "tiny")
    return make_table, table, found


def write_runs(root, table, setting: str, cell: str, values: list) -> None:
    """Finished fake runs of ``cell`` (its folder name) at seeds 0, 1, ... with these test
    accuracies, in the ``paper`` variant of ``setting``."""
    for seed, acc in enumerate(values):
        d = tables.setting_dir(root, table, setting, []) / "paper" / f"{cell},seed={seed}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"test_accuracy": acc}))


MARKED = TINY.replace("    note: two steps", "    simulated: true\n    note: two steps")


def test_simulated_runs_in_an_unmarked_setting_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="simulated: true"):
        rendered(tmp_path, TINY, "sim")


def test_a_marked_setting_marks_each_simulated_cell_and_says_what_it_is(tmp_path):
    make_table, table, found = rendered(tmp_path, MARKED, "sim")
    gp, gep = make_table.markdown_table(table, found, "tiny")[2:]
    assert gep.startswith("| gep") and "(simulated)" in gep and "(simulated)" not in gp
    note = "\n".join(make_table.simulation_note(found["simulated"]))
    assert "Simulated noise level, not a privacy guarantee" in note
    assert "batch 64 drawing the noise of batch 1000 at z_ref 2.297" in note
    assert "own epsilon, from the noise they drew: 27-28" in note
    verdict = "\n".join(make_table.verdict_lines(table, found, "tiny"))
    assert "(simulated)" in verdict


def test_a_cell_mixing_simulated_and_real_runs_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="1 of 2 runs"):
        rendered(tmp_path, MARKED, "mixed")


def test_a_table_setting_that_simulates_must_be_marked(tmp_path):
    spec = tmp_path / "t.yaml"
    sim = "train.max_steps=2, privacy.simulate.batch_size=100,"
    spec.write_text(TINY.replace("train.max_steps=2,", sim))
    with pytest.raises(ConfigError, match="settings.tiny.simulated"):
        tables.load_table(spec)
    spec.write_text(MARKED.replace("train.max_steps=2,", sim))
    assert tables.load_table(spec).setting("tiny").simulated


CHECKED = """\
title: Scaling
metric: test_accuracy
layout: {rows: mechanism, columns: epsilon}
experiment: demo
axes: {mechanism: [dpsgd], epsilon: [2]}
paper: [{mechanism: dpsgd, epsilon: 2, value: 50}]
settings:
  s:
    simulated: true
    metric: validation_accuracy
    axes: {batch: [1000, 128]}
    seeds: {all: [0, 1], "batch=1000": [0]}
    axis_overrides: {batch: {1000: [train.batch_size=1000], 128: [train.batch_size=128]}}
    check: {axis: batch, reference: 1000, steps: [100, 200], n: 5000}
"""


def test_the_scaling_check_accepts_a_reference_inside_the_widened_spread(tmp_path):
    """Inside [min - w, max + w] at every step (w = sqrt(p (1 - p) / n)): accepted; one step
    outside: rejected."""
    make_table = load_script("make_table")
    spec = tmp_path / "t.yaml"
    spec.write_text(CHECKED)
    table = tables.load_table(spec)
    w = (0.5 * 0.5 / 5000) ** 0.5  # 0.00707 at p = 0.5

    def runs(reference_at_200: float):
        curves = {(1000, 0): {100: 0.5, 200: reference_at_200}, (128, 0): {100: 0.49, 200: 0.50},
                  (128, 1): {100: 0.51, 200: 0.52}}  # fmt: skip
        for (batch, seed), curve in curves.items():
            d = tables.setting_dir(tmp_path, table, "s", []) / "paper"
            d = d / f"mechanism=dpsgd,epsilon=2,batch={batch},seed={seed}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "summary.json").write_text(json.dumps({"validation_accuracy": curve[200]}))
            lines = [json.dumps({"step": st, "validation/accuracy": a}) for st, a in curve.items()]
            (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        found = make_table.collect(table, SimpleNamespace(setting="s", extra=[], runs=tmp_path))
        return "\n".join(make_table.check_lines(table, found, "s"))

    assert "**accepted**" in runs(0.52 + 0.9 * w)
    text = runs(0.52 + 1.1 * w)
    assert "**rejected**" in text and "| 200 |" in text and "**no**" in text


COMPARED = """\
title: Attribution
metric: test_accuracy
layout: {rows: mechanism, columns: epsilon}
experiment: demo
axes: {mechanism: [dpsgd, gep], epsilon: [2]}
seeds: [0, 1, 2]
paper: [{mechanism: dpsgd, epsilon: 2, value: 50}]
settings:
  long: {note: the reduced setting}
  attr:
    axes: {mechanism: [gep]}
    compare: [{setting: long, variant: paper, cell: {mechanism: dpsgd}}]
"""


def test_a_setting_is_welch_tested_against_the_rows_of_another(tmp_path):
    """``compare``: each row against the other setting's row at the same epsilon."""
    make_table = load_script("make_table")
    spec = tmp_path / "t.yaml"
    spec.write_text(COMPARED)
    table = tables.load_table(spec)
    accs = {("long", "dpsgd"): [0.40, 0.42, 0.41], ("long", "gep"): [0.1, 0.1, 0.1],
            ("attr", "gep"): [0.30, 0.31, 0.29]}  # fmt: skip
    for (setting, mech), values in accs.items():
        write_runs(tmp_path, table, setting, f"mechanism={mech},epsilon=2", values)
    args = SimpleNamespace(setting="attr", extra=[], runs=tmp_path)
    found = make_table.collect(table, args)
    (row,) = [r for r in make_table.compare_lines(table, args, found, "attr") if "| gep, 2 |" in r]
    assert (
        "`long` dpsgd (paper)" in row
        and "| -11.00 [-13.27, -8.73] |" in row
        and "not significant" not in row
    )
    empty = {v: {} for v in ("paper", "tuned", "tune")}
    assert make_table.compare_lines(table, args, empty, "attr") == []  # no runs: no section


def test_a_comparison_names_another_setting_and_a_test_set_variant(tmp_path):
    spec = tmp_path / "t.yaml"
    for bad in ("setting: nope", "variant: tune", "cell: {mechanism: rgp}"):
        key = bad.split(":")[0]
        ref = {"setting": "setting: long", "variant": "variant: paper",
               "cell": "cell: {mechanism: dpsgd}"}  # fmt: skip
        ref[key] = bad
        spec.write_text(
            COMPARED.replace(
                "{setting: long, variant: paper, cell: {mechanism: dpsgd}}",
                "{" + ", ".join(ref.values()) + "}",
            )
        )
        with pytest.raises(ConfigError, match="settings.attr.compare"):
            tables.load_table(spec)


def test_copy_only_copies_finished_runs_small_files_and_renders_nothing(tmp_path, capsys):
    """make_table --copy-only: commit runs as they finish without rendering (reading) the table."""
    make_table = load_script("make_table")
    spec = tmp_path / "t.yaml"
    spec.write_text(COMPARED)
    table = tables.load_table(spec)
    base = tables.setting_dir(tmp_path / "runs", table, "attr", []) / "paper"
    for seed, finished in ((0, True), (1, False)):
        d = base / f"mechanism=gep,epsilon=2,seed={seed}"
        d.mkdir(parents=True)
        (d / "checkpoint.pt").write_bytes(b"x")
        (d / "train.log").write_text("log\n")
        (d / "ledger.json").write_text("{}")
        if finished:
            (d / "summary.json").write_text(json.dumps({"test_accuracy": 0.3}))
    out = tmp_path / "out"
    argv = [str(spec), "--setting", "attr", "--runs", str(tmp_path / "runs"), "--out", str(out),
            "--copy-only"]  # fmt: skip
    assert make_table.main(argv) == 0
    assert "README.md" not in capsys.readouterr().out
    dest = tables.setting_dir(out, table, "attr", [])
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    run = "paper/mechanism=gep,epsilon=2,seed=0/"
    assert copied == [run + "ledger.json", run + "summary.json", run + "train.log"]
    assert make_table.main(argv) == 0  # the same runs again: nothing changes

    (base / "mechanism=gep,epsilon=2,seed=0/summary.json").write_text('{"test_accuracy": 0.4}')
    with pytest.raises(SystemExit) as e:  # another run of a cell already copied
        make_table.main(argv)
    assert e.value.code == 2 and "another finished run" in capsys.readouterr().err
    assert json.loads((dest / run / "summary.json").read_text()) == {"test_accuracy": 0.3}


def test_averaged_weights_are_tested_against_the_raw_ones_of_the_same_runs(tmp_path):
    """train.ema_eval=both runs: the table pairs each run's averaged and raw final accuracy."""
    make_table = load_script("make_table")
    spec = tmp_path / "t.yaml"
    spec.write_text(COMPARED)
    table = tables.load_table(spec)
    base = tables.setting_dir(tmp_path / "runs", table, "attr", []) / "paper"
    for seed, (avg, raw) in enumerate([(0.45, 0.40), (0.46, 0.42), (0.44, 0.41)]):
        d = base / f"mechanism=gep,epsilon=2,seed={seed}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"test_accuracy": avg}))
        rows = [{"step": 5, "test/accuracy": 0.1, "test/raw_accuracy": 0.1},
                {"step": 10, "test/accuracy": avg, "test/raw_accuracy": raw}]  # fmt: skip
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = make_table.collect(
        table, SimpleNamespace(setting="attr", extra=[], runs=tmp_path / "runs")
    )
    text = "\n".join(make_table.ema_lines(table, found, "attr"))
    assert "| gep, 2 (paper) | 45.00 ± 1.00" in text and "41.00 ± 1.00" in text
    assert "+4.00 [+1.52, +6.48] > (p=" in text
    assert (
        make_table.ema_lines(
            table,
            make_table.collect(
                table, SimpleNamespace(setting="long", extra=[], runs=tmp_path / "none")
            ),
            "long",
        )
        == []
    )


GAINS = """\
title: Views
metric: test_accuracy
layout: {rows: augmult, columns: mechanism}
experiment: demo
axes: {mechanism: [dpsgd, gep], augmult: [1, 4]}
seeds: [0, 1, 2]
paper: []
settings:
  gp: {axes: {mechanism: [dpsgd]}}
  gep:
    axes: {mechanism: [gep]}
    gains: {axis: augmult, from: 1, to: 4, variant: paper,
            reference: {setting: gp, cell: {mechanism: dpsgd}}}
"""


def gains_text(tmp_path, accs: dict) -> str:
    """make_table's "Gains" section over fake runs: (setting, mechanism, K) -> accuracies."""
    make_table = load_script("make_table")
    spec = tmp_path / "g.yaml"
    spec.write_text(GAINS)
    table = tables.load_table(spec)
    for (setting, mech, k), values in accs.items():
        write_runs(tmp_path, table, setting, f"mechanism={mech},augmult={k}", values)
    args = SimpleNamespace(setting="gep", extra=[], runs=tmp_path)
    return "\n".join(make_table.gains_lines(table, args, make_table.collect(table, args), "gep"))


def test_the_gains_rule_tests_each_arm_s_gain_and_their_difference(tmp_path):
    """``gains``: GEP gains +1 from K = 4, GP +5: "gains less" (Welch-Satterthwaite)."""
    gp = {("gp", "dpsgd", 1): [0.40, 0.41, 0.42], ("gp", "dpsgd", 4): [0.45, 0.46, 0.47]}
    text = gains_text(tmp_path, {**gp, ("gep", "gep", 1): [0.30, 0.31, 0.32],
                                 ("gep", "gep", 4): [0.31, 0.32, 0.33]})  # fmt: skip
    assert (
        "| gep | 31.00 ± 1.00" in text
        and "| +1.00 [-1.27, +3.27] | 0.29 (**not significant**) |" in text
    )
    assert "| dpsgd (`gp`) |" in text and "| +5.00 [+2.73, +7.27] | 0.0" in text
    d = stats.difference_of_gains([31, 32, 33], [30, 31, 32], [45, 46, 47], [40, 41, 42])
    assert f"| {d.diff:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] | {d.p:.2g}: **gains less** |" in text


def test_the_gains_rule_says_inconclusive_when_the_interval_dwarfs_a_gain(tmp_path):
    gp = {("gp", "dpsgd", 1): [0.40, 0.41, 0.42], ("gp", "dpsgd", 4): [0.42, 0.43, 0.44]}
    noisy = {("gep", "gep", 1): [0.25, 0.31, 0.37], ("gep", "gep", 4): [0.27, 0.33, 0.39]}
    assert "**inconclusive**" in gains_text(tmp_path, {**gp, **noisy})
    (tmp_path / "none").mkdir()
    assert gains_text(tmp_path / "none", gp) == ""  # no GEP runs: no section


def test_a_gains_rule_names_two_values_and_another_setting_with_them(tmp_path):
    spec = tmp_path / "g.yaml"
    for bad in ("to: 8", "from: 4", "variant: tune", "setting: nope", "cell: {mechanism: rgp}"):
        old = {"to": "to: 4", "from": "from: 1", "variant": "variant: paper",
               "setting": "setting: gp", "cell": "cell: {mechanism: dpsgd}"}[bad.split(":")[0]]  # fmt: skip
        spec.write_text(GAINS.replace(old, bad, 1))
        with pytest.raises(ConfigError, match="settings.gep.gains"):
            tables.load_table(spec)


DECIDED = """\
title: Regime
metric: test_accuracy
layout: {rows: mechanism, columns: epsilon}
experiment: demo
axes: {mechanism: [dpsgd, gep], epsilon: [2]}
seeds: [0, 1, 2, 3]
paper: []
settings:
  sim:
    decision: {row: {mechanism: gep}, against: {mechanism: dpsgd}, variant: paper, holds: 5,
               above: the ordering holds, below: the reversal is robust, max_seeds: 4}
"""


def decision_text(tmp_path, gep: list, gp: list) -> str:
    make_table = load_script("make_table")
    spec = tmp_path / "d.yaml"
    spec.write_text(DECIDED)
    table = tables.load_table(spec)
    for mech, values in (("gep", gep), ("dpsgd", gp)):
        write_runs(tmp_path, table, "sim", f"mechanism={mech},epsilon=2", values)
    args = SimpleNamespace(setting="sim", extra=[], runs=tmp_path)
    return "\n".join(make_table.decision_lines(table, make_table.collect(table, args), "sim"))


@pytest.mark.parametrize(
    "gep, gp, verdict",
    [
        ([0.56, 0.57, 0.58], [0.50, 0.51, 0.52], "**the ordering holds**"),  # +6, significant
        ([0.49, 0.50, 0.51], [0.50, 0.51, 0.52], "**the reversal is robust**"),  # -1
        ([0.52, 0.53, 0.54], [0.50, 0.51, 0.52], "**in between: add seed 3"),  # +2
        ([0.52, 0.53, 0.54, 0.53], [0.50, 0.51, 0.52, 0.51], "**unresolved**"),  # 4 = max
        ([0.50, 0.62, 0.56], [0.50, 0.51, 0.52], "**in between: add seed 3"),  # +5, p > 0.05
    ],
)
def test_the_decision_rule_gives_the_verdict_written_before_the_runs(tmp_path, gep, gp, verdict):
    text = decision_text(tmp_path, gep, gp)
    assert "gep - dpsgd >= +5 with Welch p < 0.05" in text and verdict in text, text


def test_a_decision_rule_names_cells_of_its_setting_and_a_positive_margin(tmp_path):
    spec = tmp_path / "d.yaml"
    for old, bad in (("holds: 5", "holds: 0"), ("{mechanism: dpsgd}", "{mechanism: rgp}"),
                     ("variant: paper", "variant: tune"), ("max_seeds: 4", "max_seeds: 1")):  # fmt: skip
        spec.write_text(DECIDED.replace(old, bad, 1))
        with pytest.raises(ConfigError, match="settings.sim.decision"):
            tables.load_table(spec)
