"""The GPU kit's cells step end to end on the CPU (tiny mode): a tuned campaign."""

from __future__ import annotations

import json

from dpsub.gpu import kit
from dpsub.gpu.harvest import harvest


def test_tiny_kit_tunes_then_runs_the_picks_in_one_command(tmp_path, monkeypatch):
    monkeypatch.delenv("DPSUB_DATA", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dev, here, out = tmp_path / "dev", tmp_path / "here", tmp_path / "out"
    dev.mkdir()
    opts = kit.Options(out=out, tiny=True, root=dev, work=tmp_path / "w",
                       steps=("check", "cells"), campaigns=("rgp-head",))  # fmt: skip
    assert kit.run_kit(opts) == 0
    ran = json.loads((out / "gpu_run.json").read_text())["steps"]["cells"]["ran"]
    assert [r["status"] for r in ran] == ["finished"] * 4, ran
    assert [("lr=" in r["cell"], "seed=0" in r["cell"]) for r in ran] == [(True, False)] * 2 + [
        (False, True)
    ] * 2  # the grid first, then its picks in the same command
    harvest(out, here)
    base = here / "results/tables/rgp-head-cifar10/tiny"
    assert len(list(base.glob("tune/*/summary.json"))) == 2
    assert len(list(base.glob("tuned/*,seed=0/summary.json"))) == 2
    assert not list(here.rglob("checkpoint.pt"))
