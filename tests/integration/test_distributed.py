"""torch.distributed (gloo on the CPU): the same releases and the same epsilon as one process."""

from __future__ import annotations

import os

import pytest
import torch

from dist_worker import released
from helpers.dist import DPSGD, GEP, WORKER, torchrun

#: augmult: every rank draws the whole batch's views from the one seeded stream (a rank's
#: own draws left the streams apart, and a resume from rank 0's checkpoint re-augmented)
RUNS = {"dpsgd": DPSGD, "gep": GEP, "augmult": (*DPSGD, "model=cifar_cnn", "train.augmult=2")}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """What rank 0 released in each run of RUNS: one torchrun start (two processes) for all."""
    out = tmp_path_factory.mktemp("dist") / "released.pt"
    words = [w for run in RUNS.values() for w in ("::", *run)][1:]
    proc = torchrun(str(WORKER), str(out), *words)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(RUNS, torch.load(out, weights_only=False), strict=True))


@pytest.mark.parametrize("name", list(RUNS))
def test_two_ranks_release_what_one_process_releases(two_ranks, name):
    two, one = two_ranks[name], released(list(RUNS[name]))
    assert two["rank_world"] == (0, 2) and one["rank_world"] == (0, 1)
    for g2, g1 in zip(two["grads"], one["grads"], strict=True):
        torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-6)
    assert two["epsilon"] == one["epsilon"] and two["z"] == one["z"]


def test_two_ranks_add_the_noise_once(two_ranks):
    """Release minus the noise-free release: std z C / B (one draw), not sqrt(2) z C / B."""
    clean = released(list(DPSGD), noise_free=True)  # the same batches, no noise
    noise = torch.cat(
        [a - b for a, b in zip(two_ranks["dpsgd"]["grads"], clean["grads"], strict=True)]
    )
    expected = 2.0 * 1.0 / 64  # z * C / B
    assert noise.std().item() == pytest.approx(expected, rel=0.03)


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
