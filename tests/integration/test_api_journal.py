"""The API's release journal (make_private(..., journal=PATH)): a crash loses no release."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import dpsub

from conftest import REPO


def blobs(n=600, d=10, k=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    return x, (x @ torch.randn(d, k, generator=g)).argmax(1)


def free(hidden=16, **kw):
    """A session at a fixed multiplier (no budget) over a small MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    args = {"batch_size": 60, "noise_multiplier": 1.0, "steps": 20, **kw}
    return dpsub.make_private(model, opt, blobs(), **args)


def steps(private, n: int) -> dict:
    for _ in range(n):
        private.step()
    return copy.deepcopy(private.state_dict())


CRASH = """
import os, sys, torch
sys.path.insert(0, {tests!r})
from integration.test_api_journal import free, steps
private = free(secure=True, journal={journal!r})
torch.save(steps(private, 3), {state!r})
steps(private, 4)
os._exit(1)  # killed: no finally, no state saved after step 3
"""


def test_a_crashed_sessions_releases_after_its_last_state_are_charged(tmp_path):
    journal, state = tmp_path / "releases.jsonl", tmp_path / "state.pt"
    script = CRASH.format(tests=str(REPO / "tests"), journal=str(journal), state=str(state))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr
    again = free(secure=True, journal=journal)
    assert again.ledger.steps == 7  # the 7 releases the killed process made, before any load
    again.load_state_dict(torch.load(state, weights_only=False))
    assert again.steps == 3 and again.ledger.steps == 7  # the 4 after the state stay charged
    steps(again, 2)
    reference = free()
    steps(reference, 9)
    assert again.epsilon == reference.epsilon


def test_states_of_other_sessions_and_forks_are_journaled_too(tmp_path):
    journal = tmp_path / "j.jsonl"
    other = steps(free(seed=1), 3)
    b = free(journal=journal)
    b.load_state_dict(other)  # the ledger now charges those 3 too: so does the journal
    steps(b, 2)
    twin = copy.deepcopy(b)  # a fork appends its own releases to the same journal
    steps(twin, 2)
    steps(b, 1)
    assert (b.ledger.steps, twin.ledger.steps) == (6, 7)
    assert free(journal=journal).ledger.steps == 3 + 2 + 2 + 1


def test_a_line_cut_by_a_crash_is_dropped_and_the_journal_continues(tmp_path):
    journal = tmp_path / "j.jsonl"
    steps(free(journal=journal), 2)
    with open(journal, "a") as f:
        f.write('{"id": "cut", "z": 1.0')  # the process died inside this write
    again = free(journal=journal)
    assert again.ledger.steps == 2
    steps(again, 1)
    assert free(journal=journal).ledger.steps == 3


def test_a_journaled_budget_refuses_what_the_crashed_session_spent(tmp_path):
    journal = tmp_path / "j.jsonl"
    kw = dict(epsilon=2.0, noise_multiplier=None, steps=6, journal=journal)
    steps(free(**kw), 4)
    again = free(**kw)
    steps(again, 2)
    with pytest.raises(dpsub.BudgetExhausted, match="by 6 releases"):
        again.step()  # epsilon 2 was calibrated for 6 releases: the journal holds them all


def test_a_journal_of_another_privacy_setting_or_a_non_private_one_is_refused(tmp_path):
    journal = tmp_path / "j.jsonl"
    steps(free(journal=journal), 1)
    with pytest.raises(
        ValueError, match=r"journal: .*j\.jsonl.* delta 1e-05, this session's 0\.01"
    ):
        free(journal=journal, delta=1e-2)
    with pytest.raises(ValueError, match="journal: .* budget"):
        free(journal=journal, epsilon=50.0)
    with pytest.raises(ValueError, match="journal: .* nominal ledger None"):
        free(journal=journal, mechanism="dphero", options={"accounting": "nominal"},
             epsilon=50.0)  # fmt: skip
    with pytest.raises(ValueError, match="journal: a non-private session"):
        free(journal=tmp_path / "n.jsonl", mechanism="nonprivate", noise_multiplier=None)
    (tmp_path / "x.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match="journal: .*x.jsonl is not a dpsub release journal"):
        free(journal=tmp_path / "x.jsonl")
    assert free(journal=journal).ledger.steps == 1


def test_dp_heros_nominal_ledger_is_journaled(tmp_path):
    kw = dict(mechanism="dphero", options={"accounting": "nominal"}, epsilon=50.0,
              noise_multiplier=2.0, steps=6, hidden=4, journal=tmp_path / "j.jsonl")  # fmt: skip
    hero = free(**kw)
    steps(hero, 3)
    again = free(**kw)
    assert again.run.account.epsilons() == hero.run.account.epsilons()
    assert again.run.account.nominal.steps == 3


def test_a_dp_hero_journal_of_another_nominal_budget_is_refused(tmp_path):
    hero = dict(mechanism="dphero", options={"accounting": "nominal"}, noise_multiplier=2.0,
                steps=6, hidden=4, journal=tmp_path / "j.jsonl")  # fmt: skip
    steps(free(epsilon=1.0, **hero), 2)
    with pytest.raises(ValueError, match="journal: .* nominal ledger .*'budget': 1.0"):
        free(epsilon=500.0, **hero)


def test_a_file_that_is_not_a_journal_is_refused_and_left_as_it_was(tmp_path):
    private = free()
    steps(private, 3)
    ledger = tmp_path / "ledger.json"  # dpsub-train's ledger: one JSON object, no newline
    private.ledger.save(ledger)
    before = ledger.read_bytes()
    with pytest.raises(ValueError, match="journal: .*ledger.json is not a dpsub release journal"):
        free(journal=ledger)
    assert ledger.read_bytes() == before


def test_a_relative_journal_stays_where_it_was_opened(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    private = free(journal="j.jsonl")
    steps(private, 2)
    monkeypatch.chdir(tmp_path / "sub")
    steps(private, 3)
    assert not (tmp_path / "sub" / "j.jsonl").exists()
    assert free(journal=tmp_path / "j.jsonl").ledger.steps == 5


def test_a_write_the_disk_refuses_leaves_no_partial_line_and_is_written_later(tmp_path):
    resource = pytest.importorskip("resource")
    import signal

    journal = tmp_path / "j.jsonl"
    private = free(journal=journal)
    start = steps(private, 0)
    steps(private, 2)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (journal.stat().st_size + 40, limit[1]))
    try:  # a full disk: the next row does not fit (a short write, then EFBIG)
        with pytest.raises(OSError):
            private.step()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert private.ledger.steps == 3 and free(journal=journal).ledger.steps == 2
    steps(private, 1)  # the refused row is written with this one
    assert free(journal=journal).ledger.steps == 4 == private.ledger.steps
    private.load_state_dict(start)  # the refused release was charged: a rollback keeps it
    assert private.ledger.steps == 4
