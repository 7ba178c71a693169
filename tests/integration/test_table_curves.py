"""A setting's ``curves: true`` renders its runs' learning curves under the table: every
evaluation per row (mean ± std [interval] over seeds), the raw weights beside the averaged
ones, each row against the baseline at the same step (Welch), and curves.png."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dpsub.errors import ConfigError
from dpsub.experiments import stats, tables

from helpers.tables import SIMULATED, load_script

SPEC = """\
title: Curves
metric: test_accuracy
layout: {rows: mechanism, columns: epsilon}
experiment: demo
axes: {mechanism: [dpsgd, gep], epsilon: [2]}
seeds: [0, 1, 2]
paper: []
settings:
  long: {curves: true}
  plain: {}
  sim: {curves: true, simulated: true}
"""
#: (mechanism) -> per seed, the test accuracy at steps 5 and 10 (GEP's raw weights too)
CURVES = {"dpsgd": [(0.20, 0.40), (0.22, 0.42), (0.21, 0.41)],
          "gep": [(0.30, 0.50), (0.31, 0.52), (0.29, 0.51)]}  # fmt: skip


def runs(tmp_path, setting: str):
    """make_table, the table and the fake finished runs of ``setting`` (3 seeds each)."""
    make_table = load_script("make_table")
    spec = tmp_path / "c.yaml"
    spec.write_text(SPEC)
    table = tables.load_table(spec)
    for mech, seeds in CURVES.items():
        for seed, (a5, a10) in enumerate(seeds):
            d = tables.setting_dir(tmp_path, table, setting, []) / "paper"
            d = d / f"mechanism={mech},epsilon=2,seed={seed}"
            d.mkdir(parents=True)
            sim = {"simulated": SIMULATED} if setting == "sim" and mech == "gep" else {}
            (d / "summary.json").write_text(json.dumps({"test_accuracy": a10, **sim}))
            raw = {"test/raw_accuracy": a10 - 0.1 - seed / 100} if mech == "gep" else {}
            rows = [{"step": 1, "lr": 0.1}, {"step": 5, "test/accuracy": a5},
                    {"step": 10, "test/accuracy": a10, **raw}]  # fmt: skip
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = make_table.collect(table, SimpleNamespace(setting=setting, extra=[], runs=tmp_path))
    found["simulated"] = make_table.simulation_marks(table, found, setting)
    return make_table, table, found


def test_each_row_s_curve_and_its_difference_from_the_baseline_at_each_step(tmp_path):
    make_table, table, found = runs(tmp_path, "long")
    from dpsub.experiments import curves

    text = "\n".join(curves.curve_lines(table, found, "long"))
    assert "| row | step 5 | step 10 |" in text
    gp = stats.summarize([20.0, 22.0, 21.0]).text()
    assert f"| dpsgd, 2 (paper) | {gp} | {stats.summarize([40.0, 42.0, 41.0]).text()} |" in text
    assert "| gep, 2 (paper), raw weights | – | " in text  # scored at step 10 only
    at5 = stats.compare([20.0, 22.0, 21.0], [30.0, 31.0, 29.0]).text()
    at10 = stats.compare([40.0, 42.0, 41.0], [50.0, 52.0, 51.0]).text()
    assert f"| *gep, 2 (paper) − dpsgd* | {at5} | {at10} |" in text
    assert at5.startswith("+9.00 [+6.73, +11.27] > (p=")  # the seeds' own Welch interval

    dest = tmp_path / "out"
    dest.mkdir()
    assert curves.plot(table, found, "long", dest) == [dest / "curves.png"]
    assert (dest / "curves.png").stat().st_size > 0
    assert "Learning curves" in make_table.readme(
        table, SimpleNamespace(setting="long", extra=[], runs=tmp_path), found,
        {"commit": "x", "date": "d", "hardware": "h", "notes": []}, [], {},
    )  # fmt: skip


def test_no_curves_unless_the_setting_asks(tmp_path):
    make_table, table, found = runs(tmp_path, "plain")
    from dpsub.experiments import curves

    assert curves.curve_lines(table, found, "plain") == []
    assert curves.figure(table, found, "plain", tmp_path) == []


def test_curves_must_be_a_boolean(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(SPEC.replace("curves: true", "curves: yes please"))
    with pytest.raises(ConfigError, match=r"settings\.long\.curves: true or false"):
        tables.load_table(spec)


def test_a_simulated_row_and_its_comparison_carry_the_mark(tmp_path):
    """A simulated noise level is not a privacy guarantee: its curve rows say so."""
    make_table, table, found = runs(tmp_path, "sim")
    from dpsub.experiments import curves

    text = "\n".join(curves.curve_lines(table, found, "sim"))
    assert "| gep, 2 (paper) (simulated) | " in text
    assert "| gep, 2 (paper), raw weights (simulated) | " in text
    assert "| *gep, 2 (paper) (simulated) − dpsgd* | " in text
    assert "| dpsgd, 2 (paper) | " in text  # the real row stays unmarked
