"""dpsub-pate end to end on digits: teachers (vmap), budgeted answers, student, resume."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpsub.cli.pate import run_pate
from dpsub.config import compose
from dpsub.pate import run as pate_run
from dpsub.pate.teachers import TeacherOptions, train_chunk

from conftest import run_in_process

TINY = [
    "pate.teachers=8", "pate.public_size=150", "pate.sigma2=3.0", "privacy.epsilon=40",
    "pate.teacher.epochs=8", "pate.teacher.chunk=8", "pate.student.epochs=15",
    "pate.checkpoint_every=5", "logger=disabled", "device=cpu",
]  # fmt: skip


def _cfg(*extra):
    return compose([*TINY, *extra], config_name="dpsub_pate")


#: where accuracy is not asserted: teachers and student of a few epochs (seconds, not tens)
QUICK = ("pate.teacher.epochs=2", "pate.student.epochs=2")


def test_vmapped_teachers_equal_teachers_trained_alone():
    """A teacher's weights depend only on its own partition and index (not its chunk)."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 3, (40,))
    parts = [torch.arange(0, 20), torch.arange(20, 40)]

    def make():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))

    opts = TeacherOptions(epochs=2, batch_size=8, lr=0.1, chunk=2)
    _, both, _ = train_chunk(make, x, y, parts, 0, 7, opts)
    _, second, _ = train_chunk(make, x, y, parts[1:], 1, 7, opts)
    x2 = x.clone()
    x2[0] = 100.0  # change an example of teacher 0: teacher 1 is untouched
    _, both2, _ = train_chunk(make, x2, y, parts, 0, 7, opts)
    for k in both:
        assert torch.allclose(both[k][1], second[k][0], atol=1e-5)
        assert torch.equal(both[k][1], both2[k][1])
        assert not torch.equal(both[k][0], both2[k][0])


