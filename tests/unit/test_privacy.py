"""Accountant values (METHODS.md references), calibration, ledger and budget."""

import math

import pytest

from dpsub.mechanisms import Phase
from dpsub.privacy import PrivacyLedger, PrivacyPlan, calibrate_noise, calibrate_plan, epsilon_for

DELTA = 1e-5


@pytest.mark.parametrize(
    "q,z,steps,rdp_ref,prv_ref,eps_error",
    [(0.02, 1.0, 10000, 15.35, 14.24, 1e-2), (4096 / 50000, 10.0, 875, 0.99, 0.90, 1e-3)],
)
def test_reference_values(q, z, steps, rdp_ref, prv_ref, eps_error):
    # RDP: Opacus' orders give 15.32 where a coarser order grid gives 15.35-15.36.
    assert epsilon_for([(z, q, steps)], DELTA, "rdp") == pytest.approx(rdp_ref, rel=5e-3)
    assert epsilon_for([(z, q, steps)], DELTA, "prv", eps_error=eps_error) == pytest.approx(
        prv_ref, abs=0.01
    )


def test_rdp_is_an_upper_bound_on_prv():
    for q, z, t in [(0.02, 1.0, 10000), (0.01, 1.5, 3000)]:
        assert epsilon_for([(z, q, t)], DELTA, "rdp") >= epsilon_for([(z, q, t)], DELTA, "prv")


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_calibrated_multiplier_hits_target(accountant):
    q, steps, target = 256 / 60000, 2000, 2.0
    z = calibrate_noise(target, DELTA, q, steps, accountant)
    eps = epsilon_for([(z, q, steps)], DELTA, accountant)
    assert target - 0.02 <= eps <= target + 1e-6
    # a noticeably smaller multiplier must overshoot: calibration is not slack
    assert epsilon_for([(0.95 * z, q, steps)], DELTA, accountant) > target


def test_ledger_matches_one_shot_composition_and_compresses_history():
    led = PrivacyLedger(delta=DELTA)
    for _ in range(500):
        led.step(1.1, 0.01)
    for _ in range(300):
        led.step(2.0, 0.02)
    assert led.history == [(1.1, 0.01, 500), (2.0, 0.02, 300)]
    assert led.steps == 800
    assert led.epsilon() == pytest.approx(epsilon_for(led.history, DELTA, "rdp"), rel=1e-12)
    # state round trip keeps the running RDP
    again = PrivacyLedger.from_state_dict(led.state_dict())
    assert again.epsilon() == pytest.approx(led.epsilon(), rel=1e-12)


def test_budget_stops_exactly_at_the_calibrated_step_count():
    q, steps = 0.01, 1000
    for accountant in ("rdp", "prv"):
        z = calibrate_noise(3.0, DELTA, q, steps, accountant)
        plan = PrivacyPlan(((z, q, steps),))
        led = PrivacyLedger(delta=DELTA, accountant=accountant, budget=3.0, plan=plan)
        n = 0
        while led.can_step(z, q) and n < 2 * steps:
            led.step(z, q)
            n += 1
        # the calibrated plan fits; past it, each step is checked with the accountant itself
        assert steps <= n <= steps * 1.02
        assert led.epsilon() <= 3.0 + 1e-9


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_fixed_plan_over_the_budget_stops_at_the_budget(accountant):
    """privacy.noise_multiplier fixes the plan without calibrating it: its prefix does not
    prove the budget holds (prv waved all 17 steps through to epsilon 21 on a budget of 1)."""
    z, q, budget = 1.2, 256 / 1437, 3.0
    plan = PrivacyPlan(((z, q, 8),))
    led = PrivacyLedger(delta=DELTA, accountant=accountant, budget=budget, plan=plan)
    while led.can_step(z, q) and led.steps < plan.total_steps:
        led.step(z, q)
    assert 0 < led.steps < plan.total_steps  # (where exactly: test_train_e2e.py)
    assert led.epsilon() <= budget
    # z = 0.5 on a budget of 1 (the audit's 17-step run): not even the first step fits
    plan = PrivacyPlan(((0.5, q, 2),))
    short = PrivacyLedger(delta=DELTA, accountant=accountant, budget=1.0, plan=plan)
    assert not short.can_step(0.5, q)


def test_prv_budget_outside_plan_queries_prv():
    plan = PrivacyPlan(((5.0, 0.01, 100),))
    led = PrivacyLedger(delta=DELTA, accountant="prv", budget=1.0, plan=plan)
    # a weaker step than planned is checked by PRV itself, not waved through
    assert not led.can_step(0.3, 0.5)


def test_infinite_noise_costs_nothing_and_zero_noise_is_refused():
    led = PrivacyLedger(delta=DELTA)
    led.step(math.inf, 0.1)
    assert led.epsilon() == 0.0
    with pytest.raises(ValueError):
        led.step(0.0, 0.1)


def test_budget_stop_takes_the_largest_step_count_under_the_budget():
    """Not just 'stops': exactly the steps T with eps(T) <= budget < eps(T + 1)."""
    z, q, budget = 1.0, 0.02, 2.0
    led = PrivacyLedger(delta=DELTA, budget=budget)
    while led.can_step(z, q):
        led.step(z, q)
    T = led.steps
    assert T > 0
    assert epsilon_for([(z, q, T)], DELTA) <= budget < epsilon_for([(z, q, T + 1)], DELTA)


