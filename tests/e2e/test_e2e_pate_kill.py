"""dpsub-pate killed (SIGKILL) in the middle of answering queries, then resumed: privacy
is spent once (the same answers, the same ledger) and the result is the same as a run
that was never interrupted (issue 23, done-when 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO

ARGS = [
    "pate.teachers=8", "pate.public_size=150", "pate.sigma2=3.0", "privacy.epsilon=40",
    "pate.teacher.epochs=8", "pate.teacher.chunk=8", "pate.student.epochs=15",
    "pate.checkpoint_every=1", "logger=disabled", "device=cpu",
]  # fmt: skip


def _pate(*args, **kw):
    cmd = [sys.executable, "-m", "dpsub.cli.pate", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)  # fmt: skip


def _state(run):
    try:
        return json.loads((run / "pate_state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@pytest.mark.slow
def test_sigkill_mid_aggregation_then_resume_spends_privacy_once(tmp_path):
    whole = tmp_path / "whole"
    proc = _pate(*ARGS, f"out_dir={whole}")
    assert proc.wait(timeout=900) == 0, proc.stdout.read()[-3000:]

    killed = tmp_path / "killed"
    proc = _pate(*ARGS, f"out_dir={killed}")
    deadline = time.monotonic() + 900
    while (state := _state(killed)) is None or state["next"] < 5:
        assert proc.poll() is None and time.monotonic() < deadline, "finished before the kill"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    at_kill = _state(killed)
    assert not at_kill["done"] and 0 < at_kill["next"] < 150, at_kill["next"]
    assert not (killed / "summary.json").exists()

    proc = _pate(f"resume={killed}")
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-3000:]
    assert "teachers:" not in out  # the votes were read back, not retrained
    a, b = _state(whole), _state(killed)
    assert b["labels"] == a["labels"]  # replayed queries drew the same noise: same answers
    assert len({i for i, _ in b["labels"]}) == len(b["labels"])  # none answered twice
    assert b["ledger"] == a["ledger"]  # the same privacy spent, charged once per query
    sa = json.loads((whole / "summary.json").read_text())
    sb = json.loads((killed / "summary.json").read_text())
    assert sb == sa  # test accuracy, both epsilons, queries: the same result
