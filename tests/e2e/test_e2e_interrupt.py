"""Ctrl-C (SIGINT) during dpsub-train's start-up, the seconds torch and the data take to load
(issue 36: a 77-line traceback): one line, exit code 130, no run dir."""

from __future__ import annotations

import signal
import subprocess
import time

from conftest import REPO, cli_command


def test_sigint_while_starting_is_one_line_and_leaves_nothing(tmp_path):
    args, env = cli_command("train.max_steps=1", run_dir=tmp_path / "run")
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    line = proc.stdout.readline()  # the plan line: the start-up window begins
    assert "plan:" in line, line
    assert time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert err == "dpsub: interrupted (Ctrl-C)\n"
    assert not (tmp_path / "run").exists()
