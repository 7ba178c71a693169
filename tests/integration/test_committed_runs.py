"""Committed results reproduce: two cheap MNIST runs' noise multiplier and epsilon, exactly,
from their saved config (every committed run, and one re-trained bit for bit: tests/e2e)."""

from __future__ import annotations

import pytest

from dpsub.rundir import RunDir

from conftest import needs_shared
from helpers.committed import CHEAP, check_run

pytestmark = needs_shared


@pytest.mark.parametrize("path", CHEAP, ids=lambda p: p.name)
def test_cheap_committed_epsilons_reproduce_exactly(path):
    assert check_run(RunDir(path), {}) is None
