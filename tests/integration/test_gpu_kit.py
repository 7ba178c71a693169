"""The GPU kit without a GPU: its tiny mode end to end, the limits, staging and harvest."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsub.errors import ResumeError
from dpsub.experiments.gpu import cells, kit, stage
from dpsub.experiments.gpu.harvest import harvest
from dpsub.training.checkpoint import restore_rng, rng_state

from conftest import REPO, run_script_in_process
from helpers.gpu_kit import planned_carry

SCRIPT = REPO / "scripts" / "gpu_run.py"
PAPER = ("gep1-cifar10-paper",)  # the campaign of GEP Table 1 CIFAR-10, paper setting


def gpu_run(*args: str) -> subprocess.CompletedProcess:
    """``python scripts/gpu_run.py ARGS``, in this process (conftest.run_script_in_process)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env.pop("DPSUB_DATA", None)
    return run_script_in_process(SCRIPT, *args, env=env)


def test_bad_setup_is_one_line_and_exit_2(tmp_path):
    r = gpu_run("--harvest", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--harvest" in r.stderr
    for bad, key in ((["--parallel", "0"], "--parallel"),
                     (["--cell-overrides", "mechanism.clip=5"], "--cell-overrides")):  # fmt: skip
        r = gpu_run("--out", str(tmp_path / "o"), "--tiny", "--root", str(tmp_path / "r"), *bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and key in r.stderr, r.stderr
        assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()  # nothing written
    if not torch.cuda.is_available():  # the real (not tiny) check needs CUDA
        r = gpu_run("--out", str(tmp_path / "o"), "--steps", "check", "--root", str(tmp_path))
        assert r.returncode == 2 and "no CUDA device" in r.stderr.strip().splitlines()[-1]


def test_tiny_toy_cells_never_land_in_the_repository(tmp_path):
    """Without ``--root``, ``--tiny`` trains its toy cells in a scratch folder: a test run
    under a mutant that let a bad set-up through once wrote them beside the committed tables."""
    from dpsub.experiments import gpu_run as cli

    a = cli.parse(["--tiny", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")])
    assert cli.kit_root(a) == tmp_path / "w" / "tiny-root"
    assert cli.kit_root(cli.parse(["--out", str(tmp_path / "o")])) == cli.ROOT  # a GPU run
    assert cli.kit_root(cli.parse(["--tiny", "--root", str(tmp_path)])) == tmp_path
    assert cli.kit_root(cli.parse(["--tiny", "--harvest", str(tmp_path)])) == cli.ROOT


def test_three_cells_at_once_on_a_gpu_one_in_the_cpu_tests():
    assert kit.parallel_of(None, tiny=False) == kit.PARALLEL == 3
    assert kit.parallel_of(None, tiny=True) == 1 and kit.parallel_of(5, tiny=True) == 5


def test_every_step_fits_one_command():
    assert kit.BUDGET_S < stage.COMMAND_LIMIT_S
    assert all(b < stage.COMMAND_LIMIT_S for b in kit.BOUNDS.values())
    assert all(kit.MIN_S[s] <= kit.BOUNDS[s] for s in kit.STEPS)
    runner = cells.CellRunner(Path("."), Path("x.tar"), {}, 0.0)
    assert runner.grace_s < runner.min_cell_s < kit.BOUNDS["cells"]


def test_carry_list_fits_64_mib(tmp_path):
    """The tree, the wheels and a cell's checkpoint (with the real aux and CIFAR-10 packs,
    which take half a minute: tests/e2e/test_e2e_gpu_kit.py)."""
    total = sum(n for _, n in planned_carry(tmp_path, real_data=False))
    assert total <= stage.CARRY_LIMIT, f"{total / stage.MiB:.1f} MiB would travel"
    tracked = {str(p) for p in stage.git_files(REPO)}
    assert str(REPO / "pyproject.toml") in tracked and not any("/.gpu/" in p for p in tracked)
    ignored = subprocess.run(["git", "check-ignore", "-q", ".gpu/data/aux_packed.npz"], cwd=REPO)
    assert ignored.returncode == 0, ".gpu/ must be git-ignored, or the staging travels twice"


def committed_results(root: Path) -> None:
    """A git repository with two kept and two set-aside results folders, 700 bytes a file."""
    git = lambda *a: subprocess.run(["git", *a], cwd=root, check=True, capture_output=True)  # noqa: E731
    for f in ("results/tables/gep1-cifar10/summary.json", "results/tables/gep-a3-cifar10/b.json",
              "results/pdpsgd/a.json", "src/x.py"):  # fmt: skip
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("x" * 700)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")


def test_slim_sets_aside_committed_results_and_harvest_brings_them_back(tmp_path):
    committed_results(tmp_path)
    full = stage.carry_bytes(tmp_path, carried=())
    assert full == 4 * (512 + 1024)  # a tar: a header and the content padded to 512
    assert stage.carry_bytes(tmp_path, carried=(), slimmed=True) == 2 * (512 + 1024)
    # every folder of results/ but tables/, and the tables no GPU campaign runs
    aside = ["results/pdpsgd", "results/tables/gep-a3-cifar10"]
    assert stage.slim(tmp_path) == aside
    assert not (tmp_path / "results/pdpsgd").exists()
    assert (tmp_path / "results/tables/gep1-cifar10").is_dir()
    assert stage.carry_bytes(tmp_path, carried=()) == 2 * (512 + 1024)
    assert stage.unslim(tmp_path) == aside
    assert (tmp_path / "results/pdpsgd/a.json").read_text() == "x" * 700
    # a harvested record, not yet committed, stays: the next command can follow at once
    (tmp_path / "results/pdpsgd/new").mkdir()
    (tmp_path / "results/pdpsgd/new/record.json").write_text("r")
    assert stage.slim(tmp_path) == aside
    assert not (tmp_path / "results/pdpsgd/a.json").exists()
    assert (tmp_path / "results/pdpsgd/new/record.json").read_text() == "r"
    assert stage.carry_bytes(tmp_path, carried=()) == 2 * (512 + 1024) + 2 * 512
    assert stage.unslim(tmp_path) == aside
    (tmp_path / "results/pdpsgd/a.json").write_text("changed")
    with pytest.raises(stage.StageError, match="uncommitted"):
        stage.slim(tmp_path)


def test_harvest_then_slim_in_one_command(tmp_path):
    """``--harvest DIR --slim``: the record lands (untracked), then the tree is slim again."""
    root, out = tmp_path / "repo", tmp_path / "out"
    root.mkdir()
    committed_results(root)
    stage.slim(root)
    out.mkdir()
    (out / "gpu_run.json").write_text(json.dumps({"started": "2026-11-28T06:35", "device": "H"}))
    (out / "gpu_run.log").write_text("log")
    r = gpu_run("--harvest", str(out), "--slim", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert "set aside: results/pdpsgd" in r.stdout and "would travel" in r.stdout
    assert not (root / "results/pdpsgd/a.json").exists()
    assert (root / "results/gpu/2026-11-28T0635-h/gpu_run.log").read_text() == "log"


def test_a_re_parked_cell_does_not_stop_the_next_slim(tmp_path):
    """The parked tar (committed) is rewritten by every harvest: ``--harvest DIR --slim`` must
    still slim (a changed tracked file elsewhere is still refused)."""
    root = tmp_path / "repo"
    root.mkdir()
    cell = root / ".gpu/cells/results/tables/t/s/tune/c"
    cell.mkdir(parents=True)
    (cell / "checkpoint.pt").write_bytes(b"a")
    stage.park_cells(root)
    committed_results(root)  # commits the parked tar too
    (cell / "checkpoint.pt").write_bytes(b"b")
    stage.park_cells(root)
    assert "results/gpu" in stage.slim(root) and not (root / stage.PARKED).exists()
    stage.unslim(root)
    (root / "results/pdpsgd/a.json").write_text("changed")
    with pytest.raises(stage.StageError, match="uncommitted"):
        stage.slim(root)


def fake_jpegs(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    header = b"\xff\xd8HEADER" * 10
    files = [header + rng.bytes(int(rng.integers(5, 40))) + b"\xff\xd9" for _ in range(n)]
    blob = np.frombuffer(b"".join(files), np.uint8)
    return blob, np.cumsum([0] + [len(f) for f in files]).astype(np.int64)


def test_cifar10_pack_is_lossless(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"classes": np.array(["a", "b"])}
    for s in stage.SPLITS:
        arrays[f"{s}_jpeg"], arrays[f"{s}_offsets"] = fake_jpegs(20, rng)
        arrays[f"{s}_labels"] = rng.integers(0, 2, 20).astype(np.uint8)
    np.savez(tmp_path / "src.npz", **arrays)
    info = stage.pack_cifar10(tmp_path / "src.npz", tmp_path / "p.npz")
    assert info["prefix_bytes"] >= 70
    back = np.load(stage.unpack_cifar10(tmp_path / "p.npz", tmp_path / "u.npz"))
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    z = dict(np.load(tmp_path / "p.npz"))
    z["train_tail"] = z["train_tail"].copy()
    z["train_tail"][3] ^= 1  # one flipped bit
    np.savez(tmp_path / "bad.npz", **z)
    with pytest.raises(stage.StageError, match="SHA-256"):
        stage.unpack_cifar10(tmp_path / "bad.npz", tmp_path / "u2.npz")


def test_aux_pack_is_lossless(tmp_path):
    """The auxiliary images travel as lossless WebP; a pack whose SHA-256 disagrees is refused."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    images[:3] = np.sort(images[:3], axis=2)  # smooth ones too, which WebP predicts
    np.savez(tmp_path / "aux.npz", images=images)
    info = stage.pack_aux(tmp_path / "aux.npz", tmp_path / "p.npz")
    assert info["images"] == 6
    back = np.load(stage.unpack_aux(tmp_path / "p.npz", tmp_path / "u" / "aux.npz"))["images"]
    assert back.dtype == np.uint8 and np.array_equal(back, images)
    z = dict(np.load(tmp_path / "p.npz"))
    z["sha256"] = np.array("0" * 64)  # a pack whose images are not the ones it promises
    np.savez(tmp_path / "bad.npz", **z)
    with pytest.raises(stage.StageError, match="SHA-256"):
        stage.unpack_aux(tmp_path / "bad.npz", tmp_path / "u2.npz")


def test_stage_says_when_shared_is_missing(tmp_path):
    with pytest.raises(stage.StageError, match="shared folder"):
        stage.stage(tmp_path, tmp_path / "no-shared")


def test_queue_priority_seed0_eps8_gp_first(tmp_path):
    jobs = cells.queue(tmp_path, campaigns=PAPER)
    head = [(j.seed, j.cell["epsilon"], j.cell["mechanism"]) for j in jobs[:4]]
    assert head == [(0, 8, "dpsgd"), (0, 8, "gep"), (0, 8, "bgep"), (0, 2, "dpsgd")]
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs) and len(jobs) == 27
    assert all("paper/paper" in str(j.dir) for j in jobs)


def test_a_finished_grid_s_picks_come_before_the_tuning_still_to_run(tmp_path, monkeypatch):
    """GP's grid done, GEP's not: GP's picks first (its arm ends; GEP's tuning waits)."""
    from types import SimpleNamespace

    from dpsub.experiments import tables

    def job(mech, variant, seed=0, lr=0.1):
        cell = {"mechanism": mech, "epsilon": 2}
        return SimpleNamespace(
            cell=cell, variant=variant, seed=seed, name=f"{mech}-{variant}-{seed}-{lr}"
        )

    grid = [job("gep", "tune", lr=0.1), job("dpsgd", "tune", lr=0.5), job("gep", "tune", lr=0.2)]
    picks = [job("dpsgd", "tuned", seed=s) for s in (1, 0)]
    monkeypatch.setattr(
        tables, "plan_jobs", lambda t, s, o, v, **kw: grid if v == "tune" else picks
    )
    monkeypatch.setattr(tables, "pick_best", lambda t, jobs: {})
    names = [
        j.name for j in cells.campaign_jobs(cells.CAMPAIGNS["gep1-cifar10-sim-eps2"], tmp_path)
    ]
    assert names == ["dpsgd-tuned-0-0.1", "dpsgd-tuned-1-0.1", "dpsgd-tune-0-0.5",
                     "gep-tune-0-0.1", "gep-tune-0-0.2"]  # fmt: skip


def test_harvest_ignores_unsafe_tar_members(tmp_path):
    out, root = tmp_path / "out", tmp_path / "root"
    out.mkdir()
    with tarfile.open(out / "bench.tar", "w") as tar:
        for name in ("../evil.md", "/abs.md", "gpu_ok.md"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"ok"))
    harvest(out, root)
    assert (root / "results/bench/gpu_ok.md").is_file()
    assert not (tmp_path / "evil.md").exists() and not Path("/abs.md").exists()


def test_seeded_streams_change_device_only_from_a_clean_checkpoint():
    gens = {"noise": torch.Generator().manual_seed(2), "sampler": torch.Generator().manual_seed(3)}
    state = rng_state(gens)
    foreign = {**state, "devices": {"noise": "cuda", "sampler": "cpu"}}
    with pytest.raises(ResumeError, match="clean stop"):
        restore_rng(gens, foreign, clean=False)
    assert restore_rng(gens, foreign, clean=True, reseed="0:5") is True
    a = torch.randn(3, generator=gens["noise"])
    restore_rng(gens, foreign, clean=True, reseed="0:5")
    assert torch.equal(a, torch.randn(3, generator=gens["noise"]))  # deterministic reseed
    restore_rng(gens, foreign, clean=True, reseed="0:6")
    assert not torch.equal(a, torch.randn(3, generator=gens["noise"]))  # fresh per step
    assert restore_rng(gens, state) is False  # same device: the exact streams


class _OnDevice:
    """A saved RNG state as ``torch.load(map_location="cuda")`` returns it: not a host tensor;
    ``Generator.set_state`` refuses it ("RNG state must be a torch.ByteTensor", as the first
    GPU session's resumed cell failed)."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def cpu(self) -> torch.Tensor:
        return self.t

    def numel(self) -> int:
        return self.t.numel()


def test_streams_restore_from_a_checkpoint_loaded_onto_the_device():
    gens = {"noise": torch.Generator().manual_seed(2)}
    state = rng_state(gens)
    a = torch.randn(3, generator=gens["noise"])
    moved = {
        **state,
        "noise": _OnDevice(state["noise"]),
        "torch_cpu": _OnDevice(state["torch_cpu"]),
    }
    assert restore_rng(gens, moved) is False
    assert torch.equal(a, torch.randn(3, generator=gens["noise"]))  # the exact stream again


def test_queue_runs_gep_in_its_own_regime_first_then_the_short_campaigns(tmp_path):
    jobs = cells.queue(tmp_path)
    order = list(dict.fromkeys((j.table, j.setting) for j in jobs))
    assert order == [("gep1-cifar10", "stage0"), ("gep1-cifar10", "sim-eps2"),
                     ("gep1-cifar10", "attribution"), ("augmult-cifar10", "sim-eps8"),
                     ("augmult-cifar10", "sim-eps8-gep"), ("de2022-cifar10", "paper"),
                     ("gep1-cifar10", "paper"),
                     ("gep5-aux", "reduced"), ("gep6-anchors", "reduced"),
                     ("rgp-head-cifar10", "reduced"), ("gep-cadence", "paper"),
                     ("gep1-cifar10", "cpu-long")]  # fmt: skip
    long = [j for j in jobs if j.setting == "cpu-long"]
    assert {j.variant for j in long} == {"tune"} and len(long) == 36  # picks: after tuning
    assert {j.cell["epsilon"] for j in long} == {2, 8}
    assert all(str(j.dir).startswith(str(tmp_path / "results" / "tables")) for j in jobs)
    with pytest.raises(ValueError, match="unknown campaign"):
        cells.queue(tmp_path, campaigns=("nope",))


def finish(job, validation: float) -> None:
    job.dir.mkdir(parents=True, exist_ok=True)
    (job.dir / "summary.json").write_text(json.dumps({"validation_accuracy": validation}))


def test_a_tuned_campaign_extends_its_edge_then_queues_its_picks(tmp_path):
    """The RGP head study: a grid whose best lr is at its edge grows by one lr (x2) for that
    cell; once interior, the pick runs at every seed, with the picked lr on the test set."""

    def grid():
        return [j for j in cells.queue(tmp_path, campaigns=("rgp-head",)) if j.variant == "tune"]

    assert [j.point[0] for j in grid()] == [0.5, 1.0, 2.0] * 2
    for j in grid():
        finish(j, {0.5: 0.3, 1.0: 0.4, 2.0: 0.5}[j.point[0]])  # best at the top edge
    assert sorted({j.point[0] for j in grid()}) == [0.5, 1.0, 2.0, 4.0]
    jobs = cells.queue(tmp_path, campaigns=("rgp-head",))
    assert not [j for j in jobs if j.variant == "tuned"]  # the extension runs first
    for j in grid():
        if not j.finished:
            finish(j, 0.45)  # 4.0 is worse than 2.0: 2.0 is now interior
    jobs = cells.queue(tmp_path, campaigns=("rgp-head",))
    tuned = [j for j in jobs if j.variant == "tuned"]
    assert [(j.cell["head"], j.seed) for j in tuned] == [
        (h, s) for s in (0, 1, 2) for h in ("reparam", "full")]  # fmt: skip
    assert all("optim.lr=2.0" in j.overrides for j in tuned)
    assert not any("validation_size" in o for j in tuned for o in j.overrides)


def _cell(root: Path, name: str, ckpt_bytes: int, finished: bool = False) -> Path:
    d = root / "results/tables/t/s/tune" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    (d / "train.log").write_text("step 1\n")
    (d / cells.CKPT).write_bytes(b"\0" * ckpt_bytes)
    if finished:
        (d / cells.SUMMARY).write_text("{}")
    return d


def test_a_checkpoint_too_large_to_come_back_never_takes_finished_cells_with_it(
    tmp_path, monkeypatch
):
    """2026-11-27 on an H200: one tar held a finished GEP cell and an unfinished one's 360 MB
    checkpoint, so the tar was over 16 MiB and the finished cell was lost. Now the small files
    come back in cells.tar, and a checkpoint only in ckpt.tar, only when it fits one file."""
    monkeypatch.setattr(cells, "OUT_MAX_FILE", 16 * 1024)
    root, out = tmp_path / "dev", tmp_path / "out"
    out.mkdir()
    done = _cell(root, "mechanism=gep,lr=1,seed=1", 20_000, finished=True)
    big = _cell(root, "mechanism=gep,lr=1,seed=2", 20_000)
    small = _cell(root, "mechanism=dpsgd,lr=1,seed=2", 1_000)
    lines = []
    runner = cells.CellRunner(root, out / "cells.tar", {}, 0.0, log=lines.append)
    runner.touched = [done, big, small]
    runner.pack()
    with tarfile.open(out / "cells.tar") as tar:
        names = tar.getnames()
    assert not any(n.endswith(cells.CKPT) for n in names)
    assert any(n.endswith("seed=1/summary.json") for n in names)
    with tarfile.open(out / cells.CKPT_TAR) as tar:
        assert [Path(n).parent.name for n in tar.getnames()] == [small.name]
    assert (out / cells.CKPT_TAR).stat().st_size <= cells.OUT_MAX_FILE
    assert runner.too_big == {cells.sibling_key(big): 20_000}
    assert any("too large to come back" in line for line in lines)

    here = tmp_path / "here"
    stale = here / ".gpu/cells" / big.relative_to(root)
    stale.mkdir(parents=True)
    (stale / cells.CKPT).write_bytes(b"old")  # an earlier command's: it no longer matches
    written = harvest(out, here)
    assert (here / done.relative_to(root) / cells.SUMMARY).is_file()
    assert not (here / done.relative_to(root) / cells.CKPT).exists()
    assert (here / ".gpu/cells" / small.relative_to(root) / cells.CKPT).stat().st_size == 1_000
    assert not stale.exists()
    assert any("did not come back (it restarts)" in w for w in written)


def test_a_cell_whose_checkpoint_cannot_come_back_starts_only_if_a_sibling_fits(tmp_path):
    runner = cells.CellRunner(tmp_path, tmp_path / "cells.tar", {}, time.time() + 200.0)
    job = type("Job", (), {"dir": tmp_path / "t/s/paper/mechanism=gep,epsilon=8,seed=2"})()
    key = cells.sibling_key(job.dir)
    runner.took[key] = 265.0  # seed 1 took 265 s; 200 s are left
    assert runner.cannot_finish(job) is None  # its checkpoint could still come back
    runner.too_big[key] = 360 * stage.MiB
    assert "cannot come back" in runner.cannot_finish(job)
    runner.took[key] = 100.0
    assert runner.cannot_finish(job) is None


def test_harvest_keeps_every_command_s_record_in_its_own_folder(tmp_path):
    root = tmp_path / "root"
    for i, (started, device) in enumerate(
        [("2026-11-26T17:53:46Z", "NVIDIA H100 80GB HBM3"), ("2026-11-27T15:37:19Z", "NVIDIA H200")]
    ):
        out = tmp_path / f"out{i}"
        out.mkdir()
        # a command without the check step still names its device (the first run's did not)
        record = {"started": started, "steps": {"check": {"device": device}}}
        record = {"started": started, "device": device, "steps": {}} if i else record
        (out / "gpu_run.json").write_text(json.dumps(record))
        (out / "gpu_run.log").write_text(f"log {i}\n")
        harvest(out, root)
    logs = {p.parent.name: p.read_text() for p in (root / "results/gpu").glob("*/gpu_run.log")}
    assert logs == {
        "2026-11-26T1753-nvidia-h100-80gb-hbm3": "log 0\n",
        "2026-11-27T1537-nvidia-h200": "log 1\n",
    }


def test_harvest_never_replaces_another_finished_run_of_a_cell(tmp_path):
    """A cell a CPU lane finished (committed here) and the GPU finished too: the committed
    run stays, the GPU's is set aside in .gpu/conflicts and the harvest says so."""
    root, out, here = tmp_path / "dev", tmp_path / "out", tmp_path / "here"
    out.mkdir()
    gpu = _cell(root, "mechanism=gep,lr=1,seed=0", 10, finished=True)
    (gpu / cells.SUMMARY).write_text('{"test_accuracy": 0.5}')
    runner = cells.CellRunner(root, out / "cells.tar", {}, 0.0)
    runner.touched = [gpu]
    runner.pack()
    rel = gpu.relative_to(root)
    (here / rel).mkdir(parents=True)
    (here / rel / cells.SUMMARY).write_text('{"test_accuracy": 0.4}')  # the CPU lane's
    written = cells.harvest_cells(out / "cells.tar", here)
    assert json.loads((here / rel / cells.SUMMARY).read_text()) == {"test_accuracy": 0.4}
    aside = here / ".gpu/conflicts" / rel / cells.SUMMARY
    assert json.loads(aside.read_text()) == {"test_accuracy": 0.5}
    assert "another finished run" in written[0]
    (here / rel / cells.SUMMARY).write_text('{"test_accuracy": 0.5}')  # the same run: no clash
    assert cells.harvest_cells(out / "cells.tar", here)[0].startswith("finished:")


def test_cells_in_progress_are_parked_in_a_tracked_tar_and_come_back(tmp_path):
    """.gpu/ is ignored and dies with its machine: --harvest parks the cells in progress in
    results/gpu/cells_in_progress.tar (committed), --stage on a fresh checkout brings them
    back (never over a newer file); no cell left removes the tar; a full checkpoint is refused."""
    here, fresh = tmp_path / "here", tmp_path / "fresh"
    cell = here / ".gpu/cells/results/tables/t/s/tune/mechanism=gep,lr=1"
    cell.mkdir(parents=True)
    (cell / "checkpoint.pt").write_bytes(b"light" * 100)
    (cell / "train.log").write_text("step 10/20\n")
    assert "parked 1 cell(s)" in stage.park_cells(here)
    first = (here / stage.PARKED).read_bytes()
    assert stage.park_cells(here) and (here / stage.PARKED).read_bytes() == first  # reproducible
    (fresh / stage.PARKED).parent.mkdir(parents=True)
    (fresh / stage.PARKED).write_bytes(first)
    back = fresh / ".gpu/cells" / cell.relative_to(here / ".gpu/cells")
    back.mkdir(parents=True)
    (back / "train.log").write_text("newer\n")
    assert len(stage.unpark_cells(fresh)) == 1
    assert (back / "checkpoint.pt").read_bytes() == b"light" * 100
    assert (back / "train.log").read_text() == "newer\n"
    (cell / "checkpoint.pt").write_bytes(b"0" * (stage.OUT_MAX_FILE + 1))
    with pytest.raises(stage.StageError, match="not a light checkpoint"):
        stage.park_cells(here)
    assert (here / stage.PARKED).read_bytes() == first
    shutil.rmtree(here / ".gpu/cells")
    assert "removed" in stage.park_cells(here) and not (here / stage.PARKED).exists()


def test_a_cell_s_gpu_overrides_are_keys_a_resume_may_change():
    """A cell finished or parked on a GPU must be the same job to a CPU harness: each key the
    kit may add (grads.microbatch=auto, ...) is one a resume may change, so it is neither
    refused on resume nor set aside as stale (which happened to two finished cells)."""
    from dpsub.training.checkpoint import may_change

    assert all(may_change(k) for k in cells.CELL_OVERRIDE_KEYS)
    for o in cells.check_cell_overrides(kit.Options(out=Path(".")).cell_overrides):
        assert may_change(o.split("=", 1)[0])
