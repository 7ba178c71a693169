"""The privacy account on its own: numbers and noise records in, charges out (no run)."""

from __future__ import annotations

import math

import pytest
import torch

from dpsub.errors import PrivacyError
from dpsub.mechanisms import Phase
from dpsub.privacy import NoiseRecord, PrivacyAccount
from dpsub.privacy.sampling import PoissonSampler, seeded_uniform


def account(policy="planned", steps=10, epsilon=2.0, **kw):
    return PrivacyAccount.open(
        n=1000, batch_size=100, steps=steps, phases=[Phase(steps)], policy=policy,
        epsilon=epsilon, delta=1e-5, **kw,
    )  # fmt: skip


def test_planned_charges_the_plan_and_refuses_less_noise():
    acct = account()
    z = acct.multiplier(0)
    assert acct.q == 0.1 and z == acct.z and acct.admit(0)
    assert acct.charge([NoiseRecord("g", 1.0, z)], z) == z
    assert acct.ledger.history == [(z, 0.1, 1)] and acct.nominal is None
    with pytest.raises(PrivacyError, match="less than"):
        acct.charge([NoiseRecord("g", 1.0, 0.99 * z)], z, who="step 1")
    with pytest.raises(PrivacyError, match="without drawing noise"):
        acct.charge([], z)
    assert acct.ledger.steps == 1  # nothing charged for the refused releases


def test_planned_admits_no_step_past_the_budget():
    acct = account(steps=5)
    for step in range(5):
        assert acct.admit(step)
        acct.charge([NoiseRecord("g", 1.0, acct.z)], acct.z)
    assert acct.epsilons()["epsilon"] <= 2.0
    assert not acct.admit(5)  # one more step at z would spend more than epsilon


def test_measured_charges_the_records_and_keeps_the_plan_as_nominal():
    acct = account("measured")
    z = acct.z
    assert acct.charge([NoiseRecord("g", 1.0, 0.9 * z)], z) == pytest.approx(0.9 * z)
    assert acct.nominal.history == [(z, 0.1, 1)]
    eps = acct.epsilons()
    assert eps["epsilon"] > eps["epsilon_nominal"] and acct.covered_by_epsilon
    with pytest.raises(PrivacyError, match="no noise"):
        acct.charge([NoiseRecord("g", 1.0, 0.0)], z)


def test_nominal_enforces_the_nominal_budget_and_is_not_covered():
    acct = account("nominal", steps=3)
    assert not acct.covered_by_epsilon and acct.budget_ledger is acct.nominal
    for _ in range(3):  # the honest epsilon may exceed the budget; the nominal may not
        assert acct.charge([NoiseRecord("g", 1.0, acct.z / 4)], acct.z) is not None
    assert acct.epsilons()["epsilon"] > 2.0 >= acct.epsilons()["epsilon_nominal"]
    assert acct.charge([NoiseRecord("g", 1.0, acct.z / 4)], acct.z) is None  # budget spent


def test_a_non_private_account_charges_nothing():
    acct = PrivacyAccount.open(n=1000, batch_size=100, steps=10, phases=None)
    assert acct.admit(0) and not acct.private and math.isinf(acct.multiplier(0))
    assert math.isinf(acct.charge([], math.inf)) and acct.epsilons() == {"epsilon": math.inf}


def test_the_account_owns_the_poisson_sampler_at_its_rate():
    uniform = seeded_uniform(torch.Generator().manual_seed(0), "cpu")
    acct = account(uniform=uniform)
    assert isinstance(acct.sampler, PoissonSampler) and acct.sampler.q == acct.q
    state = acct.state_dict()
    assert set(state) == {"ledger", "nominal", "sampler"}


def test_a_log_line_marks_the_running_rdp_bound_when_the_accountant_is_another():
    from dpsub.training.progress import _eps

    assert _eps({"epsilon": 0.09}) == "0.0900"
    assert (
        _eps({"epsilon_rdp": 0.126}) == "0.1260 (RDP bound)"
    )  # accountant=prv, between evaluations
    assert _eps({}) == "inf"
