"""gep1-cifar10's issue-37 settings and what they need of the table format: a setting's own
axis (stage0's batch), seeds per axis value, its own metric, per-mechanism lr grids
(sim-eps2), each edge extended by its own grid's ratio."""

from __future__ import annotations

import json

import pytest

from dpsub.errors import ConfigError
from dpsub.experiments import tables


def test_stage0_crosses_the_batch_axis_with_seeds_per_batch(tmp_path):
    t = tables.load_table("gep1-cifar10")
    s = t.setting("stage0")
    assert s.simulated and t.metric_of("stage0") == "validation_accuracy"
    assert t.metric_of("cpu-long") == "test_accuracy"
    jobs = tables.plan_jobs(t, "stage0", tmp_path)
    names = sorted(j.name for j in jobs)
    # per mechanism: B = 1,000 at seed 0, then B = 128, 256 and 512 at seeds 0 and 1
    assert len(jobs) == 2 * (1 + 3 * 2) and "mechanism=gep,epsilon=2,batch=1000,seed=0" in names
    assert "mechanism=dpsgd,epsilon=2,batch=1000,seed=1" not in names  # B=1000: seed 0 only
    assert t.label("batch", 128) == "B=128 noise-matched to B=1000"
    gp = [j for j in jobs if j.cell["mechanism"] == "dpsgd" and j.cell["batch"] == 128][0]
    assert "privacy.simulate.batch_size=1000" in gp.overrides and "optim.lr=0.5" in gp.overrides


def test_sim_eps2_grids_differ_per_mechanism_and_extend_by_their_own_ratio(tmp_path):
    t = tables.load_table("gep1-cifar10")
    tune = t.tune_of("sim-eps2")
    assert tune.lrs_of("dpsgd") == [0.25, 0.5, 1.0, 2.0] and tune.lrs_of("gep") == [0.05, 0.1, 0.2]
    assert len(tune.points("gep")) == 9 and len(tune.points("dpsgd")) == 4
    assert tune.step("dpsgd") == tune.step("gep") == 2.0
    jobs = tables.plan_jobs(t, "sim-eps2", tmp_path, "tune")
    gp = [j for j in jobs if j.cell["mechanism"] == "dpsgd"]
    for j in gp:  # the best lr at the high edge: the grid grows by x2 there
        j.dir.mkdir(parents=True)
        acc = j.point[0] / 10
        (j.dir / "summary.json").write_text(json.dumps({"validation_accuracy": acc}))
    grown = [j for j in tables.plan_jobs(t, "sim-eps2", tmp_path, "tune")
             if j.cell["mechanism"] == "dpsgd"]  # fmt: skip
    assert sorted({j.point[0] for j in grown}) == [0.25, 0.5, 1.0, 2.0, 4.0]


def test_sim_eps2_runs_both_arms_at_the_papers_batch_without_simulation(tmp_path):
    # stage0 rejected the noise-matched simulation for GP and for GEP (B = 128, 256, 512): both
    # arms run at B = 1,000 with their own epsilon-2 noise, for real
    t = tables.load_table("gep1-cifar10")
    jobs = tables.plan_jobs(t, "sim-eps2", tmp_path, "tune")
    last = lambda ovs, key: [o for o in ovs if o.startswith(key + "=")][-1]  # noqa: E731
    for mech in ("dpsgd", "gep"):
        ovs = [j for j in jobs if j.cell["mechanism"] == mech][0].overrides
        assert last(ovs, "train.batch_size") == "train.batch_size=1000"
        assert last(ovs, "privacy.simulate.batch_size") == "privacy.simulate.batch_size=null"
        assert last(ovs, "privacy.simulate.dataset_size") == "privacy.simulate.dataset_size=null"


BASE = """\
metric: test_accuracy
layout: {rows: mechanism, columns: epsilon}
experiment: demo
axes: {mechanism: [dpsgd, gep], epsilon: [2]}
paper: [{mechanism: dpsgd, epsilon: 2, value: 1}, {mechanism: gep, epsilon: 2, value: 1}]
"""


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ("settings: {s: {axes: {batch: [1, 2]}}}", "settings.s.axes: batch"),
        ("tune: {validation_size: 1, lr: {dpsgd: [0.1]}, clip: {dpsgd: [[]], gep: [[]]}}",
         "tune.lr: one grid per mechanism"),
        ("labels: {epsilon: {2: a}}\nsettings: {s: {labels: {epsilon: {2: b}}}}",
         "settings.s.labels.epsilon.2"),
    ],
)  # fmt: skip
def test_a_bad_setting_axis_grid_or_label_names_its_key(tmp_path, extra, fragment):
    spec = tmp_path / "t.yaml"
    spec.write_text(BASE + extra + "\n")
    with pytest.raises(ConfigError, match=fragment):
        tables.load_table(spec)
