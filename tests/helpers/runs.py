"""Runs shared by the integration and e2e suites: the demo run, kill-and-resume."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dpsub.rundir import SUMMARY
from dpsub.tracking import read_metrics

from conftest import REPO, cli_command, run_cli

DEMO = (
    "train.epochs=4",
    "train.batch_size=256",
    "optim.lr=1.0",
    "optim.momentum=0.0",
    "privacy.epsilon=3.0",
    "train.eval_every=5",
    "train.log_every=2",
)


RESUME_RUNS = {
    "dpsgd": (*DEMO, "train.epochs=12", "train.checkpoint_every=5", "train.eval_every=0", "train.log_every=1"),
    "gep": (
        *DEMO, "train.epochs=6", "train.checkpoint_every=5", "train.eval_every=0", "train.log_every=1",
        "mechanism=gep", "aux=gaussian", "aux.num_samples=64", "mechanism.num_bases=16",
        "mechanism.subspace_every=3",  # the basis is mid-window at every checkpoint (5, 10, ...)
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs, one per mechanism, made once, by the CLI as the killed runs are (the
    same process setup: an in-process run may have another thread count, and a diverging run
    then ends elsewhere)."""
    cache = {}

    def get(mech):
        if mech not in cache:
            run_dir = tmp_path_factory.mktemp(f"ref-{mech}") / "run"
            run_cli(*RESUME_RUNS[mech], run_dir=run_dir)
            cache[mech] = SimpleNamespace(**json.loads((run_dir / SUMMARY).read_text()))
        return cache[mech]

    return get


def wait_for(cond, proc, what: str, timeout: float = 600):
    """Poll ``cond`` (no fixed sleep stands in for it) while the run is alive."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def kill_mid_run(run_dir: Path, overrides, sig: int) -> int:
    """Start a run, kill it with ``sig`` between checkpoints; return the checkpoint's step."""
    args, env = cli_command(*overrides, run_dir=run_dir)
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ckpt = run_dir / "checkpoint.pt"
    wait_for(ckpt.exists, proc, "the first checkpoint")
    saved = torch.load(ckpt, weights_only=False)["state"]["step"]
    # past the checkpoint: SIGKILL then loses steps that must be replayed on resume
    wait_for(lambda: max(logged_steps(run_dir), default=0) >= saved + 2, proc, "two more steps")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    expected = 128 + sig if sig == signal.SIGTERM else -sig
    assert proc.returncode == expected, err.decode()[-2000:]
    return torch.load(ckpt, weights_only=False)["state"]["step"]


def check_kill_and_resume(tmp_path: Path, reference, mech: str, sig: int) -> None:
    """Killed mid-run and resumed: same steps, epsilon and model as an uninterrupted run."""
    run_dir = tmp_path / "killed"
    killed_at = kill_mid_run(run_dir, RESUME_RUNS[mech], sig)
    assert 0 < killed_at < reference.steps
    config_before = (run_dir / "config.yaml").read_text()
    run_cli(f"resume={run_dir}", check=True)  # the run's own config, no overrides needed
    assert (run_dir / "config.yaml").read_text() == config_before
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["steps"] == reference.steps
    assert final["epsilon"] == pytest.approx(reference.epsilon, rel=1e-9)
    assert final["test_accuracy"] == pytest.approx(reference.test_accuracy, abs=1e-9)
    state = torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"]
    assert sum(n for _, _, n in state["ledger"]["history"]) == reference.steps  # counted once
    lines = [m["step"] for m in read_metrics(run_dir) if "z_eff" in m]
    assert lines == list(range(1, reference.steps + 1))  # each step logged once after resume
    assert f"resumed {run_dir} at step {killed_at}" in (run_dir / "train.log").read_text()