def test_a_teachers_epochs_do_not_depend_on_its_neighbours_sizes():
    """With the hash partition teachers' sizes differ: removing an example of one teacher
    (which changes its number of steps) leaves a chunk-mate bit-identical, and each teacher
    equals itself trained alone."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 3, (40,))

    def make():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))

    opts = TeacherOptions(epochs=2, batch_size=8, lr=0.1, chunk=2)
    big, small = torch.arange(0, 17), torch.arange(20, 32)  # 3 and 2 steps an epoch
    _, both, _ = train_chunk(make, x, y, [big, small], 0, 7, opts)
    _, alone, _ = train_chunk(make, x, y, [small], 1, 7, opts)
    _, fewer, _ = train_chunk(make, x, y, [big[:-1], small], 0, 7, opts)  # 16: 2 steps
    for k in both:
        assert torch.allclose(both[k][1], alone[k][0], atol=1e-5)
        assert torch.equal(both[k][1], fewer[k][1])
        assert not torch.equal(both[k][0], fewer[k][0])


def test_pate_end_to_end_and_resume(tmp_path, monkeypatch):
    full = run_pate(_cfg(), tmp_path / "full")
    files = {p.name for p in (tmp_path / "full").iterdir()}
    assert {"config.yaml", "summary.json", "metrics.jsonl", "train.log", "private"} <= files
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary == full and summary["covered_by_epsilon"] is True
    assert summary["neighbours"].startswith("add/remove")  # the hash partition (default)
    assert 0 < summary["epsilon"] <= 40.0 and summary["stopped_by_budget"]
    assert "epsilon_data_dependent" not in summary  # unnoised: only on request
    assert summary["answered"] == summary["queries"] > 0
    assert summary["answered_label_accuracy"] > 0.3  # the noisy labels carry signal
    assert summary["test_accuracy"] > 0.15  # above chance (10 classes)
    assert "data-dependent epsilon" not in (tmp_path / "full" / "train.log").read_text()
    public_state = json.loads((tmp_path / "full" / pate_run.STATE).read_text())
    labels = public_state["labels"]
    assert "rdp_data_dependent" not in public_state["ledger"]  # un-noised: under private/
    assert (tmp_path / "full" / pate_run.DATA_DEPENDENT).is_file()
    assert "sizes" not in (tmp_path / "full" / "train.log").read_text()  # counts of hashes

    # killed after 12 queries (last save at 10), then resumed
    real = pate_run.build_aggregator

    def dying(opts):
        agg, calls = real(opts), [0]

        def call(counts, rng):
            calls[0] += 1
            if calls[0] > 12:
                raise KeyboardInterrupt
            return agg(counts, rng)

        return type("Dying", (), {"worst_case": agg.worst_case, "__call__": staticmethod(call)})()

    monkeypatch.setattr(pate_run, "build_aggregator", dying)
    with pytest.raises(KeyboardInterrupt):  # its student is not what is compared: one epoch
        run_pate(_cfg("pate.student.epochs=1"), tmp_path / "killed")
    saved = json.loads((tmp_path / "killed" / pate_run.STATE).read_text())
    assert saved["next"] == 10 and not saved["done"]
    monkeypatch.setattr(pate_run, "build_aggregator", real)
    monkeypatch.setattr(pate_run, "compute_votes", lambda *a: pytest.fail("votes recomputed"))
    resumed = run_pate(
        OmegaConf.load(tmp_path / "killed" / "config.yaml"), tmp_path / "killed", True
    )
    again = json.loads((tmp_path / "killed" / pate_run.STATE).read_text())["labels"]
    assert again == labels  # the same answers: the replayed queries drew the same noise
    assert len({i for i, _ in again}) == len(again)  # no query answered twice
    assert resumed["queries"] == full["queries"]
    assert resumed["epsilon"] == pytest.approx(full["epsilon"])
    assert np.array_equal(
        np.load(tmp_path / "full" / pate_run.VOTES), np.load(tmp_path / "killed" / pate_run.VOTES)
    )


@pytest.mark.parametrize(
    "arg,key",
    [("pate.teachers=0", "pate.teachers"), ("pate.nope=1", "pate.nope"),
     ("pate=nope", "pate"), ("privacy.epsilon=-1", "privacy.epsilon")],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, arg, key):
    out = tmp_path / "run"
    words = [arg, f"out_dir={out}", "logger=disabled"]  # dpsub-pate's cli() in this process
    proc = run_in_process("dpsub.cli.pate", words, dict(os.environ))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert key in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_data_dependent_epsilon_only_on_request_and_then_not_covered(tmp_path):
    """The 2018 data-dependent epsilon is computed from the unnoised votes: reporting it
    releases a private statistic, so the run is then not covered by its epsilon."""
    summary = run_pate(_cfg("pate.data_dependent=true", *QUICK), tmp_path / "dd")
    assert summary["covered_by_epsilon"] is False
    assert 0 < summary["epsilon_data_dependent"] <= summary["epsilon"] + 1e-9
    assert "data-dependent epsilon" in (tmp_path / "dd" / "train.log").read_text()


def test_validation_split_tunes_without_the_test_set(tmp_path, monkeypatch):
    """dataset.validation_size: teachers train on the rest of the private set, the public
    pool is unchanged, and the student is evaluated on the held-out examples only."""
    from dpsub.training import loop as trainer

    seen = []
    real = trainer.evaluate
    monkeypatch.setattr(
        trainer, "evaluate", lambda m, x, y, b: seen.append(len(y)) or real(m, x, y, b)
    )
    summary = run_pate(_cfg("dataset.validation_size=200", *QUICK), tmp_path / "tune")
    assert "validation_accuracy" in summary and "test_accuracy" not in summary
    assert set(summary["not_covered_statistics"]) == {"validation_accuracy", "validation_loss"}
    assert seen == [200]  # evaluated once, on the 200 held-out training examples
    log_text = (tmp_path / "tune" / "train.log").read_text()
    assert "final: validation accuracy" in log_text and "public pool 150" in log_text


def test_votes_cache_shares_teachers_across_budgets_only(tmp_path, monkeypatch):
    """Runs that differ only in the aggregator or the budget read the cached votes; a run
    whose teachers differ (another seed) trains its own."""
    # one epoch each: what is cached does not depend on how well the models learn
    cache = (f"pate.votes_cache={tmp_path / 'cache'}", "pate.teacher.epochs=1",
             "pate.student.epochs=1")  # fmt: skip
    first = run_pate(_cfg(*cache), tmp_path / "a")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1
    calls = []
    real = pate_run.compute_votes
    monkeypatch.setattr(pate_run, "compute_votes", lambda *a: calls.append(1) or real(*a))
    other = run_pate(_cfg(*cache, "privacy.epsilon=20", "pate.sigma2=5.0"), tmp_path / "b")
    assert calls == [] and other["queries"] != first["queries"]
    assert np.array_equal(
        np.load(tmp_path / "a" / pate_run.VOTES), np.load(tmp_path / "b" / pate_run.VOTES)
    )
    run_pate(_cfg(*cache, "seed=1"), tmp_path / "c")
    assert calls == [1] and len(list((tmp_path / "cache").glob("*.npy"))) == 2


def test_chunk_claims_share_teachers_between_processes(tmp_path):
    """A chunk claimed by a live process is left to it; a dead holder's claim is taken over."""
    from dpsub.pate.teachers import _claim

    claim = tmp_path / "chunk0.claim"
    assert _claim(claim) and not _claim(claim)  # this (live) process holds it
    claim.write_text("999999999")  # a pid that does not exist
    assert _claim(claim) and claim.read_text() == str(__import__("os").getpid())


