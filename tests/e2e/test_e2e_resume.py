"""Kill and resume, every mechanism and signal (slow; the hardest case also runs in the
integration suite)."""

from __future__ import annotations

import signal

import pytest

from helpers.runs import check_kill_and_resume


@pytest.mark.parametrize(
    "mech,sig",
    [("dpsgd", signal.SIGTERM), ("dpsgd", signal.SIGKILL), ("gep", signal.SIGTERM)],
)
def test_kill_and_resume_reaches_the_same_run(tmp_path, references, mech, sig):
    check_kill_and_resume(tmp_path, references(mech), mech, sig)
