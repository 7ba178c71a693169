"""A failed CLI run: one line on stderr, exit code 2, nothing written; a finished run to resume."""

from __future__ import annotations

import subprocess

import pytest

from conftest import SYNTH, cli_in_process


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The single stderr line of a failed run, which must hold every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def fails(tmp_path, *overrides: str, env: dict | None = None):
    """Run the CLI (in this process) with an out_dir under tmp_path; check that nothing was
    created."""
    run_dir = tmp_path / "run"
    proc = cli_in_process(*overrides, run_dir=run_dir, check=False, env=env)
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    assert not (tmp_path / "outputs").exists()
    return proc


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step run to resume (tests of resume=)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    cli_in_process(*SYNTH, "train.max_steps=2", run_dir=run_dir)
    return run_dir
