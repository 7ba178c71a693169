"""Any per-example loss: ``loss_fn(outputs, targets) -> (B,)`` in every grads backend.

The reference is a plain Python loop over single examples (``torch.autograd.grad`` of
``loss_fn(model(x_i[None]), y_i[None])``): each backend's per-example rows and clipped
sum must equal it, for mean squared error on a small regression network with the layer
kinds the ghost rules cover (Conv2d, GroupNorm, Linear).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpsub.grads import GradEngine
from dpsub.grads.clip import clipped_sum
from dpsub.grads.loss import correct, cross_entropy, mse


def regressor() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 6 * 6, 8), nn.Tanh(), nn.Linear(8, 2),
    )  # fmt: skip


def data(b: int = 6):
    g = torch.Generator().manual_seed(1)
    return torch.randn(b, 1, 6, 6, generator=g), torch.randn(b, 2, generator=g)


def loop_rows(model: nn.Module, x, y, loss_fn) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        loss = loss_fn(model(x[i : i + 1]), y[i : i + 1]).sum()
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return torch.stack(rows)


@pytest.mark.parametrize("backend", ["vmap", "opacus", "ghost"])
def test_mse_rows_and_clipped_sum_equal_a_single_example_loop(backend):
    model = regressor()
    x, y = data()
    ref = loop_rows(model, x, y, mse)
    engine = GradEngine(model, microbatch=4, backend=backend, loss_fn=mse)
    rows = torch.cat([c.grads for c in engine.per_example(x, y)])
    torch.testing.assert_close(rows, ref, rtol=1e-4, atol=1e-6)
    clip = float(ref.norm(dim=1).median())
    got = engine.clipped_sum(x, y, clip)
    torch.testing.assert_close(got.sum.value, clipped_sum(ref, clip)[0].value, rtol=1e-4, atol=1e-6)
    assert got.sum.sensitivity == clip
    assert int(got.stats.correct) == 0  # a regression has no accuracy


def test_mean_gradient_uses_the_loss():
    model = regressor()
    x, y = data()
    mean, _ = GradEngine(model, loss_fn=mse).mean_gradient(x, y)
    torch.testing.assert_close(mean, loop_rows(model, x, y, mse).mean(0), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("backend", ["vmap", "opacus", "ghost"])
def test_a_batch_reduced_loss_is_refused(backend):
    model = regressor()
    x, y = data()
    engine = GradEngine(model, backend=backend, loss_fn=lambda o, t: mse(o, t).mean())
    with pytest.raises(ValueError, match="one loss per example"):
        engine.clipped_sum(x, y, 1.0)


def test_correct_is_classification_only():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    assert correct(logits, torch.tensor([0, 0])).tolist() == [True, False]
    assert correct(logits, torch.zeros(2, 2)).tolist() == [False, False]
    assert cross_entropy(logits, torch.tensor([0, 1])).shape == (2,)
