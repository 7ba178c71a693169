"""CLI errors that need a whole CLI run to reach (slow)."""

from __future__ import annotations

import shutil

import pytest

from conftest import SYNTH, run_cli
from helpers.cli_errors import fails, one_line_error


@pytest.mark.parametrize(
    "overrides",
    [
        ["privacy.noise_multiplier=0.2"],  # planned: known before the run dir is made
        ["mechanism=dphero", "privacy.noise_multiplier=2"],  # honest: known after one step
    ],
)
def test_a_budget_below_one_step_is_an_error_not_an_empty_run(tmp_path, overrides):
    """It was a 0-step run, exit 0, epsilon 0.0; now one line, exit 2, no run dir left."""
    line = one_line_error(fails(tmp_path, *SYNTH, *overrides), "privacy.epsilon", "one step")
    assert ("dphero_mnist_lenet" in line) == ("mechanism=dphero" in overrides)


def test_resume_takes_a_group_override_of_an_allowed_group(tmp_path, finished):
    run_dir = shutil.copytree(finished, tmp_path / "run")
    proc = run_cli(f"resume={run_dir}", "logger=disabled", "train.eval_every=1", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
