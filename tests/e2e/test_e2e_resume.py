"""Kill and resume, every mechanism and signal (slow; the hardest case also runs in the
integration suite)."""

from __future__ import annotations

import signal

import pytest

from helpers.runs import check_kill_and_resume


@pytest.mark.parametrize(
    "mech,sig",
    [("dpsgd", signal.SIGTERM), ("dpsgd", signal.SIGKILL), ("gep", signal.SIGTERM)],
)
def test_kill_and_resume_reaches_the_same_run(tmp_path, references, mech, sig):
    check_kill_and_resume(tmp_path, references(mech), mech, sig)


def test_secure_run_killed_before_its_first_checkpoint_by_the_cli(tmp_path):
    """Issue 36.2 as reported: kill -9 before any checkpoint; the same command is refused in
    one line (exit 2), resume= continues it and its ledger counts both attempts."""
    import json
    import subprocess

    from conftest import REPO, cli_command, run_cli
    from helpers.runs import DEMO, logged_steps, wait_for

    run_dir = tmp_path / "run"
    over = (*DEMO, "privacy.rng=secure", "train.checkpoint_every=0", "train.log_every=1")
    args, env = cli_command(*over, run_dir=run_dir)
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: max(logged_steps(run_dir), default=0) >= 4, proc, "four steps")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    ledger = json.loads((run_dir / "ledger.json").read_text())
    killed = sum(n for *_, n in ledger["history"])
    assert killed >= 4 and not (run_dir / "checkpoint.pt").exists()

    again = run_cli(*over, run_dir=run_dir, check=False)
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stderr[-2000:]
    assert f"out_dir: {run_dir} already holds a run" in lines[0] and f"resume={run_dir}" in lines[0]

    run_cli(f"resume={run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert sum(n for *_, n in ledger["history"]) == killed + summary["steps"]
    assert summary["epsilon"] <= 3.0 and summary["stopped_by_budget"]
