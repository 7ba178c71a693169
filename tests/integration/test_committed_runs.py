"""Committed results reproduce: two cheap MNIST runs' noise multiplier and epsilon, exactly,
from their saved config (every committed run, and one re-trained bit for bit: tests/e2e)."""

from __future__ import annotations

import json
import math

import pytest

from dpsub.rundir import RunDir

from conftest import REPO, SHARED, needs_shared
from helpers.committed import CHEAP, check_run

pytestmark = needs_shared


@pytest.mark.parametrize("path", CHEAP, ids=lambda p: p.name)
def test_cheap_committed_epsilons_reproduce_exactly(path):
    assert check_run(RunDir(path), {}) is None


def _searches():
    return sorted(p.parent for p in (REPO / "results").rglob("selection.json")
                  if ".stale" not in p.parts)  # fmt: skip


@pytest.mark.parametrize("where", _searches(), ids=lambda p: str(p.relative_to(REPO / "results")))
def test_committed_search_epsilons_recompute(where):
    """A committed ``dpsub-select`` search's epsilon, recomputed from its record alone: each
    candidate's config composed again, its steps charged one at a time (not the plan's
    curve that the search used), the largest curve with the score's Gaussian put through
    the repeat-and-select bound; never below the recomputation. The kept run stayed under
    the bound its search claimed."""
    import numpy as np

    from dpsub.cli.select import FORCED, candidates
    from dpsub.config import validate
    from dpsub.overrides import compose, config_context
    from dpsub.privacy import PrivacyLedger
    from dpsub.privacy.accountants import rdp_to_epsilon
    from dpsub.privacy.selection import Repetitions, selection_epsilon
    from dpsub.training.build import private_data

    from helpers.committed import account_of, stepped_rdp

    r = json.loads((where / "selection.json").read_text())
    base = [o for o in r["overrides"] if not o.startswith("data.root=")]
    pick = r.get("validation_pick", "uniform")  # searches before it was recorded: uniform
    forced = [f for f in FORCED if not f.startswith("dataset.validation_pick=")]
    forced.append(f"dataset.validation_pick={pick}")  # the search's own (older ones: uniform)
    listed = r.get("candidates") or []
    curves, n = [], None
    with config_context():
        for cand in candidates(r.get("grid") or [], listed):
            s = validate(compose([*base, f"data.root={SHARED}", *forced, *cand]))
            n = n or len(private_data(s)[1].train_y)
            steps, mech, _, acct = account_of(s, n)
            assert mech.private and acct.policy == "planned", cand
            curves.append(stepped_rdp(acct, steps))
    bound = np.max(curves, axis=0)
    law = Repetitions(mean=r["repetitions"]["mean"], shape=r["repetitions"]["shape"])
    eps = selection_epsilon(bound, law, r["delta"], r["score_sigma"])
    assert r["epsilon"] >= eps * (1 - 1e-9), (r["epsilon"], eps)
    assert math.isclose(r["epsilon"], eps, rel_tol=1e-9)
    assert math.isclose(r["epsilon_of_each_run"], rdp_to_epsilon(bound, r["delta"]), rel_tol=1e-9)
    if r["candidate"] is not None:
        kept = PrivacyLedger.load(where / "ledger.json").rdp()
        assert np.all(kept <= bound * (1 + 1e-9)), "the kept run spent more than the bound"
