"""Weight-standardized convolutions (model.ws=true): the forward against a reference, and
per-example gradients equal across the grads backends."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dpsub.grads import GradEngine
from dpsub.models import build_model
from dpsub.models.resnet import WSConv2d


def test_ws_conv_forward_matches_a_reference():
    torch.manual_seed(0)
    conv = WSConv2d(3, 5, 3, padding=1, bias=False)
    with torch.no_grad():
        conv.gain.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 6, 6)
    w = conv.weight.detach().double()
    flat = w.reshape(5, -1)  # textbook: (w - mean) / (std * sqrt(fan_in)) per output channel
    std = flat.std(dim=1, unbiased=False, keepdim=True)
    w_hat = ((flat - flat.mean(1, keepdim=True)) / (std * flat.shape[1] ** 0.5)).view_as(w)
    w_hat = w_hat * conv.gain.detach().double().view(-1, 1, 1, 1)
    ref = F.conv2d(x.double(), w_hat, padding=1)
    torch.testing.assert_close(conv(x).double(), ref, rtol=1e-5, atol=1e-5)
    flat_std = (w_hat.reshape(5, -1) / conv.gain.detach().double()[:, None]).std(1, unbiased=False)
    torch.testing.assert_close(flat_std * 27**0.5, torch.ones(5, dtype=torch.float64))


@pytest.mark.parametrize(("name", "kwargs"), [("resnet20", {}), ("wrn", {"depth": 10, "width": 1})])
def test_ws_models_give_the_same_per_example_gradients_on_every_backend(name, kwargs):
    torch.manual_seed(0)
    model = build_model(name, (3, 8, 8), 4, ws=True, **kwargs)
    assert any(isinstance(m, WSConv2d) for m in model.modules())
    assert not any(type(m) is torch.nn.Conv2d for m in model.modules())
    x, y = torch.randn(3, 3, 8, 8), torch.randint(0, 4, (3,))
    rows = {}
    for backend in ("vmap", "opacus", "ghost"):
        engine = GradEngine(copy.deepcopy(model), microbatch=3, backend=backend)
        rows[backend] = torch.cat([c.grads for c in engine.per_example(x, y)])
        total = engine.clipped_sum(x, y, 0.1).sum.value
        torch.testing.assert_close(
            total,
            (rows["vmap"] * (0.1 / rows["vmap"].norm(dim=1, keepdim=True)).clamp(max=1)).sum(0),
            rtol=1e-4,
            atol=1e-6,
        )
    for backend in ("opacus", "ghost"):
        torch.testing.assert_close(rows[backend], rows["vmap"], rtol=1e-4, atol=1e-6)
