"""reproduce.py + make_table.py on tiny real runs (slow): the grid, its picks, resuming a
campaign, rendering beside the paper, and the dry run's cost."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from dpsub.experiments import stats, tables

from conftest import compose_cfg
from helpers.tables import SCRIPTS, TINY, check_cells, script

TABLES = tables.table_names()


def test_reproduce_runs_the_grid_then_the_tuned_picks(tiny):
    tmp, spec, args, proc = tiny
    base = tmp / "runs" / "tiny" / "tiny"
    names = {p.name for p in (base / "paper").iterdir()}
    assert names == {f"mechanism={m},epsilon=2,seed={s}" for m in ("dpsgd", "gep") for s in (0, 1)}
    assert len(list((base / "tune").glob("*/summary.json"))) == 4
    picks = json.loads((base / "tune" / "picks.json").read_text())
    for cid, pick in picks.items():
        grid = pick["grid"]
        assert pick["validation_accuracy"] == max(grid.values())
        for seed in (0, 1):
            run = base / "tuned" / f"{cid},seed={seed}"
            assert json.loads((run / "summary.json").read_text())["steps"] == 2
            cfg = (run / "config.yaml").read_text()
            assert f"lr: {pick['lr']}" in cfg and "validation_size: null" in cfg
    summary = json.loads(
        (base / "paper" / "mechanism=dpsgd,epsilon=2,seed=0" / "summary.json").read_text()
    )
    assert summary["epsilon"] <= 2.0 and "test_accuracy" in summary


def test_reproduce_skips_finished_jobs_and_reuses_identical_ones(tiny):
    tmp, spec, args, _ = tiny
    again = script("reproduce", *args, cwd=tmp)
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stdout.splitlines() if line.startswith("phase")]
    assert lines[0].endswith(": 8 jobs, 8 finished or reused, 0 to run")  # paper + tuning grid
    assert lines[1].endswith(": 4 jobs, 4 finished or reused, 0 to run")  # tuned picks
    # a tuned pick equal to the paper's hyper-parameters (demo: lr 1.0) is the same run: a link
    base = tmp / "runs" / "tiny" / "tiny"
    picks = json.loads((base / "tune" / "picks.json").read_text())
    for cid, pick in picks.items():
        link = base / "tuned" / f"{cid},seed=0"
        assert link.is_symlink() == (pick["lr"] == 1.0)


def test_private_tune_searches_each_cell_and_seed_and_make_table_renders_them(tmp_path):
    """Real dpsub-select searches over the tiny table's tuning grid: one per cell and seed,
    each keeping its record and the kept run's small files, none left half way; a second
    command skips them; the rendered table shows their rows with the searches' epsilon."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    args = (spec, "--setting", "tiny", "--out", tmp_path / "runs", "--private-tune",
            "--skip-paper", "--select-mean", "2", "--select-sigma", "5", "--only",
            "mechanism=dpsgd", "train.progress=false")  # fmt: skip
    proc = script("reproduce", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    base = tmp_path / "runs" / "tiny" / "tiny" / "private"
    for seed in (0, 1):
        d = base / f"mechanism=dpsgd,epsilon=2,seed={seed}"
        record = json.loads((d / "selection.json").read_text())
        assert record["epsilon"] > record["epsilon_of_each_run"] > 0
        assert not (d / ".search").exists() and (d / "select.log").is_file()
    again = script("reproduce", *args, cwd=tmp_path)
    assert again.returncode == 0 and "private: searching" not in again.stdout, again.stdout
    made = script("make_table", spec, "--setting", "tiny", "--runs", tmp_path / "runs",
                  "--out", tmp_path / "tables", "--no-projection", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    readme = (tmp_path / "tables" / "tiny" / "tiny" / "README.md").read_text()
    assert "Tuned privately (the choice counted)" in readme
    kept = tmp_path / "tables" / "tiny" / "tiny" / "private" / "mechanism=dpsgd,epsilon=2,seed=0"
    assert (kept / "selection.json").is_file() and not (kept / "checkpoint.pt").exists()


def test_a_campaign_stopped_midway_finishes_only_its_missing_cells(tmp_path):
    """A campaign killed after its first finished job (a work period ending); the next
    invocation trains only the jobs without a summary and leaves finished ones untouched."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    args = (spec, "--setting", "tiny", "--out", tmp_path / "runs", "logger=disabled",
            "train.progress=false")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    argv = [sys.executable, str(SCRIPTS / "reproduce.py"), *map(str, args)]
    paper = tmp_path / "runs" / "tiny" / "tiny" / "paper"
    first = subprocess.Popen(argv, cwd=tmp_path, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not list(paper.glob("*/summary.json")) and first.poll() is None:
            assert time.monotonic() < deadline, "no job finished in 10 minutes"
            time.sleep(0.1)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # the period ends: the whole campaign stops
        first.wait()
    done = {p.parent.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in paper.glob("*/summary.json")}  # fmt: skip
    assert 1 <= len(done) < 4, sorted(done)  # stopped midway: some cells left

    again = script("reproduce", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    phase = [line for line in again.stdout.splitlines() if line.startswith("phase")]
    assert phase == [f"phase 1 (paper setting): 4 jobs, {len(done)} finished or reused, "
                     f"{4 - len(done)} to run"]  # fmt: skip
    after = {p.parent.name: p for p in paper.glob("*/summary.json")}
    assert len(after) == 4 and not any((paper / n).is_symlink() for n in after)
    for name, (mtime, content) in done.items():  # the finished cells were not trained again
        assert (after[name].stat().st_mtime_ns, after[name].read_bytes()) == (mtime, content)
    newest_done = max(mtime for mtime, _ in done.values())
    assert all(after[n].stat().st_mtime_ns > newest_done for n in set(after) - set(done))
    third = script("reproduce", *args, cwd=tmp_path)
    assert "4 jobs, 4 finished or reused, 0 to run" in third.stdout, third.stdout[-2000:]


def test_make_table_renders_the_runs_beside_the_paper(tiny):
    tmp, spec, _, _ = tiny
    out = tmp / "results"
    proc = script("make_table", spec, "--setting", "tiny", "--runs", tmp / "runs", "--out", out,
                  "--note", "Runs made by the test.", cwd=tmp)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dest = out / "tiny" / "tiny"
    text = (dest / "README.md").read_text()
    base = tmp / "runs" / "tiny" / "tiny" / "paper"
    accs = [
        100
        * json.loads((base / f"mechanism=gep,epsilon=2,seed={s}" / "summary.json").read_text())[
            "test_accuracy"
        ]
        for s in (0, 1)
    ]
    s = stats.summarize(accs)
    row = next(line for line in text.splitlines() if line.startswith("| gep (paper's"))
    assert f"| {s.text()} | 60 | {s.mean - 60:+.2f} |" in row and f"[{s.lo:.2f}, {s.hi:.2f}]" in row
    assert row.rstrip(" |").endswith(("significant)", "(n/a: < 2 seeds)")) or "(p=" in row
    assert "4 tuning runs" in text and "not** included" in text
    assert "commit:" in text and "hardware:" in text and "reproduce.py" in text
    assert "> **Note.** Runs made by the test." in text
    # a re-render keeps the recorded provenance (commit, hardware, notes) instead of today's
    rec = json.loads((dest / "provenance.json").read_text())
    rec.update(commit="abc1234", hardware="the machine that made the runs")
    (dest / "provenance.json").write_text(json.dumps(rec))
    again = script("make_table", spec, "--setting", "tiny", "--runs", tmp / "runs", "--out", out,
                   "--no-projection", cwd=tmp)  # fmt: skip
    assert again.returncode == 0, again.stderr
    text2 = (dest / "README.md").read_text()
    assert "- commit: `abc1234`" in text2 and "the machine that made the runs" in text2
    assert "> **Note.** Runs made by the test." in text2 and "re-rendered" not in text2
    third = script("make_table", spec, "--setting", "tiny", "--runs", tmp / "runs", "--out", out,
                   "--no-projection", cwd=tmp)  # fmt: skip
    assert third.returncode == 0 and (dest / "README.md").read_text() == text2  # byte-identical
    assert (dest / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    assert (dest / "projection.png").read_bytes().startswith(b"\x89PNG")  # gep: public data
    proj = json.loads(
        (dest / "paper" / "mechanism=gep,epsilon=2,seed=0" / "public_projection.json").read_text()
    )
    assert 0.0 <= proj["mean_gradient"] <= 1.0 + 1e-6 and proj["n_test_examples"] > 0
    copied = dest / "paper" / "mechanism=dpsgd,epsilon=2,seed=1"
    assert sorted(p.name for p in copied.iterdir()) == [
        "config.yaml",
        "ledger.json",  # the ledger its epsilon is recomputed from
        "metrics.jsonl",
        "summary.json",
        "train.log",
    ]


def test_dry_run_prints_the_grid_and_its_cost_and_runs_nothing(tiny):
    tmp, spec, args, _ = tiny
    proc = script("reproduce", spec, "--setting", "tiny", "--out", tmp / "fresh", "--dry-run",
                  "--time", "--timing-steps", "1", "--tune", "logger=disabled", cwd=tmp)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| paper |", "| tune |"))]
    assert len(rows) == 4 + 4 and all("| todo |" in r for r in rows)
    assert "still to run" in proc.stdout and "estimate" in proc.stdout
    assert not (tmp / "fresh" / "tiny").exists()  # only the step-time cache was written


@pytest.mark.parametrize("dataset", ["mnist", "cifar10_subset"])
def test_dry_run_without_time_measures_nothing_and_says_why_a_cost_is_missing(tmp_path, dataset):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY.replace("experiment: demo", "experiment: demo\n# no data here"))
    proc = script("reproduce", spec, "--setting", "tiny", "--out", tmp_path / "out", "--dry-run",
                  f"dataset={dataset}", "data.root=" + str(tmp_path / "nodata"), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "timing" not in out.lower().replace("--time", "")  # nothing was timed
    assert f"runs go to {tmp_path / 'out' / 'tiny'}" in out and "make_table.py tiny" in out
    rows = [line for line in out.splitlines() if line.startswith("| paper |")]
    assert len(rows) == 4 and all(r.endswith("? [1] | ? |") for r in rows)
    assert "GPU column: an estimate" in out and "--gpu-speedup" in out
    reason = next(line for line in out.splitlines() if line.startswith("[1] "))
    if dataset == "mnist":  # absent, but its published size gives N and so the steps
        assert "mnist not found under data.root: N from its published size (60000" in out
        assert all("| 60000 |" in r for r in rows) and "no step time" in reason
    else:  # no published size: N and the cost are unknown, and the reason says why
        assert "not found" in reason and all(" | ? | ? | ? [1]" in r for r in rows)
    assert not (tmp_path / "out").exists()


def test_dry_run_counts_every_pick_while_some_cells_still_tune(tmp_path):
    """One cell's tuning finished (its picks are planned), the others' not: the dry run must
    still list and count every cell's picks (it once dropped all but the picked cells')."""
    t = tables.load_table("gep1-mnist")
    tune = tables.plan_jobs(t, "cpu", tmp_path, "tune")
    cell = [j for j in tune if j.cell["mechanism"] == "dpsgd"]
    for j, acc in zip(cell, itertools.cycle([0.5, 0.9, 0.6]), strict=False):
        j.dir.mkdir(parents=True)
        OmegaConf.save(compose_cfg(*j.hydra_overrides()), j.dir / "config.yaml")
        (j.dir / "summary.json").write_text(json.dumps({"validation_accuracy": acc}))
    assert list(tables.pick_best(t, tune)) == ["mechanism=dpsgd,epsilon=2"]
    proc = script("reproduce", "gep1-mnist", "--setting", "cpu", "--tune", "--skip-paper",
                  "--out", tmp_path, "--dry-run", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| tuned |")]
    assert len(rows) == 3 * 3, rows  # mechanisms x seeds
    waiting = [r for r in rows if "| after tuning |" in r]
    assert len(waiting) == 2 * 3 and not any("dpsgd" in r for r in waiting)


@pytest.mark.parametrize("name", TABLES)
def test_every_cell_composes_in_every_setting(name):
    """Each cell's experiment + overrides composes and validates (seeds change nothing else)."""
    check_cells(name, list)


def test_a_lane_runs_its_campaigns_in_order(tmp_path):
    """scripts/lanes.py with one lane: the tiny table's campaign runs to the end."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    todo = tmp_path / "lanes.yaml"
    todo.write_text(f"campaigns:\n  - {spec} --setting tiny\n")
    proc = script("lanes", "--campaigns", todo, "--lanes", "1", "--stagger", "0", "--stop-at",
                  "+20m", "--out", tmp_path / "runs", "logger=disabled", "train.progress=false",
                  cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and "lane 0: " in proc.stdout, proc.stderr[-2000:]
    assert len(list((tmp_path / "runs").rglob("summary.json"))) == 4
    assert "--stop-at +" in (tmp_path / "runs" / ".lanes" / "lane0.log").read_text()


def test_sigterm_to_the_lanes_checkpoints_the_running_job_and_ends_them(tmp_path):
    spec = tmp_path / "long.yaml"
    spec.write_text(
        TINY.replace("train.max_steps=2,", "train.max_steps=100000, train.epochs=1000,")
    )
    todo = tmp_path / "lanes.yaml"
    todo.write_text(f"campaigns:\n  - {spec} --setting tiny --only mechanism=dpsgd\n"
                    f"  - {spec} --setting tiny --only mechanism=gep\n")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    argv = [sys.executable, str(SCRIPTS / "lanes.py"), "--campaigns", str(todo), "--lanes", "1",
            "--stop-at", "+20m", "--out", str(tmp_path / "runs"), "logger=disabled",
            "train.progress=false"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    paper = tmp_path / "runs" / "long" / "tiny" / "paper"
    deadline = time.monotonic() + 300
    while not list(paper.glob("*/metrics.jsonl")):
        assert time.monotonic() < deadline and proc.poll() is None, "no job started"
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.count("lane 0: ") == 1, out  # the gep campaign never ran
    (run,) = paper.iterdir()
    assert (run / "checkpoint.pt").is_file() and not (run / "summary.json").exists()
    assert "checkpoint saved" in (tmp_path / "runs" / ".lanes" / "lane0.log").read_text()
