"""The GPU kit's cells step end to end on the CPU (tiny mode): a tuned campaign; the carry
with the real data packs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from dpsub.experiments.gpu import kit, stage
from dpsub.experiments.gpu.harvest import harvest

from helpers.gpu_kit import planned_carry


def test_carry_list_with_the_real_data_packs_fits_64_mib(tmp_path):
    """tests/integration/test_gpu_kit.py's carry, with the aux set and CIFAR-10 packed."""
    total = sum(n for _, n in planned_carry(tmp_path))
    assert total <= stage.CARRY_LIMIT, f"{total / stage.MiB:.1f} MiB would travel"


def test_tiny_kit_tunes_then_runs_the_picks_two_at_once(tmp_path, monkeypatch):
    """One command, --parallel 2: the grid's two points run together, then its two picks (a
    pick waits for the whole grid); every cell gets the cell overrides; each cell's output
    comes back. (One cell at a time: test_tiny_kit_runs_every_step_and_continues_a_cell.)"""
    monkeypatch.delenv("DPSUB_DATA", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dev, here, out = tmp_path / "dev", tmp_path / "here", tmp_path / "out"
    dev.mkdir()
    opts = kit.Options(out=out, tiny=True, root=dev, work=tmp_path / "w",
                       steps=("check", "cells"), campaigns=("rgp-head",), parallel=2,
                       cell_overrides=("grads.microbatch=8",))  # fmt: skip
    assert kit.run_kit(opts) == 0
    record = json.loads((out / "gpu_run.json").read_text())["steps"]["cells"]
    ran = record["ran"]
    assert [r["status"] for r in ran] == ["finished"] * 4, ran
    assert "samples" in record["gpu_load"]  # (no nvidia-smi here: says so)
    assert [("lr=" in r["cell"], "seed=0" in r["cell"]) for r in ran] == [(True, False)] * 2 + [
        (False, True)
    ] * 2  # the grid first, then its picks in the same command
    assert all(r["steps"] > 0 and r["ms_per_step"] > 0 and r["parallel"] == 2 for r in ran), ran
    for variant in ("tune", "tuned"):  # both started before either ended (on the "device")
        dirs = sorted((dev / "results/tables/rgp-head-cifar10/tiny").glob(f"{variant}/*"))
        began = max((d / "config.yaml").stat().st_mtime for d in dirs)
        assert len(dirs) == 2 and began < min((d / "summary.json").stat().st_mtime for d in dirs)
    harvest(out, here)
    base = here / "results/tables/rgp-head-cifar10/tiny"
    for config in base.glob("*/*/config.yaml"):
        assert "microbatch: 8" in config.read_text(), config
    assert len(list(base.glob("tune/*/summary.json"))) == 2
    assert len(list(base.glob("tuned/*,seed=0/summary.json"))) == 2
    assert not list(here.rglob("checkpoint.pt"))
    (record,) = (here / "results/gpu").iterdir()
    outputs = sorted(p.name for p in record.glob("cell-*.log"))
    assert outputs == [f"cell-{i:02d}.log" for i in range(4)]
    assert "> cell-03.log" in (record / "cells.log").read_text()


def check_out_limits(out: Path) -> None:
    """What comes back from $OUT: <= 8 files of <= 16 MiB, <= 2 folders deep, plain names."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= stage.OUT_MAX_FILES, files
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) - 1 <= stage.OUT_MAX_DEPTH, rel
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts), rel
        assert p.stat().st_size <= stage.OUT_MAX_FILE, rel


def tiny(out: Path, root: Path, work: Path, **kw) -> int:
    """The kit's tiny mode in this process (the CLI itself: test_bad_setup_...)."""
    return kit.run_kit(kit.Options(out=out, tiny=True, root=root, work=work, max_cells=1, **kw))


def test_tiny_kit_runs_every_step_and_continues_a_cell(tmp_path, monkeypatch):
    """Command 1 on "machine 1" stops its cell at a checkpoint; the harvest here keeps it in
    .gpu/cells; command 2 on a fresh "machine 2" (this checkout's .gpu/ carried) finishes it."""
    monkeypatch.delenv("DPSUB_DATA", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    here, dev1, dev2 = tmp_path / "here", tmp_path / "dev1", tmp_path / "dev2"
    for d in (here, dev1, dev2):
        d.mkdir()
    out1 = tmp_path / "out1"
    assert tiny(out1, dev1, tmp_path / "w1", interrupt_cells=True, campaigns=PAPER) == 0
    check_out_limits(out1)
    record = json.loads((out1 / "gpu_run.json").read_text())
    assert [record["steps"][s]["status"] for s in kit.STEPS] == ["ok"] * 4, record
    assert record["steps"]["cells"]["ran"][0]["status"] == "interrupted"
    assert "no --gep-authors" in record["steps"]["bench"]["gep_authors"]

    written = harvest(out1, here)
    # one folder per command: <start>-<device>
    (record,) = (d for d in (here / "results/gpu").iterdir() if d.is_dir())
    assert (record / "check.json").is_file() and (record / "gpu_run.log").is_file()
    assert "passed" in (record / "pytest.log").read_text()
    assert "| gep |" in (here / "results/bench/cpu_tiny.md").read_text()
    carried = list((here / ".gpu/cells").rglob("checkpoint.pt"))
    assert len(carried) == 1 and "in progress" in " ".join(written)
    assert not (here / "results" / "tables").exists()
    cell_dir = carried[0].parent.relative_to(here / ".gpu/cells")
    assert "mechanism=dpsgd,epsilon=8,seed=0" in str(cell_dir)

    # the next command's machine is a fresh checkout: .gpu/ (ignored) is gone, the parked tar
    # (committed) brings the cell back
    fresh = tmp_path / "fresh"
    (fresh / stage.PARKED).parent.mkdir(parents=True)
    shutil.copy2(here / stage.PARKED, fresh / stage.PARKED)
    assert stage.unpark_cells(fresh) and any("parked 1 cell" in line for line in written)
    shutil.copytree(fresh / ".gpu", dev2 / ".gpu")  # what travels with the next command
    out2 = tmp_path / "out2"
    assert tiny(out2, dev2, tmp_path / "w2", steps=("cells",), campaigns=PAPER) == 0
    ran = json.loads((out2 / "gpu_run.json").read_text())["steps"]["cells"]["ran"]
    assert [{k: r[k] for k in ("cell", "status", "restored")} for r in ran] == [
        {"cell": cell_dir.name, "status": "finished", "restored": True}
    ]
    harvest(out2, here)
    device = kit.device_name().replace(" (", "-").replace("_", "-").rstrip(")")
    records = [d for d in (here / "results/gpu").iterdir() if d.is_dir()]
    assert records and all(d.name.endswith(device) for d in records), device
    done = here / cell_dir
    summary = json.loads((done / "summary.json").read_text())
    assert summary["steps"] == summary["planned_steps"] and not summary["stopped_by_budget"]
    assert not (done / "checkpoint.pt").exists() and not (here / ".gpu/cells" / cell_dir).exists()
    assert not (here / stage.PARKED).exists()  # nothing in progress: the parked tar is gone
    assert "final:" in (done / "train.log").read_text()


PAPER = ("gep1-cifar10-paper",)  # the campaign of GEP Table 1 CIFAR-10, paper setting
