"""The run builder and the one training step: what is charged, and what is refused."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from dpsub.errors import ConfigError, PrivacyError
from dpsub.mechanisms import MECHANISMS, Phase, StepResult, register
from dpsub.mechanisms.dpsgd import DPSGD
from dpsub.mechanisms.options import SPECS, declare, opt
from dpsub.privacy import NoiseBlock, epsilon_for
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg


@pytest.fixture
def extra_mechanisms():
    """Test-only mechanisms, registered for one test."""
    added = []

    def add(name, cls, **spec):
        @declare(name, **spec)
        @dataclass
        class Options:
            clip: float = opt(1.0, gt=0)

        register(name)(cls)
        added.append(name)

    yield add
    for name in added:
        SPECS.pop(name, None)
        MECHANISMS.pop(name, None)


class HalfNoise(DPSGD):
    """States DP-SGD's cost but draws half the noise: the trainer must stop it."""

    def step(self, x, y, ctx):
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        noisy = ctx.noise.gaussian(clipped.sum, 0.5 * ctx.z * self.opts.clip)
        return StepResult(noisy / ctx.expected_batch_size, clipped.stats)


class NoNoise(DPSGD):
    """Releases the clipped sum without going through the privatizer."""

    def step(self, x, y, ctx):
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        return StepResult(clipped.sum.value / ctx.expected_batch_size, clipped.stats)


class Squeezed(DPSGD):
    """Noise z C diag(1, ..., 1, 0.3) on the first weight: its least noisy direction is 0.3 z C."""

    accounting = "measured"

    def step(self, x, y, ctx):
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        name = self.engine.layout.matrix_names()[-1]
        rows, cols = self.engine.layout.matrix_shape(name)
        left = torch.eye(rows)
        left[-1, -1] = 0.3
        start = self.engine.layout.offsets[self.engine.layout.names.index(name)]
        noisy = ctx.noise.shaped(
            clipped.sum, ctx.z * self.opts.clip, [NoiseBlock(start, rows, cols, left)]
        )
        return StepResult(noisy / ctx.expected_batch_size, clipped.stats)


def params_of(run):
    return torch.cat([p.detach().reshape(-1).clone() for p in run.model.parameters()])


def test_a_mechanism_drawing_less_noise_than_planned_is_stopped(extra_mechanisms):
    extra_mechanisms("halfnoise", HalfNoise)
    run = build_run(compose_cfg(*SYNTH, "mechanism=dpsgd", "mechanism.name=halfnoise"))
    before = params_of(run)
    with pytest.raises(PrivacyError, match="less than"):
        train_step(run)
    assert torch.equal(params_of(run), before)  # nothing reached the optimizer
    assert run.ledger.steps == 0 and run.step == 0


def test_a_release_without_noise_is_stopped(extra_mechanisms):
    extra_mechanisms("nonoise", NoNoise)
    run = build_run(compose_cfg(*SYNTH, "mechanism=dpsgd", "mechanism.name=nonoise"))
    before = params_of(run)
    with pytest.raises(PrivacyError, match="without drawing noise"):
        train_step(run)
    assert torch.equal(params_of(run), before)


def test_shaped_noise_is_charged_for_its_least_noisy_direction(extra_mechanisms):
    extra_mechanisms("squeezed", Squeezed)
    run = build_run(
        compose_cfg(
            *SYNTH, "mechanism=dpsgd", "mechanism.name=squeezed",
            "privacy.noise_multiplier=2.0", "privacy.epsilon=1000",
        )
    )  # fmt: skip
    for _ in range(3):
        out = train_step(run)
        assert out.z_records == pytest.approx(0.3 * run.z, rel=1e-6)
        assert out.z_charged == out.z_records
    assert run.ledger.history == [(pytest.approx(0.3 * run.z, rel=1e-6), run.q, 3)]
    assert run.nominal.history == [(run.z, run.q, 3)]
    honest, nominal = run.ledger.epsilon(), run.nominal.epsilon()
    assert honest == pytest.approx(epsilon_for([(0.3 * run.z, run.q, 3)], 1e-5), rel=1e-6)
    assert honest > nominal


@pytest.mark.parametrize("mech", ["dpsgd", "gep", "bgep"])
def test_records_reproduce_the_planned_epsilon_exactly(mech):
    extra = (
        ("aux=gaussian", "aux.num_samples=32", "mechanism.num_bases=8") if mech != "dpsgd" else ()
    )
    run = build_run(compose_cfg(*SYNTH, f"mechanism={mech}", *extra, "train.max_steps=4"))
    for _ in range(4):
        out = train_step(run)
        assert out.z_records == pytest.approx(run.z, rel=1e-12)
        assert out.z_charged == run.z
    assert run.ledger.history == [(run.z, run.q, 4)]
    assert run.ledger.epsilon() == epsilon_for([(run.z, run.q, 4)], 1e-5)


