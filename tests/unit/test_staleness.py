"""The subspace-staleness study's schedule and decision rule (dpsub.experiments.bench.staleness)."""

from __future__ import annotations

import pytest

from dpsub.experiments.bench.staleness import FRESH, Plan, decide


def test_each_interval_chain_starts_fresh_and_ends_n_steps_before_its_sample():
    plan = Plan((100,), intervals=(5, 20), chain={5: 3, 20: 2})
    fits = {step: plan.fits_at(step) for step in range(0, 101) if plan.fits_at(step)}
    assert fits[60] == [("every_20", 100, False)] and fits[80] == [("every_20", 100, True)]
    assert fits[85] == [("every_5", 100, False)]
    assert fits[90] == [("every_5", 100, True)] and fits[95] == [("every_5", 100, True)]
    assert fits[100] == [(FRESH, 100, False), ("fresh_again", 100, False)]
    assert sorted(fits) == [60, 80, 85, 90, 95, 100] and plan.first_step() == 60


def _rec(fresh, n5, n20):
    errs = lambda v: {"mean_error": v, "median_residual": v}  # noqa: E731
    return {FRESH: errs(fresh), "every_5": errs(n5), "every_20": errs(n20)}


@pytest.mark.parametrize(
    ("n5", "n20", "want"), [(1.05, 1.08, 20), (1.05, 1.2, 5), (1.2, 1.0, 1), (1.2, 1.3, 1)]
)
def test_the_longest_interval_whose_shorter_ones_pass_too(n5, n20, want):
    assert decide([_rec(0.5, 0.5 * n5, 0.5 * n20)], (5, 20))["refit_every"] == want
