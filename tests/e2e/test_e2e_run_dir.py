"""A run dir in use is refused to a second process (slow: two CLI processes)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from dpsub.errors import ConfigError
from dpsub.training.checkpoint import lock_run_dir

from conftest import REPO, SYNTH, cli_command, run_cli
from helpers.runs import wait_for


def test_a_run_dir_in_use_is_refused_to_a_second_process(tmp_path):
    """``resume=`` while the run is alive: one line naming the holder's pid, exit 2."""
    run_dir = tmp_path / "run"
    args, env = cli_command(
        *SYNTH, "train.epochs=1000", "train.checkpoint_every=1", run_dir=run_dir
    )
    holder = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for((run_dir / "checkpoint.pt").exists, holder, "the first checkpoint")
        second = run_cli(f"resume={run_dir}", check=False)
        assert holder.poll() is None, "the holder ended: the test proves nothing"
        assert second.returncode == 2, second.stderr[-2000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and str(run_dir) in lines[0]
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):  # and in this process
            lock_run_dir(run_dir, "out_dir")
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash, too, releases the lock
        holder.wait(timeout=60)
    release = lock_run_dir(run_dir, "resume")
    release()