def test_public_examples_are_removed_from_the_private_set_and_from_N():
    run = build_run(compose_cfg(*SYNTH, "aux=public_train", "aux.num_samples=40"))
    m = len(run.aux.x)  # the hash pick: about 40
    assert 20 < m < 60 and len(run.data.train_y) == 400 - m
    assert run.q == pytest.approx(64 / (400 - m))  # q = B / N after the removal
    assert run.total_steps == round(1 / (64 / (400 - m)))
    # no public example is in the private set
    priv = {tuple(r.tolist()) for r in run.data.train_x.flatten(1)[:, :8]}
    assert not any(tuple(r.tolist()) in priv for r in run.aux.x.flatten(1)[:, :8])


def test_a_phased_mechanism_gets_its_multiplier_per_step(extra_mechanisms):
    class WarmUp(DPSGD):
        def phases(self, total_steps):
            return [Phase(2, scale=2.0), Phase(total_steps - 2)]

    extra_mechanisms("warmup", WarmUp)
    run = build_run(
        compose_cfg(*SYNTH, "mechanism=dpsgd", "mechanism.name=warmup", "train.max_steps=5")
    )
    charged = [train_step(run).z_charged for _ in range(5)]
    assert charged == [2 * run.z, 2 * run.z, run.z, run.z, run.z]
    assert run.ledger.history == [(2 * run.z, run.q, 2), (run.z, run.q, 3)]
    assert run.ledger.epsilon() <= 2.0 + 1e-9


def test_a_non_finite_example_cannot_poison_training():
    run = build_run(compose_cfg(*SYNTH, "train.epochs=3", "train.batch_size=400"))
    run.data.train_x[5] = float("nan")
    for _ in range(3):
        out = train_step(run, idx=torch.arange(400))
        assert out.result.stats.clip.nonfinite == 1
    assert torch.isfinite(params_of(run)).all()


def test_bad_model_options_are_config_errors():
    with pytest.raises(ConfigError, match="model"):
        build_run(compose_cfg(*SYNTH, "+model.depthh=3"))


def test_nonprivate_charges_nothing():
    run = build_run(compose_cfg(*SYNTH, "mechanism=nonprivate"))
    out = train_step(run)
    assert math.isinf(out.z_charged) and run.ledger is None


def test_ghost_backend_trains_exactly_like_vmap():
    """Same seed, same batches, same noise: the ghost backend's run equals the vmap run."""
    runs = [
        build_run(compose_cfg(*SYNTH, f"grads.backend={b}", "train.max_steps=3"))
        for b in ("vmap", "ghost")
    ]
    for run in runs:
        for _ in range(3):
            train_step(run)
    torch.testing.assert_close(params_of(runs[1]), params_of(runs[0]), rtol=1e-4, atol=1e-6)
    assert runs[0].ledger.history == runs[1].ledger.history


def test_a_validation_split_replaces_the_test_set_and_leaves_the_private_set():
    run = build_run(compose_cfg(*SYNTH, "dataset.validation_size=50"))
    assert run.data.eval_split == "validation"
    assert len(run.data.test_y) == 50 and len(run.data.train_y) == 350
    assert run.q == pytest.approx(64 / 350)  # N without the held-out examples
    assert torch.bincount(run.data.test_y, minlength=10).tolist() == [5] * 10  # balanced
    train = {tuple(r.tolist()) for r in run.data.train_x.flatten(1)[:, :6]}
    assert not any(tuple(r.tolist()) in train for r in run.data.test_x.flatten(1)[:, :6])
    full = build_run(compose_cfg(*SYNTH))
    held = {tuple(r.tolist()) for r in full.data.train_x.flatten(1)[:, :6]}
    assert all(tuple(r.tolist()) in held for r in run.data.test_x.flatten(1)[:, :6])  # from train


def test_a_key_added_later_and_left_off_is_not_a_change():
    """A run saved before ``train.amp`` existed equals one with ``train.amp: null`` (reuse of
    committed runs, resume); a key turned on, or any other difference, is still a change."""
    from dpsub.training.checkpoint import changed_keys

    saved = {"train": {"epochs": 1}, "privacy": {"epsilon": 2.0}}
    assert changed_keys(saved, {**saved, "train": {"epochs": 1, "amp": None}}) == []
    assert changed_keys(saved, {**saved, "train": {"epochs": 1, "flag": False}}) == []
    assert changed_keys(saved, {**saved, "train": {"epochs": 1, "amp": "bf16"}}) == ["train.amp"]
    # a config group added later at its "none" option (features), or turned on
    assert changed_keys(saved, {**saved, "features": {"name": "none"}}) == []
    assert changed_keys(saved, {**saved, "features": {"name": "scatternet"}}) == ["features.name"]
    assert changed_keys(saved, {"train": {"epochs": 1}, "privacy": {}}) == ["privacy.epsilon"]
    assert changed_keys({"privacy": {"epsilon": None}}, {"privacy": {"epsilon": 0}}) == [
        "privacy.epsilon"
    ]
