"""``train.amp=bf16``: autocast only where gradients are computed; clipping and noise in float32."""

from __future__ import annotations

import pytest
import torch

from dpsub.config import validate
from dpsub.errors import ConfigError
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg


def amp_run(*extra: str):
    return build_run(compose_cfg(*SYNTH, "train.amp=bf16", "device=cpu", *extra))


def test_bf16_on_cpu_keeps_norms_and_sums_float32():
    run = amp_run()
    assert run.engine.amp is torch.bfloat16
    x, y = run.data.train_x[:32], run.data.train_y[:32]
    rows = torch.cat([c.grads for c in run.engine.per_example(x, y)])
    assert rows.dtype == torch.float32
    clip = 0.05
    s = run.engine.clipped_sum(x, y, clip)
    assert s.sum.value.dtype == torch.float32 and s.sum.sensitivity == clip
    # the release is the float32 sum of the float32 rows clipped in float32
    factors = (clip / (rows.norm(dim=1) + 1e-12)).clamp(max=1.0)
    torch.testing.assert_close(s.sum.value, factors @ rows, rtol=1e-5, atol=1e-7)
    run.engine.amp = None  # the same rows without autocast: close, not equal (bf16 matmuls)
    plain = torch.cat([c.grads for c in run.engine.per_example(x, y)])
    assert not torch.equal(rows, plain)
    torch.testing.assert_close(rows.norm(dim=1), plain.norm(dim=1), rtol=0.05, atol=1e-4)


def test_bf16_run_takes_private_steps():
    run = amp_run("mechanism=gep", "aux=gaussian", "aux.num_samples=16", "mechanism.num_bases=4")
    for _ in range(2):
        out = train_step(run)
        assert out.z_records >= out.z_charged * (1 - 1e-9)
        assert out.result.grad.dtype == torch.float32
    assert torch.isfinite(run.engine.flat_params()).all()


@pytest.mark.parametrize("backend", ["ghost", "opacus"])
def test_bf16_refused_where_norms_would_come_from_bf16_activations(backend):
    cfg = compose_cfg(*SYNTH, "train.amp=bf16", f"grads.backend={backend}")
    with pytest.raises(ConfigError, match=r"^train.amp: bf16 needs grads.backend=vmap"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"^train.amp"):
        validate(compose_cfg(*SYNTH, "train.amp=fp16"))
