"""The tiny results table and the scripts' runner, shared by the integration and e2e suites."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpsub.config import validate
from dpsub.experiments import tables

from conftest import REPO, SCRIPT_MODULES, compose_cfg

SCRIPTS = REPO / "scripts"


def load_script(name: str):
    """The module that ``scripts/<name>.py`` runs (dpsub.experiments.<module>)."""
    return importlib.import_module(f"dpsub.experiments.{SCRIPT_MODULES.get(name, name)}")


#: a summary's ``simulated`` entry (privacy.simulate) for fake runs of the tables' tests
SIMULATED = {"batch_size": 1000, "noise_multiplier_ref": 2.297, "epsilon_ref": 2.0,
             "delta_ref": 1e-5, "dataset_size_ref": 50000, "run_batch_size": 64}  # fmt: skip

TINY = """\
title: Tiny table
source: a test
metric: test_accuracy
kind: table
layout: {rows: mechanism, columns: epsilon}
experiment: demo
axes:
  mechanism: [dpsgd, gep]
  epsilon: [2]
overrides:
  mechanism: ["mechanism={mechanism}"]
  epsilon: ["privacy.epsilon={epsilon}"]
seeds: [0, 1]
paper:
  - {mechanism: dpsgd, epsilon: 2, value: 50.0}
  - {mechanism: gep, epsilon: 2, value: 60.0}
settings:
  tiny:
    note: two steps of a small batch
    overrides:
      all: [train.max_steps=2, train.batch_size=64, grads.microbatch=64]
      gep: [aux=gaussian, aux.num_samples=32, mechanism.num_bases=8]
tune:
  validation_size: 100
  lr: [0.5, 1.0]
  clip:
    dpsgd: [[mechanism.clip=1.0]]
    gep: [[mechanism.clip_embedding=10.0, mechanism.clip_residual=2.0]]
"""


def script(name: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "WANDB_SILENT": "true"}
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, args)],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny table reproduced with --tune: real runs of a few steps each."""
    tmp = tmp_path_factory.mktemp("tables")
    spec = tmp / "tiny.yaml"
    spec.write_text(TINY)
    args = (spec, "--setting", "tiny", "--out", tmp / "runs", "--tune", "logger=disabled",
            "train.progress=false")  # fmt: skip
    proc = script("reproduce", *args, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, spec, args, proc


def one_cell_per_kind(cells: list[dict]) -> list[dict]:
    """The first cell of each combination of axes other than epsilon and seed (cells that
    differ in those only differ in values, not in the overrides they compose)."""
    kind = lambda c: tuple((k, v) for k, v in c.items() if k not in ("epsilon", "seed"))  # noqa: E731
    return list({kind(c): c for c in reversed(cells)}.values())


def check_cells(name: str, pick, ends: slice = slice(None)) -> None:
    """Every ``pick``ed cell of every setting composes and validates; where a setting tunes,
    with the ``ends`` of the grid's (first, last) points (the points differ only in values)."""
    t = tables.load_table(name)
    for setting in ["paper", *t.settings]:
        tune = t.tune_of(setting)
        for cell in pick(t.cells(setting)):
            ov = t.overrides_of(cell, setting)
            if not tune:
                validate(compose_cfg(*ov))
                continue
            points = list(tune.points(cell["mechanism"]))
            for lr, ci in (points[:1] + points[1:][-1:])[ends]:
                validate(compose_cfg(*ov, *tables.tune_overrides(tune, cell["mechanism"], lr, ci)))
