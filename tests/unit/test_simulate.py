"""Noise-matched simulation (privacy.simulate): the multiplier formula, the account it opens
and the configs it refuses. A simulated noise level is not a privacy guarantee."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from dpsub.config import validate
from dpsub.errors import ConfigError
from dpsub.mechanisms import Phase
from dpsub.privacy import NoiseRecord, PrivacyAccount, calibrate_noise, epsilon_for
from dpsub.privacy.simulate import reference, run_multiplier

from conftest import SYNTH, compose_cfg


def opts(**kw):
    keys = ("batch_size", "noise_multiplier", "epsilon", "delta", "dataset_size", "steps")
    return SimpleNamespace(**{k: kw.get(k) for k in keys})


def ref(o, batch_size=128, n=45_000, steps=50):
    return reference(o, batch_size=batch_size, n=n, steps=steps, phases_of=lambda t: [Phase(t)],
                     epsilon=2.0, delta=1e-5, accountant="rdp")  # fmt: skip


def test_the_run_draws_the_reference_noise_on_the_mean_gradient():
    """z_run / b == z_ref / B_ref, z_ref calibrated at the reference's q = B_ref / N_ref."""
    assert run_multiplier(2.297, 128, 1000) == pytest.approx(0.294016)
    sim = ref(opts(batch_size=1000, dataset_size=50_000))
    z_ref = calibrate_noise(2.0, 1e-5, 1000 / 50_000, 50)  # not at the run's q = 128 / 45,000
    assert sim.noise_multiplier_ref == z_ref and sim.calibrated and sim.epsilon_ref == 2.0
    assert sim.noise_multiplier / 128 == pytest.approx(z_ref / 1000)
    assert (sim.steps_ref, sim.dataset_size_ref, sim.sample_rate_ref) == (50, 50_000, 0.02)


def test_a_given_reference_multiplier_names_the_epsilon_it_would_spend():
    sim = ref(opts(batch_size=1000, noise_multiplier=2.297, steps=300), n=45_000)
    assert not sim.calibrated and sim.noise_multiplier == pytest.approx(2.297 * 128 / 1000)
    assert sim.epsilon_ref == pytest.approx(epsilon_for([(2.297, 1000 / 45_000, 300)], 1e-5))
    assert sim.as_dict()["what"] == "simulated noise level, not a privacy guarantee"
    assert ref(opts()) is None  # no reference batch: no simulation


def test_the_account_charges_the_noise_drawn_and_its_own_epsilon():
    """The ledger records z_run (never z_ref) at the run's own q; no budget stops it."""
    sim = ref(opts(batch_size=1000, noise_multiplier=2.297), n=10_000, steps=5)
    acct = PrivacyAccount.open(n=10_000, batch_size=128, steps=5, phases=[Phase(5)],
                               epsilon=2.0, simulation=sim)  # fmt: skip
    z_run = sim.noise_multiplier
    assert acct.z == z_run and acct.multiplier(0) == z_run and acct.simulation is sim
    for step in range(5):
        assert acct.admit(step)
        acct.charge([NoiseRecord("g", 1.0, z_run)], z_run)
    assert acct.ledger.history == [(z_run, 128 / 10_000, 5)]
    own = epsilon_for([(z_run, 128 / 10_000, 5)], 1e-5)
    assert acct.epsilons()["epsilon"] == pytest.approx(own) and own > sim.epsilon_ref
    assert math.isinf(acct.ledger.budget)
    with pytest.raises(ConfigError, match="measured accounting"):  # DP-Hero's honest ledger
        PrivacyAccount.open(n=10_000, batch_size=128, steps=5, phases=[Phase(5)],
                            policy="measured", simulation=sim)  # fmt: skip


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["privacy.simulate.epsilon=2"], "privacy.simulate.epsilon"),
        (["privacy.simulate.batch_size=1000", "privacy.noise_multiplier=1"],
         "privacy.noise_multiplier"),
        (["privacy.simulate.batch_size=1000", "privacy.simulate.noise_multiplier=2",
          "privacy.simulate.epsilon=2"], "privacy.simulate.epsilon"),
        (["privacy.simulate.batch_size=1000", "mechanism=nonprivate"],
         "privacy.simulate.batch_size"),
    ],
)  # fmt: skip
def test_an_ambiguous_simulation_is_one_config_error(overrides, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ":"):
        validate(compose_cfg(*SYNTH, *overrides))


def test_a_reference_batch_larger_than_its_dataset_is_refused():
    with pytest.raises(ConfigError, match="privacy.simulate.batch_size"):
        ref(opts(batch_size=1000, dataset_size=500))


def test_the_plan_line_says_the_noise_level_is_simulated():
    from dpsub.cli.train import plan_line

    line = plan_line(compose_cfg(*SYNTH, "privacy.simulate.batch_size=1000"))
    assert "SIMULATED noise level of batch 1000 at epsilon 2.0" in line
    assert "NOT a privacy guarantee" in line
    assert "SIMULATED" not in plan_line(compose_cfg(*SYNTH))
