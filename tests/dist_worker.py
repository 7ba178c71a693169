"""Run under torchrun by tests/integration/test_distributed.py: a few steps of each run, rank 0
saves what each released (a list, one entry per run; runs separated by ``::``, so one torchrun
start serves several configurations).

python -m torch.distributed.run --nproc_per_node 2 tests/dist_worker.py OUT OVERRIDE... [:: OVERRIDE...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpsub.training.build import build_run, train_step  # noqa: E402
from dpsub.training.distributed import init_distributed  # noqa: E402

from conftest import compose_cfg  # noqa: E402

STEPS = 3
SEP = " :: "  # between the overrides of two runs


class ZeroNoise:
    """A noise source drawing zeros (the noise-free release of the same batches)."""

    secure = False

    def normal(self, shape, device):
        return torch.zeros(tuple(shape), device=device)


def released(overrides: list[str], dist=None, noise_free: bool = False) -> dict:
    """The released gradients of STEPS steps and the ledger's epsilon."""
    cfg = compose_cfg(*overrides)
    run = build_run(cfg, dist=dist) if dist is not None else build_run(cfg)
    if noise_free:
        run.privatizer.source = ZeroNoise()
    grads = [train_step(run).result.grad.detach().cpu().clone() for _ in range(STEPS)]
    return {
        "grads": grads,
        "epsilon": run.ledger.epsilon(),
        "z": run.z,
        "rank_world": (run.dist.rank, run.dist.world),
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    out, words = Path(sys.argv[1]), " ".join(sys.argv[2:])
    dist = init_distributed("cpu")
    results = [released(run.split(), dist) for run in words.split(SEP)]
    if dist.main:
        torch.save(results, out)
    dist.shutdown()
