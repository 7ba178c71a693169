"""Light checkpoints (training/checkpoint.py, ``light_copy``): a checkpoint written at a clean
stop may leave out the mechanism's public state (GEP's basis: 360 MB at k = 1,000 on ResNet20),
which the resumed run recomputes. Only a clean one: no step ran after it, so nothing is replayed
with a different subspace (the replayed step would add the same noise to another sum)."""

from __future__ import annotations

import json
import signal
import tarfile

import pytest
import torch

from dpsub.experiments.gpu import cells
from dpsub.experiments.gpu.harvest import harvest
from dpsub.training import loop as trainer
from dpsub.training.checkpoint import light_copy
from dpsub.training.loop import train

from conftest import SYNTH, compose_cfg

GEP = (*SYNTH, "model=linear", "mechanism=gep", "mechanism.num_bases=8", "aux=gaussian",
       "aux.num_samples=24", "privacy.epsilon=3", "optim.schedule.milestones=[]",
       "train.max_steps=4", "train.checkpoint_every=0", "mechanism.warm_start=true",
       "mechanism.subspace_every=3")  # fmt: skip


DPSGD = (*SYNTH, "model=linear", "train.max_steps=4", "train.checkpoint_every=0")


def stopped_at_2(run_dir, monkeypatch, overrides=GEP):
    """A GEP run stopped by SIGTERM after step 2: its checkpoint is clean."""

    def stop_at_2(run, stop):
        stop.signum = signal.SIGTERM
        return run.step == 2

    monkeypatch.setattr(trainer, "_stop_requested", stop_at_2)
    with pytest.raises(SystemExit):
        train(compose_cfg(*overrides), run_dir)
    monkeypatch.undo()
    return run_dir / "checkpoint.pt"


def state(path) -> dict:
    return torch.load(path, weights_only=False)["state"]


def test_a_clean_gep_checkpoint_resumes_light_with_its_epsilon_and_says_so(tmp_path, monkeypatch):
    ckpt = stopped_at_2(tmp_path / "run", monkeypatch)
    full = ckpt.stat().st_size
    assert state(ckpt)["mechanism"]["basis"] is not None
    assert light_copy(ckpt, ckpt) == ["mechanism.basis"]
    assert ckpt.stat().st_size < full / 2
    light = state(ckpt)
    assert light["mechanism"]["basis"] is None and light["dropped"] == ["mechanism.basis"]

    result = train(compose_cfg(*GEP), tmp_path / "run", resume=True)
    whole = train(compose_cfg(*GEP), tmp_path / "whole")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["light_resumes"] == [{"step": 2, "dropped": ["mechanism.basis"]}]
    assert result.epsilon == whole.epsilon  # the same steps, each counted once
    assert "light checkpoint: mechanism.basis left out" in (tmp_path / "run/train.log").read_text()
    assert "light_resumes" not in json.loads((tmp_path / "whole/summary.json").read_text())


def test_a_pdpsgd_checkpoint_resumes_light_too(tmp_path, monkeypatch):
    pdp = (*DPSGD, "mechanism=pdpsgd", "mechanism.num_bases=4", "aux=gaussian",
           "aux.num_samples=24", "mechanism.subspace_every=3")  # fmt: skip
    ckpt = stopped_at_2(tmp_path / "run", monkeypatch, pdp)
    assert light_copy(ckpt, ckpt) == ["mechanism.basis"]
    train(compose_cfg(*pdp), tmp_path / "run", resume=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["light_resumes"][0]["step"] == 2


def test_only_a_clean_checkpoint_with_public_state_is_lightened(tmp_path, monkeypatch):
    """A mid-run checkpoint may be followed by steps that a resume replays with the same noise:
    with a recomputed basis they would release the same noise on another sum."""
    ckpt = stopped_at_2(tmp_path / "run", monkeypatch)
    saved = torch.load(ckpt, weights_only=False)
    saved["state"]["clean"] = False
    torch.save(saved, ckpt)
    assert light_copy(ckpt, tmp_path / "light.pt") == []
    assert not (tmp_path / "light.pt").exists()

    dpsgd = stopped_at_2(tmp_path / "dpsgd", monkeypatch, DPSGD)
    assert light_copy(dpsgd, tmp_path / "light.pt") == []  # nothing recomputable


def test_the_gpu_kit_sends_a_checkpoint_too_large_for_one_file_light(tmp_path, monkeypatch):
    root, out, here = tmp_path / "dev", tmp_path / "out", tmp_path / "here"
    out.mkdir()
    cell = root / "results/tables/t/s/tune/mechanism=gep,lr=1"
    ckpt = stopped_at_2(cell, monkeypatch)
    full = ckpt.stat().st_size
    monkeypatch.setattr(cells, "OUT_MAX_FILE", full // 2)
    lines = []
    runner = cells.CellRunner(root, out / "cells.tar", {}, 0.0, log=lines.append)
    runner.touched = [cell]
    saved = torch.load(ckpt, weights_only=False)
    torch.save({**saved, "state": {**saved["state"], "clean": False}}, ckpt)  # mid-run
    runner.pack()
    assert not (out / cells.CKPT_TAR).exists() and runner.too_big == {}  # not yet: wait
    torch.save(saved, ckpt)  # the stop's checkpoint (SIGTERM): clean
    runner.pack()
    with tarfile.open(out / cells.CKPT_TAR) as tar:
        (member,) = tar.getmembers()
    assert member.name.endswith("mechanism=gep,lr=1/checkpoint.pt") and member.size < full // 2
    assert runner.too_big == {} and any("comes back light" in line for line in lines)

    harvest(out, here)
    carried = here / ".gpu/cells" / cell.relative_to(root) / "checkpoint.pt"
    assert state(carried)["dropped"] == ["mechanism.basis"]
    ckpt.write_bytes(carried.read_bytes())  # the next machine: the cell resumes from it
    train(compose_cfg(*GEP), cell, resume=True)
    assert json.loads((cell / "summary.json").read_text())["light_resumes"][0]["step"] == 2
