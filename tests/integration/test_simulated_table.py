"""A rendered table never shows a simulated noise level (privacy.simulate) unmarked: it is
not a privacy guarantee, so the setting must be declared ``simulated: true`` and every
simulated cell and verdict carries the mark."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dpsub.errors import ConfigError
from dpsub.experiments import tables

from helpers.tables import TINY, load_script

SIMULATED = {"batch_size": 1000, "noise_multiplier_ref": 2.297, "epsilon_ref": 2.0,
             "delta_ref": 1e-5, "dataset_size_ref": 50000, "run_batch_size": 64}  # fmt: skip


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
