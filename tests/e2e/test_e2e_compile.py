"""torch.compile of the per-example function (slow: compiling takes a minute on the CPU)."""

from __future__ import annotations

import torch

from dpsub.grads import GradEngine

from helpers.nets import ConvGN


def test_compiled_clipped_sum_equals_eager():
    """torch.compile of the vmap per-example function (micro-batches of 4, 4 and 2)."""
    torch.manual_seed(0)
    model, x, y = ConvGN(), torch.randn(10, 1, 8, 8), torch.randint(0, 3, (10,))
    want = GradEngine(model, microbatch=4).clipped_sum(x, y, 0.1)
    got = GradEngine(model, microbatch=4, compile=True).clipped_sum(x, y, 0.1)
    torch.testing.assert_close(got.sum.value, want.sum.value, rtol=1e-4, atol=1e-6)
    assert got.stats.clip == want.stats.clip
