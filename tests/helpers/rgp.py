"""RGP helpers shared by the unit and e2e suites."""

from __future__ import annotations

import pytest
import torch

from dpsub.grads import GradEngine
from dpsub.subspace.lowrank import random_carriers
from dpsub.subspace.reparam import LowRankReparam

INF = float("inf")


def rand_carriers(reparam, rank, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: random_carriers(*W.shape, rank, g) for n, W in reparam.matrices().items()}


def check_ghost_carriers(net, x, y, update: str) -> None:
    """Ghost clipping of the carriers equals vmap's (a huge and a non-finite example added)."""
    x[0] *= 1e3
    x[1, 0, 0, 0] = float("nan")
    reparam = LowRankReparam(net, train_right=update == "full")
    vmap, ghost = GradEngine(net, microbatch=3), GradEngine(net, microbatch=3, backend="ghost")
    for seed, clip in ((0, 0.05), (1, INF), (2, 1.0)):  # carriers refitted between calls
        carriers = rand_carriers(reparam, 3, seed)
        a = vmap.clipped_sum(x, y, clip, target=reparam.target(carriers))
        b = ghost.clipped_sum(x, y, clip, target=reparam.ghost_target(carriers))
        assert b.sum.sensitivity == clip and a.stats.clip == b.stats.clip
        assert b.stats.clip.nonfinite == 1
        torch.testing.assert_close(b.sum.value, a.sum.value, atol=1e-6, rtol=1e-5)
        assert float(b.stats.loss_sum) == pytest.approx(
            float(a.stats.loss_sum), rel=1e-5, nan_ok=True
        )
