"""torch.distributed (gloo on the CPU): the same releases and the same epsilon as one process."""

from __future__ import annotations

import os

import pytest
import torch

from dist_worker import released
from helpers.dist import DPSGD, GEP, WORKER, torchrun


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
