"""A rendered table never shows a simulated noise level (privacy.simulate) unmarked: it is
not a privacy guarantee, so the setting must be declared ``simulated: true`` and every
simulated cell and verdict carries the mark."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dpsub import tables
from dpsub.errors import ConfigError

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
