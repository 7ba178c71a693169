"""torch.distributed (gloo on the CPU): the same releases and the same epsilon as one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_worker import released

from conftest import REPO, SYNTH, cli_command, needs_shared, run_cli

WORKER = Path(__file__).with_name("dist_worker.py")
DPSGD = (*SYNTH, "train.max_steps=5", "privacy.noise_multiplier=2.0", "privacy.epsilon=100")
GEP = (*DPSGD, "mechanism=gep", "aux=gaussian", "aux.num_samples=30", "mechanism.num_bases=8")


def torchrun(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    _, env = cli_command()
    env = {**env, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("overrides", [DPSGD, GEP], ids=["dpsgd", "gep"])
def test_two_ranks_release_what_one_process_releases(tmp_path, overrides):
    out = tmp_path / "released.pt"
    proc = torchrun(str(WORKER), str(out), *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(out, weights_only=False)
    one = released(list(overrides))
    assert two["rank_world"] == (0, 2) and one["rank_world"] == (0, 1)
    for g2, g1 in zip(two["grads"], one["grads"], strict=True):
        torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-6)
    assert two["epsilon"] == one["epsilon"] and two["z"] == one["z"]


def test_two_ranks_add_the_noise_once(tmp_path):
    """Release minus the noise-free release: std z C / B (one draw), not sqrt(2) z C / B."""
    noisy = tmp_path / "noisy.pt"
    assert torchrun(str(WORKER), str(noisy), *DPSGD).returncode == 0
    clean = released(list(DPSGD), noise_free=True)  # the same batches, no noise
    noise = torch.cat(
        [a - b for a, b in zip(torch.load(noisy)["grads"], clean["grads"], strict=True)]
    )
    expected = 2.0 * 1.0 / 64  # z * C / B
    assert noise.std().item() == pytest.approx(expected, rel=0.03)


@needs_shared
@pytest.mark.slow
def test_torchrun_on_real_mnist_matches_one_process(tmp_path):
    common = ("dataset=mnist", "train.batch_size=512", "train.max_steps=40", "optim.lr=2.0",
              "optim.momentum=0.0", "train.eval_every=0", "logger.mode=disabled", "train.progress=false")  # fmt: skip
    proc = torchrun(
        "-m",
        "dpsub.train",
        *common,
        f"out_dir={tmp_path / 'two'}",
        f"data.root={os.environ.get('DPSUB_DATA', '')}"
        if os.environ.get("DPSUB_DATA")
        else "seed=0",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_cli(*common, run_dir=tmp_path / "one")
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert two["epsilon"] == one["epsilon"] and two["steps"] == one["steps"] == 40
    assert two["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=0.01)
    assert two["test_accuracy"] > 0.7


@pytest.mark.slow
def test_resume_with_a_different_number_of_ranks(tmp_path):
    """Started in one process, killed, resumed under torchrun with two: the same run."""
    from test_train_e2e import DEMO, kill_mid_run

    overrides = (
        *DEMO,
        "train.epochs=8",
        "train.checkpoint_every=5",
        "train.eval_every=0",
        "train.log_every=1",
    )
    reference_dir = tmp_path / "ref"
    run_cli(*overrides, run_dir=reference_dir)
    run_dir = tmp_path / "killed"
    kill_mid_run(run_dir, overrides, signal.SIGTERM)
    proc = torchrun(
        "-m", "dpsub.train", f"resume={run_dir}", "logger.mode=disabled", "train.progress=false"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads((reference_dir / "summary.json").read_text())
    got = json.loads((run_dir / "summary.json").read_text())
    assert got["steps"] == ref["steps"] and got["epsilon"] == ref["epsilon"]
    assert got["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=1e-6)


def worker_pid(local_rank: int, parent: int) -> int | None:
    """The pid of torchrun's worker with LOCAL_RANK=local_rank (read from /proc)."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            stat = (p / "stat").read_text().split()
        except OSError:
            continue
        if f"LOCAL_RANK={local_rank}".encode() in env and int(stat[3]) == parent:
            return int(p.name)
    return None


@pytest.mark.slow
def test_a_failed_rank_stops_the_job_instead_of_hanging(tmp_path):
    args, env = cli_command(
        *SYNTH, "train.epochs=200", "train.log_every=1", run_dir=tmp_path / "run"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *args[1:]]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.monotonic() + 600
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    pid = worker_pid(1, proc.pid)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)  # ends (does not hang) ...
    assert proc.returncode != 0  # ... with a failure
    assert "local_rank: 1" in err.decode() or "exitcode" in err.decode()


def test_a_slurm_task_finds_its_rank(monkeypatch):
    """hydra/launcher=slurm with several tasks: Slurm's (submitit's) variables become ranks.

    ``_slurm_env`` exports RANK, WORLD_SIZE, MASTER_ADDR ... into ``os.environ``; the whole
    environment is restored afterwards, or every later subprocess would wait for peers.
    """
    from dpsub.training.distributed import _slurm_env

    monkeypatch.setattr(os, "environ", os.environ.copy())  # restored after the test
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(k, None)
    slurm = {
        "SUBMITIT_EXECUTOR": "slurm", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_STEP_NODELIST": "node1",
        "SLURM_NNODES": "1", "SLURM_JOB_ID": "42", "SLURM_NODEID": "0",
        "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "1",
    }  # fmt: skip
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    _slurm_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "1",
        "2",
        "1",
    )
    assert os.environ["MASTER_ADDR"] == "node1" and os.environ["MASTER_PORT"]