def _refused(capsys, *args, **kw) -> str:
    """run_pate(...) exits 2 with one line on stderr; returns that line."""
    with pytest.raises(SystemExit) as exit_info:
        run_pate(*args, **kw)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def _saved_config(*extra) -> dict:
    cfg, pate = pate_run.split(_cfg(*extra))
    return pate_run.run_config(cfg, pate)


@pytest.mark.parametrize("held", ["config.yaml", pate_run.STATE])
def test_a_dir_holding_a_run_is_refused_without_resume(tmp_path, capsys, held):
    """dpsub-pate out_dir=<a run's dir> neither continues the old state nor rewrites its
    config: one line, exit 2, nothing written."""
    run = tmp_path / "run"
    run.mkdir()
    (run / held).write_text("seed: 0\n")
    err = _refused(capsys, _cfg(), run)
    assert "out_dir" in err and f"resume={run}" in err
    assert [p.name for p in run.iterdir()] == [held]
    assert (run / held).read_text() == "seed: 0\n"


def test_a_run_dir_in_use_is_refused(tmp_path, capsys):
    """The run dir's lock is dpsub-train's: a second process (run or resume) is refused."""
    from dpsub.training.checkpoint import lock_run_dir

    run, empty = tmp_path / "run", tmp_path / "empty"
    run.mkdir()
    empty.mkdir()
    OmegaConf.save(OmegaConf.create(_saved_config()), run / "config.yaml")
    releases = [lock_run_dir(d, "out_dir") for d in (run, empty)]  # another open file: flock
    try:  # refuses it as it would another process
        assert "in use" in _refused(capsys, _cfg(), run, resume=True)
        assert "in use" in _refused(capsys, _cfg(), empty)
        assert [p.name for p in empty.iterdir()] == [".lock"]
    finally:
        for release in releases:
            release()


def test_a_resume_with_other_settings_is_refused(tmp_path, capsys):
    """As dpsub-train: settings that change what the run releases cannot change on resume,
    whether they come with the resume or were edited into config.yaml after the state was
    saved (the state records the run's config)."""
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(OmegaConf.create(_saved_config()), run / "config.yaml")
    err = _refused(capsys, _cfg("pate.sigma2=5.0"), run, resume=True)
    assert "pate.sigma2" in err and "resume" in err
    (run / pate_run.STATE).write_text(json.dumps({"config": _saved_config("privacy.epsilon=9")}))
    err = _refused(capsys, OmegaConf.load(run / "config.yaml"), run, resume=True)
    assert "privacy.epsilon" in err
    assert not (run / "train.log").exists()


def _agreeing_votes(cfg, pate, pools, device, save_dir=None):
    """Teachers that mostly agree with the pool's own labels (no training: fast)."""
    rng = np.random.default_rng(0)
    truth = pools.public_y.numpy()
    wrong = rng.random((pate.teachers, len(truth))) < 0.1
    return np.where(wrong, rng.integers(0, 10, wrong.shape), truth).astype(np.int16)


