"""A noise-matched run end to end (privacy.simulate): what its files say, what resume refuses.

A simulated noise level is not a privacy guarantee: the run's summary says so
(``covered_by_epsilon: false``, ``simulated: {...}``), its ledger holds the noise it drew
and its epsilon is its own.
"""

from __future__ import annotations

import json

import pytest

from dpsub.errors import ResumeError
from dpsub.privacy import PrivacyLedger, epsilon_for
from dpsub.training.loop import train

from conftest import SYNTH, compose_cfg

SIM = (*SYNTH, "train.max_steps=3", "privacy.simulate.batch_size=200",
       "privacy.simulate.noise_multiplier=2.0")  # fmt: skip


def test_a_simulated_run_is_labelled_and_charged_its_own_noise(tmp_path):
    train(compose_cfg(*SIM), tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    z_run, q = 2.0 * 64 / 200, 64 / 400
    assert s["covered_by_epsilon"] is False and "simulated_noise" in s["not_covered"]
    sim = s["simulated"]
    assert (sim["batch_size"], sim["noise_multiplier_ref"], sim["run_batch_size"]) == (200, 2.0, 64)
    assert sim["noise_multiplier_run"] == pytest.approx(z_run) == s["noise_multiplier"]
    assert sim["epsilon_ref"] == pytest.approx(epsilon_for([(2.0, 200 / 400, 3)], 1e-5))
    assert s["epsilon"] == pytest.approx(epsilon_for([(z_run, q, 3)], 1e-5))  # its own
    ledger = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    assert ledger.history == [(pytest.approx(z_run), q, 3)]  # the noise drawn, never z_ref
    log = (tmp_path / "run" / "train.log").read_text()
    assert "not a privacy guarantee" in log and "NOT a privacy guarantee" in log
    assert "is below this run's batch" not in log


def test_a_reference_batch_below_the_runs_own_is_warned_about(tmp_path):
    """Simulating a smaller batch's noise makes a run noisier than it need be: legal (its
    own epsilon stays right), but most likely a mistake, so the log says so."""
    train(compose_cfg(*SYNTH, "train.max_steps=1", "privacy.simulate.batch_size=16",
                      "privacy.simulate.noise_multiplier=2.0"), tmp_path / "run")  # fmt: skip
    log = (tmp_path / "run" / "train.log").read_text()
    assert "privacy.simulate.batch_size=16 is below this run's batch 64" in log


def test_resume_refuses_a_changed_simulation(tmp_path):
    cfg = compose_cfg(*SIM, "train.max_steps=2")
    train(cfg, tmp_path / "run")
    changed = compose_cfg(*SIM, "train.max_steps=2", "privacy.simulate.batch_size=400")
    with pytest.raises(ResumeError, match="privacy.simulate.batch_size"):
        train(changed, tmp_path / "run", resume=True)
