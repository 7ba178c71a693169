"""The membership-inference attack's positive control (slow, moved from
tests/integration/test_mia.py for issue 36.9: 60 training steps): a model that learned its
training set by heart is exposed."""

from __future__ import annotations

import torch

from dpsub.eval.mia import evaluate_run
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg


def synth_run(*extra):
    return build_run(compose_cfg(*SYNTH, "mechanism=nonprivate", *extra))


def test_a_model_that_memorized_a_small_training_set_is_exposed():
    """100 examples whose pixel noise (std 20) drowns the class patterns: learned by heart."""
    run = synth_run(
        "dataset.synthetic.n_train=100", "dataset.synthetic.n_test=1000",
        "+dataset.synthetic.noise=20.0", "train.batch_size=100", "optim=adam", "optim.lr=0.003",
    )  # fmt: skip
    everyone = torch.arange(100)
    for _ in range(60):
        train_step(run, idx=everyone)
    r = evaluate_run(run)
    assert r["private/mia/examples"] == 100  # capped by the 100 members
    assert r["private/mia/ci_low"] > 0.75 and r["private/mia/success"] > 0.9
