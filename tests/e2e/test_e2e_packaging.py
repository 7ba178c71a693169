"""The installed commands run from another directory (slow: installs and CLI runs)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import REPO
from helpers.packaging import _run


def test_installed_dpsub_train_runs_from_another_directory(installed: Path, tmp_path: Path) -> None:
    """The README's first command, from the wheel: the console script trains and prints epsilon."""
    script = installed.parent / "dpsub-train"
    env = {**os.environ, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    out = _run(
        script, "experiment=demo", "train.max_steps=3", "train.eval_every=0", "logger=disabled",
        "train.progress=false", f"out_dir={tmp_path / 'run'}", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert "final: test accuracy" in out and "epsilon" in out
    assert (tmp_path / "run" / "summary.json").is_file()
    assert not (tmp_path / "outputs").exists()  # nothing written where it was not asked


def test_installed_script_commands_run_from_another_directory(installed: Path, tmp_path: Path):
    """The research commands are console entry points (dpsub.experiments): each runs from the
    installed package and puts its outputs under the working directory, not the venv."""
    from dpsub.experiments.commands import COMMANDS

    bin_dir = installed.parent
    for command in COMMANDS:
        out = _run(bin_dir / command, "--help", cwd=tmp_path)
        assert out.startswith(f"usage: {command} "), command
    code = (
        "from dpsub.paths import committed_step_times, project_root\n"
        "from dpsub.experiments.commands import how_to_run\n"
        "print(project_root(), committed_step_times(), how_to_run('make_table.py'))"
    )
    root, times, render = _run(installed, "-c", code, cwd=tmp_path).split()
    assert Path(root) == tmp_path
    # the committed step times ship (dpsub-reproduce --dry-run's costs); messages name commands
    assert Path(times).read_bytes() == (REPO / "results/tables/step_times.json").read_bytes()
    assert render == "dpsub-table"
    # a real use: the run the console script trains, summarized by the installed command
    env = {**os.environ, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    _run(
        bin_dir / "dpsub-train", "experiment=demo", "train.max_steps=2", "train.eval_every=0",
        "logger=disabled", "train.progress=false", f"out_dir={tmp_path / 'run'}",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    table = _run(bin_dir / "dpsub-summarize", tmp_path / "run", cwd=tmp_path)
    assert "| run |" in table and "digits" in table
