"""make_table: the plans of --runs and --out merged by run directory (a tuning grid can be
extended in one and not the other), and the provenance a re-render keeps."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from dpsub.experiments import make_table, tables

from helpers.tables import TINY


def _finish(job: tables.Job, accuracy: float) -> None:
    Path(job.dir).mkdir(parents=True, exist_ok=True)
    (Path(job.dir) / tables.SUMMARY).write_text(json.dumps({"validation_accuracy": accuracy}))


def _moved(job: tables.Job, src: Path, dst: Path) -> tables.Job:
    return SimpleNamespace(dir=dst / Path(job.dir).relative_to(src))


def test_plan_merges_runs_and_committed_by_directory(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY.replace("  validation_size: 100", "  validation_size: 100\n  extend: 1"))
    table = tables.load_table(spec)
    committed, runs = tmp_path / "committed", tmp_path / "runs"

    def plan(root):
        return tables.plan_jobs(table, "tiny", root, "tune")

    first = plan(committed)  # the grid: lr 0.5 / 1.0 for each mechanism
    for j in first:  # the best lr is the top one: the committed grid grows by lr 2.0
        _finish(j, 50.0 + float(j.point[0]))
    grown = plan(committed)
    assert len(grown) == len(first) + 2
    for j in grown:
        _finish(j, 50.0 + float(j.point[0]))
    _finish(_moved(first[0], committed, runs), 10.0)  # the clone re-ran one grid point only

    args = SimpleNamespace(setting="tiny", runs=runs, out=committed, extra=[])
    merged = make_table.plan(table, args, "tune")
    names = sorted(Path(j.dir).name for j in merged)
    assert names == sorted(Path(j.dir).name for j in grown)  # the extension is kept
    assert all(j.finished for j in merged)
    rerun = [j for j in merged if Path(j.dir).parent.parent.parent.parent == runs]
    assert len(rerun) == 1  # the clone's own run wins over the committed one


def test_restamp_keeps_the_recorded_notes_unless_new_ones_are_given(tmp_path):
    old = {"commit": "abc1234", "date": "2026-01-01", "hardware": "x", "notes": ["made so"]}
    (tmp_path / make_table.PROVENANCE).write_text(json.dumps(old))

    def recorded(**kw):
        return make_table.recorded(
            tmp_path, SimpleNamespace(**{"restamp": False, "note": [], **kw})
        )

    assert recorded() == old  # a re-render keeps everything
    stamped = recorded(restamp=True)
    assert stamped["commit"] != "abc1234" and stamped["notes"] == ["made so"]
    assert recorded(restamp=True, note=["new"])["notes"] == ["new"]


def test_the_hardware_line_names_where_the_runs_trained_when_not_the_renderer(tmp_path):
    """A GPU cell rendered here was listed under this CPU; runs without a record (older
    than it) count as the renderer's, so the older tables re-render byte-identically."""
    from dpsub.experiments.make_table import hardware_line
    from dpsub.rundir import SUMMARY

    def run(name: str, hw: str | None):
        d = tmp_path / name
        d.mkdir()
        (d / SUMMARY).write_text(json.dumps({"steps": 1, **({"hardware": hw} if hw else {})}))
        return type("Job", (), {"dir": d})()

    here = "EPYC, 2 cores; GPU: none; torch 2"
    cpu = {"paper": {"c": [run("a", None), run("b", here)]}, "tuned": {}, "tune": {}}
    assert hardware_line(cpu, here) == f"- hardware: {here}"
    gpu = run("g", "Xeon, 16 cores; GPU: NVIDIA H200; torch 2")
    mixed = {"paper": {"c": [run("c", None)]}, "tuned": {}, "tune": {"d": [gpu]}}
    assert hardware_line(mixed, here) == (
        "- hardware: the runs': 1 x cpu (hardware not recorded); "
        f"1 x Xeon, 16 cores; GPU: NVIDIA H200; torch 2; first rendered on {here}"
    )
    # the runs line said OMP_NUM_THREADS=1 over runs that had two threads
    from dpsub.experiments.make_table import threads_note

    assert threads_note(mixed) == threads_note(cpu) == "OMP_NUM_THREADS=1"
    one = {
        "paper": {"c": [run("e", "EPYC, 2 cores, 1 thread; GPU: none")]},
        "tuned": {},
        "tune": {},
    }
    assert threads_note(one) == "OMP_NUM_THREADS=1"
    two = {**one, "tune": {"f": [run("f", "Xeon, 2 cores, 2 threads; GPU: none")]}}
    assert threads_note(two) == "OMP_NUM_THREADS as each run's hardware entry below says"