@pytest.mark.parametrize("aggregator", ["gnmax", "confident"])
def test_smooth_sensitivity_release_is_charged_recorded_and_covered(tmp_path, monkeypatch,
                                                                    aggregator):  # fmt: skip
    """pate.release=smooth_sensitivity: the released data-dependent epsilon, its cost (in
    the released value and, reserved from the start, in the run's epsilon), the state and
    the log; the run stays covered (nothing unnoised is reported); a resume after the
    release draws nothing new."""
    from dpsub.pate.accounting import ORDERS, PateLedger
    from dpsub.pate.smooth import gnss_rdp
    from dpsub.privacy.accountants import rdp_to_epsilon

    monkeypatch.setattr(pate_run, "compute_votes", _agreeing_votes)
    extra = [
        "pate.teachers=50",
        "pate.sigma2=10.0",
        "privacy.epsilon=8",
        "pate.smooth_sensitivity.order=10",
    ]
    if aggregator == "confident":
        extra += ["pate.aggregator=confident", "pate.sigma1=10.0", "pate.threshold=40"]
    run = tmp_path / "ss"
    summary = run_pate(_cfg("pate.release=smooth_sensitivity", *extra), run)
    assert summary["covered_by_epsilon"] is True and "epsilon_data_dependent" not in summary
    rel, reserve = summary["release"], gnss_rdp(0.02, 8.0, ORDERS)
    assert rel["rdp_cost"] == pytest.approx(gnss_rdp(0.02, 8.0, [10.0])[0])
    assert summary["epsilon_data_dependent_released"] == rel["epsilon"]
    assert rel["epsilon"] == pytest.approx(
        rdp_to_epsilon(np.array([rel["rdp_released"] + rel["rdp_cost"]]), 1e-5, [10.0])
    )
    state = json.loads((run / pate_run.STATE).read_text())
    curve = pate_run._private_curve(run, state["next"])  # private: not in state
    ledger = PateLedger.from_state_dict({**state["ledger"], **curve})
    assert np.array_equal(ledger.rdp_reserved, reserve) and state["release"] == rel
    assert summary["epsilon"] == pytest.approx(rdp_to_epsilon(ledger.rdp + reserve, 1e-5, ORDERS))
    assert summary["epsilon"] > rdp_to_epsilon(ledger.rdp, 1e-5, ORDERS) + 0.01
    assert summary["epsilon"] <= 8.0 + 1e-9
    assert "released data-dependent epsilon" in (run / "train.log").read_text()
    monkeypatch.setattr(
        pate_run, "release_data_dependent", lambda *a: pytest.fail("released twice")
    )
    assert run_pate(OmegaConf.load(run / "config.yaml"), run, True)["release"] == rel


def _pools(n: int = 120, seed: int = 0):
    from dpsub.pate.pool import Pools

    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    return Pools(x, y, x[:10], y[:10], x[:10], y[:10], "test", 3, (1, 8, 8), "tiny")


def test_votes_are_named_by_their_settings_and_data_under_the_folders_key(tmp_path):
    """Review 2026-11-29: the votes cache was keyed by the config alone (another data.root,
    features or held-out draw read another run's votes), and a killed run resumed under an
    edited config.yaml trained its remaining teachers on another partition beside the
    saved ones (one example in two teachers). Now the name of the votes and of a run's
    chunks covers the settings and a keyed hash of the teachers' data."""
    cfg, pate = pate_run.split(_cfg())
    name = pate_run.votes_name(cfg, pate, _pools(), tmp_path)
    assert name == pate_run.votes_name(cfg, pate, _pools(), tmp_path)
    assert name != pate_run.votes_name(cfg, pate, _pools(seed=1), tmp_path)  # other data
    assert name != pate_run.votes_name(cfg, pate, _pools(119), tmp_path)  # one example fewer
    for over in ("pate.teachers=12", "features=scatternet", "seed=1"):
        other, opts = pate_run.split(_cfg(over))
        assert name != pate_run.votes_name(other, opts, _pools(), tmp_path), over
    queries = dataclasses.replace(_pools(), public_x=_pools().public_x + 1.0)  # other queries
    assert name != pate_run.votes_name(cfg, pate, queries, tmp_path)
    lite, opts = pate_run.split(_cfg("features=scatternet"))
    moved, opts2 = pate_run.split(_cfg("features=scatternet", "features.cache_dir=/elsewhere"))
    assert pate_run.votes_key(lite, opts) == pate_run.votes_key(moved, opts2)  # where, not which
    other, opts = pate_run.split(_cfg("pate.sigma2=5.0", "privacy.epsilon=9"))
    assert name == pate_run.votes_name(other, opts, _pools(), tmp_path)  # shared across budgets
    assert name != pate_run.votes_name(cfg, pate, _pools(), tmp_path / "elsewhere")  # own key
    assert name not in pate_run.votes_key(cfg, pate)


