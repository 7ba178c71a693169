"""One process per run dir (a lock), and the secure ledger on disk before a release leaves."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from itertools import pairwise

import numpy as np
import pytest
import torch
import torch.optim.optimizer as optim_hooks
from omegaconf import OmegaConf

from dpsub.errors import ConfigError, ResumeError
from dpsub.training.checkpoint import lock_run_dir
from dpsub.training.loop import train

from conftest import REPO, SYNTH, compose_cfg

fcntl = pytest.importorskip("fcntl")  # the lock is POSIX (skipped where it does not exist)


def test_the_lock_is_held_until_released_and_names_its_holder(tmp_path):
    release = lock_run_dir(tmp_path, "out_dir")
    probe = (
        "import sys; from dpsub.training.checkpoint import lock_run_dir\n"
        "try:\n    lock_run_dir(sys.argv[1], 'resume')\nexcept Exception as e:\n"
        "    print(e); sys.exit(2)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2 and f"pid {os.getpid()}" in proc.stdout
    release()
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_secure_ledger_is_fsynced_before_each_release_leaves_the_step(tmp_path, monkeypatch):
    """Before the optimizer applies a release, ledger.json counts it and is on disk: the file
    fsynced, renamed, the directory fsynced (a crash or power loss cannot lose the step)."""
    synced = {"file": 0, "dir": 0}
    real_fsync = os.fsync

    def fsync(fd):
        synced["dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"] += 1
        real_fsync(fd)

    seen = []

    def before_update(optimizer, args, kwargs):
        ledger = json.loads((tmp_path / "ledger.json").read_text())
        seen.append((sum(n for *_, n in ledger["history"]), dict(synced)))

    monkeypatch.setattr(os, "fsync", fsync)
    handle = optim_hooks.register_optimizer_step_pre_hook(before_update)
    try:
        train(compose_cfg(*SYNTH, "train.max_steps=3", "privacy.rng=secure"), tmp_path)
    finally:
        handle.remove()
    assert [steps for steps, _ in seen] == [1, 2, 3]
    for kind in ("file", "dir"):
        counts = [c[kind] for _, c in seen]
        assert all(b > a for a, b in pairwise([0, *counts])), (kind, counts)


def test_a_process_refused_an_out_dir_made_by_another_never_removes_it(tmp_path, monkeypatch):
    """Two processes racing for one new out_dir: the one that did not make the dir (here it
    looked before the other made it and finished a run in it) is refused and deletes nothing."""
    run_dir = tmp_path / "run"
    cfg = compose_cfg(*SYNTH, "train.max_steps=2")
    train(cfg, run_dir)  # the other process's finished run
    before = sorted(p.name for p in run_dir.iterdir())
    real_exists = type(run_dir).exists
    monkeypatch.setattr(
        type(run_dir), "exists", lambda p: False if p == run_dir else real_exists(p)
    )  # the loser's view from before the winner made the dir
    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg, run_dir)
    monkeypatch.undo()
    assert sorted(p.name for p in run_dir.iterdir()) == before


class Killed(BaseException):
    """A kill -9 between two releases: nothing of the run's own handling runs."""


def kill_after(steps: int):
    """An optimizer hook that kills the run once ``steps`` releases were applied."""
    seen = []

    def hook(optimizer, args, kwargs):
        seen.append(1)
        if len(seen) > steps:
            raise Killed

    return optim_hooks.register_optimizer_step_pre_hook(hook)


def killed_after(steps: int, *train_args, **train_kw) -> None:
    """``train(...)`` killed (kill -9) once ``steps`` releases were applied."""
    handle = kill_after(steps)
    try:
        with pytest.raises(Killed):
            train(*train_args, **train_kw)
    finally:
        handle.remove()


def counted(run_dir) -> int:
    return sum(n for *_, n in json.loads((run_dir / "ledger.json").read_text())["history"])


