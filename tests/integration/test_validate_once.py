"""A run validates its config once (issue 38.5): the command line's Settings go to the trainer."""

from __future__ import annotations

import dpsub.config as config

from conftest import SYNTH, compose_cfg


def test_a_cli_run_validates_its_config_once(tmp_path, monkeypatch):
    from dpsub.cli.train import train_run

    calls = []
    check = config._check_combinations
    monkeypatch.setattr(
        config, "_check_combinations", lambda typed: calls.append(1) or check(typed)
    )
    cfg = compose_cfg(*SYNTH, "model=linear", "train.max_steps=1")
    train_run(cfg, tmp_path / "run")
    assert len(calls) == 1