def test_teachers_with_a_shared_teacher_seed_are_the_same_without_the_cache(tmp_path, monkeypatch):
    """The held-out examples are drawn with pate.teacher_seed: the teachers (and the votes)
    of two seeds then agree whether or not a cache held them (review: 238 of 300 validation
    examples of seed 1 had trained seed 0's cached teachers)."""
    got = []
    real = pate_run.compute_votes
    monkeypatch.setattr(pate_run, "compute_votes", lambda *a: got.append(a[2].train_x) or real(*a))
    for seed in (0, 1):
        run_pate(_cfg(f"seed={seed}", "pate.teacher_seed=0", "pate.holdout=300", *QUICK),
                 tmp_path / f"s{seed}")  # fmt: skip
    assert len(got) == 2 and torch.equal(got[0], got[1])
    assert np.array_equal(*(np.load(tmp_path / f"s{s}" / pate_run.VOTES) for s in (0, 1)))


def test_a_kill_between_the_curve_and_the_state_resumes_the_states_curve(tmp_path):
    """The private curve is written before the state: after a kill between the two, the
    state on disk still says the earlier count, and the curve read back is the one saved
    with it (it was read as the later one: the data-dependent epsilon counted queries twice)."""
    state = tmp_path / pate_run.STATE
    pate_run._save_curve(tmp_path, 10, [1.0, 2.0])
    state.write_text(json.dumps({"next": 10}))
    pate_run._save_curve(tmp_path, 15, [1.5, 3.0])  # killed before the state said 15
    assert pate_run._private_curve(tmp_path, 10) == {"rdp_data_dependent": [1.0, 2.0]}
    pate_run._save_curve(tmp_path, 15, [1.5, 3.0])  # the replay, killed at the same place
    assert pate_run._private_curve(tmp_path, 10) == {"rdp_data_dependent": [1.0, 2.0]}
    state.write_text(json.dumps({"next": 15}))
    assert pate_run._private_curve(tmp_path, 15) == {"rdp_data_dependent": [1.5, 3.0]}
    with pytest.raises(pate_run.ConfigError, match="does not belong"):
        pate_run._private_curve(tmp_path, 5)


def test_an_empty_teacher_votes_untrained_instead_of_refusing_the_run():
    """Whether the hash partition left a teacher empty depends on the private data: refusing
    the run then said so without noise (review 2026-11-29)."""
    from dpsub.pate.teachers import predict_chunk

    torch.manual_seed(0)
    x, y = torch.randn(20, 1, 8, 8), torch.randint(0, 3, (20,))

    def make():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))

    opts = TeacherOptions(epochs=2, batch_size=8, lr=0.1, chunk=2)
    empty = torch.zeros(0, dtype=torch.long)
    base, params, buffers = train_chunk(make, x, y, [torch.arange(20), empty], 0, 7, opts)
    torch.manual_seed(int(np.random.SeedSequence([7, 0x7EAC, 1]).generate_state(1)[0]))
    untrained = make()
    assert torch.equal(params["1.weight"][1], untrained[1].weight.detach())
    assert predict_chunk(base, params, buffers, x, 8).shape == (2, 20)
    cfg, pate = pate_run.split(_cfg("pate.teachers=40"))
    pools = _pools(41)
    teacher_of = pate_run.teacher_partition(pate, pools.train_x, pools.train_y, 0)
    assert np.bincount(teacher_of, minlength=40).min() == 0  # (an empty one, not refused)


def test_private_files_are_the_owners_alone(tmp_path):
    """Votes, their chunks and cache, the private curve and cached features: 0600 files in
    folders made 0700 (review: world-readable, and a public extractor tested membership)."""
    from dpsub.features.cache import _save, secret_key

    run_pate(_cfg(f"pate.votes_cache={tmp_path / 'cache'}", *QUICK), tmp_path / "run")
    files = [tmp_path / "run" / pate_run.VOTES, tmp_path / "run" / pate_run.DATA_DEPENDENT,
             *(tmp_path / "cache").glob("*.npy"), *(tmp_path / "cache").rglob("chunk*.npy")]  # fmt: skip
    folders = [tmp_path / "run" / "private", tmp_path / "cache"]
    secret_key(tmp_path / "features")
    _save(torch.zeros(3), tmp_path / "features" / "f.pt")
    files.append(tmp_path / "features" / "f.pt")
    folders.append(tmp_path / "features")
    assert len(files) >= 5
    for f in files:
        assert f.stat().st_mode & 0o077 == 0, f
    for d in folders:
        assert d.stat().st_mode & 0o077 == 0, d
    from dpsub.rundir import private_file

    left = tmp_path / "left.tmp"  # a temporary file a crash left, readable by all
    left.write_bytes(b"old")
    left.chmod(0o644)
    with private_file(left) as f:  # owner-only before the first private byte goes in
        assert left.stat().st_mode & 0o077 == 0
        f.write(b"votes")