def test_a_secure_run_killed_before_its_first_checkpoint_is_never_started_again_as_new(tmp_path):
    """Issue 36.2: the same command in the same out_dir started afresh, its ledger forgot the
    killed attempt's releases (fresh secret noise) and its summary said covered_by_epsilon."""
    cfg = compose_cfg(*SYNTH, "train.max_steps=6", "train.checkpoint_every=0", "privacy.rng=secure")
    run_dir = tmp_path / "run"
    killed_after(3, cfg, run_dir)
    step = torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"]["step"]
    assert step == 0 and counted(run_dir) == 4  # the step-0 checkpoint; 4 released
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=f"out_dir: {run_dir} already holds a run; continue it with resume={run_dir}"):  # fmt: skip
        train(cfg, run_dir)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    # resume= continues it from step 0, its ledger still counting the killed attempt's steps
    res = train(cfg, run_dir, resume=True)
    assert counted(run_dir) == 4 + res.steps and res.stopped_by_budget  # 6 were planned
    assert res.epsilon <= cfg.privacy.epsilon
    assert "4 steps ran after the checkpoint" in (run_dir / "train.log").read_text()


def test_a_seeded_run_killed_before_its_first_checkpoint_resumes_by_replay_from_step_0(tmp_path):
    """Seeded mode: resume= continues it from step 0 with the same batches and noise, so the
    run, its ledger and its metrics equal an uninterrupted run's (each release counted once)."""
    cfg = compose_cfg(*SYNTH, "train.max_steps=4", "train.checkpoint_every=0", "train.log_every=1")
    killed_after(2, cfg, tmp_path / "killed")
    with pytest.raises(ConfigError, match="resume="):
        train(cfg, tmp_path / "killed")
    got = train(cfg, tmp_path / "killed", resume=True)
    want = train(cfg, tmp_path / "whole")
    assert (got.steps, got.epsilon, got.test_accuracy) == (
        want.steps,
        want.epsilon,
        want.test_accuracy,
    )
    assert counted(tmp_path / "killed") == 4
    lines = [(tmp_path / d / "metrics.jsonl").read_text() for d in ("killed", "whole")]
    assert lines[0] == lines[1]  # the killed attempt's lines were replaced, not kept beside


@pytest.mark.parametrize("change", ["data", "config.yaml"])
def test_a_seeded_run_killed_before_its_first_checkpoint_refuses_other_data_or_config(
    tmp_path, change
):
    """Its step-0 checkpoint holds the config and the keyed data fingerprint: the replay's
    seeded noise on one more example (or another noise multiplier written into config.yaml)
    would have released the difference of two sums (review, 2026-11-29)."""
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    x, y = rng.integers(0, 256, (201, 8, 8), dtype=np.uint8), rng.integers(0, 3, 201)
    np.savez(data, x_train=x[:200], y_train=y[:200], x_test=x[:20], y_test=y[:20])
    cfg = compose_cfg("dataset=npz", f"dataset.path={data}", "dataset.num_classes=3", "model=mlp",
                      *SYNTH[3:], "train.max_steps=4", "train.checkpoint_every=0")  # fmt: skip
    run_dir = tmp_path / "run"
    killed_after(2, cfg, run_dir)
    if change == "data":
        np.savez(data, x_train=x, y_train=y, x_test=x[:20], y_test=y[:20])
        match = "fingerprint"
    else:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        cfg.privacy.noise_multiplier = 0.5
        OmegaConf.save(cfg, run_dir / "config.yaml")
        match = "privacy.noise_multiplier"
    with pytest.raises(ResumeError, match=match):
        train(cfg, run_dir, resume=True)


def test_ctrl_c_before_the_first_step_leaves_no_run_dir(tmp_path, monkeypatch):
    """Ctrl-C while a run sets up (issue 36): nothing half-written is left behind."""
    from dpsub.training import loop as trainer

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_start_or_resume", interrupted)  # the run dir exists by then
    with pytest.raises(KeyboardInterrupt):
        train(compose_cfg(*SYNTH, "train.max_steps=2"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["dpsub.cli.train", "dpsub.cli.audit", "dpsub.cli.pate"])
def test_ctrl_c_is_one_line_and_exit_130(command, monkeypatch, capsys):
    """A 77-line traceback before (issue 36); the end-to-end SIGINT is tests/e2e."""
    import importlib

    module = importlib.import_module(command)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "main", interrupted)
    monkeypatch.setattr(sys, "argv", [command, "seed=1"])
    with pytest.raises(SystemExit) as e:
        module.cli()
    assert e.value.code == 130
    assert capsys.readouterr().err == "dpsub: interrupted (Ctrl-C)\n"


