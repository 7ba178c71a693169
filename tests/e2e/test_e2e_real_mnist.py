"""Training on real MNIST (slow, moved from tests/integration/test_train_e2e.py for issue 36.9):
DP-SGD learns at epsilon 2, GEP with natural anchors logs its private diagnostics."""

from __future__ import annotations

from dpsub.tracking import read_metrics
from dpsub.training.loop import train

from conftest import compose_cfg as cfg_for
from conftest import needs_shared


@needs_shared
def test_dpsgd_on_real_mnist(tmp_path):
    res = train(
        cfg_for(
            "dataset=mnist",
            "train.batch_size=512",
            "train.max_steps=60",
            "optim.lr=2.0",
            "optim.momentum=0.0",
            "privacy.epsilon=2.0",
            "train.eval_every=0",
        ),
        tmp_path,
    )
    assert res.steps == 60
    assert res.epsilon <= 2.0 and res.epsilon > 1.9
    assert res.test_accuracy > 0.75


@needs_shared
def test_gep_on_real_mnist_with_natural_aux_and_private_diagnostics(tmp_path):
    res = train(
        cfg_for(
            "dataset=mnist",
            "mechanism=gep",
            "aux=natural",
            "aux.num_samples=300",
            "mechanism.num_bases=100",
            "mechanism.diagnostics_every=5",
            "privacy.private_diagnostics=true",
            "train.batch_size=256",
            "train.max_steps=12",
            "optim.lr=0.5",
            "train.log_every=1",
            "train.eval_every=0",
        ),
        tmp_path,
    )
    assert res.steps == 12 and res.epsilon <= 2.0
    metrics = read_metrics(tmp_path)
    errs = [
        m["private/mech/projection_error"] for m in metrics if "private/mech/projection_error" in m
    ]
    assert errs and all(0 < e < 1.5 for e in errs)
    assert any("private/mech/stable_rank_residual" in m for m in metrics)
