"""Under torchrun only rank 0's shard holds the audit's canary (one canary, not one per rank).

The slow two-process test (tests/e2e/test_e2e_distributed.py) checks the audited mu; this
one checks the rule in one process by giving the run another rank's place.
"""

from __future__ import annotations

import dataclasses

import torch

from dpsub.audit.canary import CanaryEngine
from dpsub.audit.release import Replayer, zero_release
from dpsub.training.build import build_run

from conftest import compose_cfg
from helpers.audit import TINY


def _canary_shift(run, rank: int) -> float:
    """How far the canary moves the noise-free release of the run's one step on ``rank``."""
    run.dist = dataclasses.replace(run.dist, rank=rank)  # world 1: no collectives
    engine = CanaryEngine(run.mechanism.engine, lambda dim: torch.full((dim,), 10.0))
    replay = Replayer(run, run.data.train_x, run.data.train_y, engine)
    with_canary, _ = zero_release(replay, True)
    without, _ = zero_release(replay, False)
    assert engine.applied == 1  # the canary reached the private batch on every rank
    return float((with_canary - without).norm())


def test_only_rank_0_adds_the_canary_to_its_shard() -> None:
    run = build_run(compose_cfg(*TINY, "privacy.noise_multiplier=1.0", "logger=disabled"))
    assert _canary_shift(run, 0) > 0
    assert _canary_shift(run, 1) == 0.0
