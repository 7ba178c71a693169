"""``hydra.run.dir=X`` and ``--config-dir`` on the real command line (slow: two CLI runs;
the checks themselves run in-process in tests/integration/test_hydra_conventions.py)."""

from __future__ import annotations

import json

from conftest import SYNTH, run_cli


def test_hydra_run_dir_receives_the_run(tmp_path):
    run_cli(*SYNTH, f"hydra.run.dir={tmp_path / 'X'}", "train.max_steps=1")
    assert json.loads((tmp_path / "X" / "summary.json").read_text())["steps"] == 1


def test_an_experiment_in_ones_own_config_dir_runs(tmp_path):
    conf = tmp_path / "my_conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "foo.yaml").write_text("# @package _global_\ntrain:\n  max_steps: 2\n")
    run = tmp_path / "run"
    run_cli(f"--config-dir={tmp_path / 'my_conf'}", *SYNTH, "experiment=foo", run_dir=run)
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
