"""De et al. 2022's presets (conf/experiment/de2022_*.yaml) compose and train a step, shrunk."""

from __future__ import annotations

import pytest

from dpsub.training.build import build_run, train_step

from conftest import compose_cfg

SHRUNK = (
    "dataset=synthetic", "dataset.synthetic.channels=3", "dataset.synthetic.size=32",
    "dataset.synthetic.n_train=64", "dataset.synthetic.n_test=16", "train.batch_size=8",
    "train.augmult=2", "model.width=1", "grads.microbatch=8", "device=cpu",
)  # fmt: skip


@pytest.mark.parametrize("preset", ["de2022_wrn16_4_eps8", "de2022_wrn16_4_eps1"])
def test_a_de2022_preset_trains_a_step_with_views_ema_and_ws(preset):
    run = build_run(compose_cfg(f"experiment={preset}", *SHRUNK))
    s = run.settings
    assert (s.train.ema, s.model["ws"], s.model["depth"]) == (0.999, True, 16)
    assert run.engine.augmult.k == 2 and run.engine.augmult.pad == 4
    assert train_step(run).result is not None and run.ema.updates == 1
