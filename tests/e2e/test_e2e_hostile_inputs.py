"""Hostile examples on the other models (a CNN, frozen ScatterNet features) and under
bf16 autocast: every mechanism x backend (slow: ~60 configurations)."""

from __future__ import annotations

import pytest

from helpers.hostile import MECHANISMS, MODELS, build, check_hostile


@pytest.mark.parametrize("backend", ["vmap", "opacus", "ghost"])
@pytest.mark.parametrize("model", [m for m in MODELS if m != "linear"])
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_a_hostile_example_moves_each_release_by_at_most_its_sensitivity(mechanism, model, backend):
    run = build(
        f"mechanism={mechanism}", *MECHANISMS[mechanism], *MODELS[model], f"grads.backend={backend}"
    )
    check_hostile(run)


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_hostile_examples_under_bf16_autocast(mechanism):
    run = build(f"mechanism={mechanism}", *MECHANISMS[mechanism], *MODELS["cnn"], "train.amp=bf16")
    check_hostile(run)