def independent_rdp_epsilon(history, delta):
    """Opacus' own RDPAccountant, stepped one step at a time: an independent composition."""
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    for z, q, n in history:
        for _ in range(n):
            acc.step(noise_multiplier=z, sample_rate=q)
    return acc.get_epsilon(delta=delta)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_two_phase_schedule_is_calibrated_to_the_target(accountant):
    """A warm-up phase at 2z then a main phase at z: one z solved over the whole schedule."""
    q, target = 0.02, 3.0
    phases = [Phase(100, scale=2.0), Phase(400)]
    z, plan = calibrate_plan(target, DELTA, q, phases, accountant)
    assert plan.phases == ((2.0 * z, q, 100), (z, q, 400))
    eps = epsilon_for(plan.history(), DELTA, accountant)
    assert target - 0.01 <= eps <= target + 1e-9  # within the search tolerance, never above
    assert plan.multiplier_at(0) == 2 * z and plan.multiplier_at(99) == 2 * z
    assert plan.multiplier_at(100) == z and plan.multiplier_at(499) == z


def test_ledger_of_a_two_phase_run_equals_an_independent_composition():
    q = 0.02
    z, plan = calibrate_plan(3.0, DELTA, q, [Phase(100, scale=2.0), Phase(400)], "rdp")
    led = PrivacyLedger(delta=DELTA, budget=3.0, plan=plan)
    for t in range(plan.total_steps):
        assert led.can_step(plan.multiplier_at(t), q)
        led.step(plan.multiplier_at(t), q)
    assert led.epsilon() == pytest.approx(independent_rdp_epsilon(plan.history(), DELTA), rel=1e-9)


def test_prv_ledger_waves_through_only_steps_inside_the_plan():
    q = 0.02
    z, plan = calibrate_plan(3.0, DELTA, q, [Phase(50, scale=2.0), Phase(200)], "prv")
    led = PrivacyLedger(delta=DELTA, accountant="prv", budget=3.0, plan=plan)
    for t in range(plan.total_steps):
        assert led.can_step(plan.multiplier_at(t), q)
        led.step(plan.multiplier_at(t), q)
    assert led.epsilon() <= 3.0 + 0.02  # PRV's own eps_error
    assert not led.can_step(0.5 * z, q)  # off the plan, and over budget: PRV says no


def test_ledger_file_round_trip(tmp_path):
    led = PrivacyLedger(delta=DELTA, budget=4.0, plan=PrivacyPlan(((1.0, 0.1, 5),)))
    for _ in range(3):
        led.step(1.0, 0.1)
    led.save(tmp_path / "ledger.json", sync=True)
    again = PrivacyLedger.load(tmp_path / "ledger.json")
    assert again.history == led.history and again.plan == led.plan
    assert again.epsilon() == led.epsilon()


# ------------------------------------------------------ Opacus without its package
def test_rdp_orders_and_calibration_equal_opacus_exactly():
    """dpsub loads Opacus' RDP analysis without ``opacus/__init__`` (5 s of imports) and runs
    ``get_noise_multiplier``'s search itself: the orders and multipliers must stay Opacus'."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    from dpsub.privacy.accountants import DEFAULT_ORDERS

    assert list(DEFAULT_ORDERS) == RDPAccountant.DEFAULT_ALPHAS
    for eps, q, steps in [(2.0, 256 / 60000, 2000), (0.5, 0.01, 300), (8.0, 0.2, 56), (3, 1, 4)]:
        ours = calibrate_noise(eps, DELTA, q, steps, "rdp")
        theirs = get_noise_multiplier(
            target_epsilon=eps, target_delta=DELTA, sample_rate=q, steps=steps, accountant="rdp"
        )
        assert ours == theirs, (eps, q, steps)
        acc = RDPAccountant()
        acc.history = [(ours, q, steps)]
        assert epsilon_for([(ours, q, steps)], DELTA, "rdp") == acc.get_epsilon(delta=DELTA)


def test_rdp_accounting_does_not_import_the_opacus_package():
    import subprocess
    import sys

    code = (
        "import sys; from dpsub.privacy import calibrate_noise, PrivacyLedger; "
        "calibrate_noise(2.0, 1e-5, 0.01, 100); led = PrivacyLedger(delta=1e-5); "
        "led.step(1.0, 0.01); led.epsilon(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opacus'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_synced_ledger_save_is_durable_file_then_rename_then_directory(tmp_path, monkeypatch):
    """fsync the file, rename it over the ledger, then fsync the directory: without the last,
    a power loss after the rename can bring back the previous ledger (one step under-counted)."""
    import os
    import stat

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append((f"fsync {kind}", os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", None))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    led = PrivacyLedger(delta=DELTA, budget=4.0)
    led.step(1.0, 0.1)
    led.save(tmp_path / "ledger.json", sync=True)
    assert [e for e, _ in events] == ["fsync file", "replace", "fsync dir"]
    assert events[2][1] == os.stat(tmp_path).st_ino  # the ledger's own directory
    assert events[0][1] == os.stat(tmp_path / "ledger.json").st_ino  # the file renamed in
    events.clear()
    led.save(tmp_path / "ledger.json")  # unsynced (seeded mode): no fsync at all
    assert [e for e, _ in events] == ["replace"]