def test_the_start_up_says_what_takes_the_time(tmp_path, caplog):
    """Seconds of silence after the plan line (issue 36): each slow part of the set-up is named."""
    import logging

    with caplog.at_level(logging.INFO, logger="dpsub"):
        train(compose_cfg(*SYNTH, "train.max_steps=1"), tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records]
    setup = [line for line in lines if line.startswith("setup: ")]
    assert [line.split()[1] for line in setup] == ["loading", "building", "the"], setup
    assert lines.index(setup[-1]) < next(i for i, t in enumerate(lines) if t.startswith("dataset "))


def test_a_resumed_run_s_step_lines_show_the_last_evaluated_accuracy(tmp_path, monkeypatch, caplog):
    """After a resume the step lines read ``test acc -`` until the next evaluation (issue 36):
    they show the accuracy the resumed metrics last evaluated."""
    import json
    import logging

    from dpsub.training import loop as trainer

    def stop_at_3(run, stop):
        stop.signum = signal.SIGTERM
        return run.step == 3

    cfg = compose_cfg(*SYNTH, "train.max_steps=4", "train.eval_every=2", "train.log_every=1")
    monkeypatch.setattr(trainer, "_stop_requested", stop_at_3)
    with pytest.raises(SystemExit):
        train(cfg, tmp_path / "run")
    monkeypatch.undo()
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    acc = next(m["test/accuracy"] for m in evals if "test/accuracy" in m and m["step"] == 2)
    with caplog.at_level(logging.INFO, logger="dpsub"):
        train(cfg, tmp_path / "run", resume=True)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 4/4")]
    assert line.endswith(f"test acc {100 * acc:.2f}%"), line


def test_a_secure_resume_without_its_ledger_journal_is_refused(tmp_path):
    """The journal (ledger.json, written before every release) is a secure run's only record
    of the steps after its checkpoint: resuming without it, or with an older one, would
    charge those releases nowhere."""
    cfg = compose_cfg(*SYNTH, "train.max_steps=6", "train.checkpoint_every=2", "privacy.rng=secure")
    run_dir = tmp_path / "run"
    killed_after(5, cfg, run_dir)
    journal = (run_dir / "ledger.json").read_bytes()
    (run_dir / "ledger.json").unlink()
    with pytest.raises(ConfigError, match="ledger.json is missing or counts fewer steps"):
        train(cfg, run_dir, resume=True)
    (run_dir / "ledger.json").write_bytes(journal)
    res = train(cfg, run_dir, resume=True)
    assert counted(run_dir) == 6 + res.steps - 4  # the journal's 6, then the steps from 4 again


def test_a_resume_that_reseeds_checkpoints_the_new_streams_before_its_first_step(
    tmp_path, monkeypatch
):
    """A clean checkpoint moved to another device type: the streams are reseeded. A checkpoint
    of the new streams is written before any step, so a crash there cannot send the old
    device's checkpoint (other noise for the same steps) back into service."""
    from dpsub.training import loop as trainer

    def stop_at_2(run, stop):
        stop.signum = signal.SIGTERM
        return run.step == 2

    cfg = compose_cfg(*SYNTH, "train.max_steps=4", "train.checkpoint_every=0")
    run_dir = tmp_path / "run"
    monkeypatch.setattr(trainer, "_stop_requested", stop_at_2)
    with pytest.raises(SystemExit):
        train(cfg, run_dir)
    monkeypatch.undo()
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["state"]["clean"]
    devices = ckpt["state"]["rng"]["devices"]
    ckpt["state"]["rng"]["devices"] = dict.fromkeys(devices, "cuda")  # drawn on another type
    torch.save(ckpt, run_dir / "checkpoint.pt")
    killed_after(0, cfg, run_dir, resume=True)  # killed at its first release after the resume
    now = torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"]
    assert now["step"] == 2 and not now["clean"] and now["rng"]["devices"] == devices
