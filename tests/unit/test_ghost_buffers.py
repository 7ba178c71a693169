"""Ghost clipping reuses its per-layer row buffers from call to call: results unchanged."""

from __future__ import annotations

import torch

from dpsub.grads.ghost import GhostClipper
from dpsub.models import build_model


def _batch(b: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g)


def test_reused_buffers_give_a_fresh_clippers_result():
    torch.manual_seed(0)
    model = build_model("resnet20", (3, 32, 32), 10)
    reused = GhostClipper(model, microbatch=6)
    for b, seed in [(10, 1), (7, 2), (12, 3)]:  # bigger, smaller, bigger: buffers resized
        x, y = _batch(b, seed)
        got = reused.clipped_sum(x, y, 1.0)
        want = GhostClipper(model, microbatch=6).clipped_sum(x, y, 1.0)
        torch.testing.assert_close(got.grad_sum, want.grad_sum, rtol=0, atol=0)
        torch.testing.assert_close(got.norms, want.norms, rtol=0, atol=0)
    assert reused._buffers  # the convolutions' rows were kept in reused buffers
    assert "materialize" in reused.choices.values()


def test_rows_never_alias_between_calls():
    torch.manual_seed(0)
    model = build_model("resnet20", (3, 32, 32), 10)
    clipper = GhostClipper(model, microbatch=8)
    x1, y1 = _batch(8, 4)
    first = clipper.clipped_sum(x1, y1, 1.0).grad_sum.clone()
    again = clipper.clipped_sum(x1, y1, 1.0).grad_sum
    torch.testing.assert_close(first, again, rtol=0, atol=0)
