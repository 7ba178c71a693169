"""PATE's student: supervised or semi-supervised (FixMatch), from the public pool only."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpsub.cli.pate import _student
from dpsub.config import compose
from dpsub.errors import ConfigError
from dpsub.pate.accounting import PateLedger
from dpsub.pate.options import check_options
from dpsub.pate.pool import make_pools
from dpsub.pate.run import split
from dpsub.pate.student import StudentOptions, augment, student_data, train_student
from dpsub.training.build import load_data

SEMI = ["pate.public_size=120", "pate.student.semi_supervised=true", "pate.student.epochs=2",
        "pate.student.batch_size=16", "pate.student.confidence=0.3", "logger=disabled",
        "device=cpu"]  # fmt: skip


def _pools(cfg, pate):
    return make_pools(load_data(cfg), pate.public_size, None, False, cfg.seed)


def _answers(pools, cfg) -> dict:
    labels = [[i, int(pools.public_y[i])] for i in range(0, 120, 3)]  # 40 answered
    ledger = PateLedger(cfg.privacy.delta, cfg.privacy.epsilon)
    return {"labels": labels, "ledger": ledger, "stopped_by_budget": False}


def test_student_data_is_the_public_pool_split_by_the_answers():
    pools = type("P", (), {"public_x": torch.arange(10.0).view(10, 1, 1, 1)})()
    labels = torch.tensor([[7, 1], [2, 0]])
    x, y, unlabeled = student_data(pools, labels)
    assert x.flatten().tolist() == [7.0, 2.0] and y.tolist() == [1, 0]
    assert unlabeled.flatten().tolist() == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0, 8.0, 9.0]


def test_the_student_never_reads_the_private_training_set():
    """Post-processing: with the private training set poisoned (NaN images, bad labels)
    after the votes, the semi-supervised student is the same (same summary)."""
    cfg, pate = split(compose(SEMI, config_name="dpsub_pate"))
    pools = _pools(cfg, pate)
    out = _answers(pools, cfg)
    clean = _student(cfg, pate, pools, "cpu", out)
    poisoned = dataclasses.replace(
        pools,
        train_x=torch.full_like(pools.train_x, float("nan")),
        train_y=torch.full_like(pools.train_y, 10**6),
    )
    assert _student(cfg, pate, poisoned, "cpu", out) == clean
    assert clean["covered_by_epsilon"] is True


def test_semi_supervised_uses_the_unanswered_images():
    """The FixMatch term changes the student (and the supervised one ignores them)."""
    torch.manual_seed(0)
    x, y, unlabeled = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,)), torch.randn(64, 1, 8, 8)

    def fit(opts, u):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
        return train_student(model, x, y, opts, 0, u)[1].weight.detach()

    sup = StudentOptions(epochs=2, batch_size=8)
    semi = dataclasses.replace(sup, semi_supervised=True, confidence=0.1)
    assert torch.equal(fit(sup, unlabeled), fit(sup, None))
    assert not torch.equal(fit(semi, unlabeled), fit(semi, unlabeled * 0 + 1))


def test_augment_keeps_shape_background_and_differs():
    gen = torch.Generator().manual_seed(0)
    x = torch.full((4, 1, 28, 28), -0.42)
    x[:, :, 10:18, 10:18] = 2.8
    for strong in (False, True):
        out = augment(x, gen, strong)
        assert out.shape == x.shape and torch.isfinite(out).all()
        assert out.min() >= -0.42 - 1e-5 and out.max() <= 2.8 + 1e-5
        assert not torch.allclose(out, x)


@pytest.mark.parametrize(
    "key,value",
    [("semi_supervised", 1), ("confidence", 1.5), ("confidence", 0), ("unlabeled_ratio", 1.5),
     ("unlabeled_weight", -1)],
)  # fmt: skip
def test_bad_student_options_name_the_key(key, value):
    _, pate = split(compose(SEMI, config_name="dpsub_pate"))
    pate.student[key] = value
    with pytest.raises(ConfigError, match=f"pate.student.{key}"):
        check_options(pate)
