"""``dpsub-reproduce --private-tune``: a table's cells tuned by ``dpsub-select`` searches, the
choice counted (the searches themselves: tests/e2e/test_e2e_tables.py, slow)."""

from __future__ import annotations

import json
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from dpsub.cli.select import candidates
from dpsub.errors import ConfigError
from dpsub.experiments import private_tables, tables

from conftest import run_script_in_process
from helpers.tables import SCRIPTS, TINY, load_script


@pytest.fixture
def tiny(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    return tables.load_table(spec)


def test_one_search_per_cell_and_seed_over_the_cells_tuning_grid(tiny, tmp_path):
    searches = private_tables.plan_searches(
        tiny, "tiny", tmp_path, [], ["data.root=X", "train.progress=false", "logger.mode=online"]
    )
    assert [s.dir.relative_to(tmp_path).as_posix() for s in searches] == [
        f"tiny/tiny/private/mechanism={m},epsilon=2,seed={s}" for m in ("dpsgd", "gep")
        for s in (0, 1)
    ]  # fmt: skip
    gep = searches[2]
    assert gep.candidates == [  # the --tune grid's points, nothing chosen beforehand
        ["optim.lr=0.5", "mechanism.clip_embedding=10.0", "mechanism.clip_residual=2.0"],
        ["optim.lr=1.0", "mechanism.clip_embedding=10.0", "mechanism.clip_residual=2.0"],
    ]
    assert "dataset.validation_size=100" in gep.overrides and gep.overrides[-1] == "data.root=X"
    assert not any(o.startswith(("train.progress", "logger.mode")) for o in gep.overrides)
    cmd = private_tables.command(gep, private_tables.Law(4, 10, float("inf")))
    assert cmd[cmd.index("--seed") + 1] == "0" and cmd[cmd.index("--shape") + 1] == "inf"
    assert cmd.count("--candidate") == 2 and cmd[cmd.index("--out") + 1] == str(gep.dir)


def test_select_takes_listed_candidates_times_the_grid():
    assert candidates([], ["optim.lr=0.1 mechanism.clip=1.0", "optim.lr=0.2"]) == [
        ["optim.lr=0.1", "mechanism.clip=1.0"], ["optim.lr=0.2"],
    ]  # fmt: skip
    assert candidates(["optim.lr=0.1,0.2"], ["mechanism.clip=1.0", "mechanism.clip=2.0"]) == [
        ["optim.lr=0.1", "mechanism.clip=1.0"], ["optim.lr=0.1", "mechanism.clip=2.0"],
        ["optim.lr=0.2", "mechanism.clip=1.0"], ["optim.lr=0.2", "mechanism.clip=2.0"],
    ]  # fmt: skip
    milestones = "optim.lr=0.1 'optim.schedule.milestones=[0.5, 0.75]'"
    assert candidates([], [milestones]) == [
        ["optim.lr=0.1", "optim.schedule.milestones=[0.5, 0.75]"]
    ]
    for bad in (["optim.lr=0.1 seed=3"], ["dataset.validation_size=5"], [""], ["optim.lr"],
                ["optim.lr='0.1"], ["experiment=dpsgd_mnist_eps2"]):  # fmt: skip
        with pytest.raises(ConfigError, match="--candidate"):
            candidates([], bad)
    with pytest.raises(ConfigError, match="--grid"):
        candidates([], [])


def _finish(search, acc: float, eps: float = 2.9, mean: float = 4.0, pick="hash") -> None:
    """A finished search's record, as dpsub-select writes it for Law(4, 10)."""
    search.dir.mkdir(parents=True, exist_ok=True)
    record = {"candidate": search.candidates[0], "test_accuracy": acc, "epsilon": eps,
              "epsilon_of_each_run": 2.0, "validation_size": 100, "score_sigma": 10.0,
              "repetitions": {"mean": mean, "shape": 1.0}, "validation_pick": pick,
              "candidates": [shlex.join(c) for c in search.candidates],
              "overrides": [*search.overrides, "data.root=elsewhere"]}  # fmt: skip
    (search.dir / "selection.json").write_text(json.dumps(record))


def test_finished_searches_are_skipped_and_a_stopped_one_searched_again(
    tiny, tmp_path, monkeypatch
):
    searches = private_tables.plan_searches(tiny, "tiny", tmp_path)[:3]
    _finish(searches[0], 0.5)
    (searches[1].dir / ".search").mkdir(parents=True)  # stopped part way
    (searches[1].dir / ".search" / "leftover").write_text("x")
    ran = []

    def fake_run(cmd, **kw):
        s = next(s for s in searches if str(s.dir) == cmd[cmd.index("--out") + 1])
        assert not (s.dir / ".search").exists()  # deleted before it searches again
        ran.append(s.name)
        _finish(s, 0.4)
        return subprocess.CompletedProcess(cmd, 0, "", "[06:49:53][INFO] select: kept ...\n")

    monkeypatch.setattr(private_tables.subprocess, "run", fake_run)
    said = []
    assert private_tables.run_searches(searches, private_tables.Law(4, 10), lambda: False,
                                       said.append) == 0  # fmt: skip
    assert ran == [searches[1].name, searches[2].name]
    assert (searches[2].dir / "select.log").read_text() == "[INFO] select: kept ...\n"  # no clock
    assert any("killed part way" in line for line in said)
    ran.clear()
    private_tables.run_searches(searches, private_tables.Law(4, 10), lambda: True, said.append)
    assert ran == []
    # --fit: a search expected to end after the deadline is not started; the next one may be
    more = private_tables.plan_searches(tiny, "tiny", tmp_path)[3:]
    searches += more
    private_tables.run_searches(more, private_tables.Law(4, 10), lambda: False, said.append,
                                fits=lambda s: False)  # fmt: skip
    assert ran == [] and "not started" in said[-1]


def test_the_private_rows_show_the_search_cost_and_the_uncounted_comparison(tiny, tmp_path):
    searches = private_tables.plan_searches(tiny, "tiny", tmp_path)
    for s, acc in zip(searches, (0.50, 0.54, 0.60, 0.62), strict=True):
        _finish(s, acc)
    found = private_tables.collect(searches)
    assert sorted(found) == ["mechanism=dpsgd,epsilon=2", "mechanism=gep,epsilon=2"]
    text = "\n".join(private_tables.lines(tiny, found, lambda c: [55.0, 57.0], "tiny"))
    assert "the choice counted" in text and "epsilon of the search" in text
    assert "| 52.00 ± 2.83" in text and "| 2.000 | 2.900 |" in text  # a run's, the search's
    assert "not significant" in text  # against the uncounted picks
    dest = tmp_path / "committed"
    private_tables.copy(searches, dest)
    assert (dest / "private" / searches[0].name / "selection.json").is_file()


def test_make_table_renders_the_private_rows(tiny, tmp_path):
    make_table = load_script("make_table")
    for s, acc in zip(private_tables.plan_searches(tiny, "tiny", tmp_path / "runs"),
                      (0.50, 0.54, 0.60, 0.62), strict=True):  # fmt: skip
        _finish(s, acc)
    args = SimpleNamespace(setting="tiny", extra=[], runs=tmp_path / "runs")
    found = make_table.collect(tiny, args)
    assert len(found["private"]) == 2 and not found["paper"]
    assert "Tuned privately" in "\n".join(make_table.run_sections(tiny, args, found))


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--private-tune", "--tune", "--select-mean", "4", "--select-sigma", "10"], "--tune"),
        (["--private-tune", "--select-sigma", "10"], "--select-mean"),
        (["--private-tune", "--select-mean", "0.5", "--select-sigma", "10"], "--select-mean"),
        (["--private-tune", "--select-mean", "4", "--select-sigma", "0"], "--select-sigma"),
    ],
)
def test_private_tune_mistakes_are_one_line_and_exit_2(tmp_path, flags, fragment):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    proc = run_script_in_process(SCRIPTS / "reproduce.py", spec, "--setting", "tiny", *flags,
                                 "--out", tmp_path / "out", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr and not (tmp_path / "out").exists()


def test_the_dry_run_gives_each_search_its_expected_cost(tiny, tmp_path, capsys):
    """A search costs the mean number of runs x its cell's grid points' mean time."""
    reproduce = load_script("reproduce")
    searches = private_tables.plan_searches(tiny, "tiny", tmp_path)[:2]
    _finish(searches[0], 0.5)
    law = private_tables.Law(4, 10)
    reproduce.private_dry_run(searches, law, {searches[0].dir: 120.0, searches[1].dir: 240.0})
    out = capsys.readouterr().out
    assert "| done | 2m00s |" in out and "| todo | 4m00s |" in out
    assert out.rstrip().endswith("still to run: 4m00s CPU")


def test_a_search_made_under_another_law_is_stale_set_aside_and_searched_again(
    tiny, tmp_path, monkeypatch
):
    """A record of mean 2 under a command of mean 4 (or other candidates, or overrides that
    change a run) is not the planned search: never counted as it, kept aside, searched again;
    a changed data.root is the same search."""
    (s,) = private_tables.plan_searches(tiny, "tiny", tmp_path)[:1]
    law = private_tables.Law(4, 10)
    _finish(s, 0.5, mean=2.0)
    assert private_tables.status(s, law) == "stale:mean"
    _finish(s, 0.5, pick="uniform")  # held out by position (before 2026-11-29): not sound
    assert private_tables.status(s, law) == "stale:held-out pick"
    _finish(s, 0.5)
    assert private_tables.status(s, law) == "done"
    s.candidates = s.candidates[:1]
    assert private_tables.status(s, law) == "stale:candidates"
    monkeypatch.setattr(
        private_tables.subprocess,
        "run",
        lambda cmd, **kw: (
            _finish(s, 0.6),
            subprocess.CompletedProcess(cmd, 0, "[INFO] select: kept\n", ""),
        )[1],
    )
    said = []
    assert private_tables.run_searches([s], law, lambda: False, said.append) == 0
    assert private_tables.status(s, law) == "done" and any("stale" in x for x in said)
    kept = list((tmp_path / "tiny" / "tiny" / ".stale" / "private").glob("*@*/selection.json"))
    assert len(kept) == 1  # nothing lost


def test_a_search_another_process_holds_is_skipped(tiny, tmp_path, monkeypatch):
    from dpsub.training.checkpoint import lock_run_dir

    (s,) = private_tables.plan_searches(tiny, "tiny", tmp_path)[:1]
    where = s.dir.parent / private_tables.LOCKS / s.name
    where.mkdir(parents=True)
    release = lock_run_dir(where, "other lane")
    monkeypatch.setattr(private_tables.subprocess, "run", lambda *a, **k: pytest.fail("ran"))
    said = []
    try:
        private_tables.run_searches([s], private_tables.Law(4, 10), lambda: False, said.append)
    finally:
        release()
    assert "another process is searching it" in said[-1] and not s.dir.exists()


def test_rows_of_searches_under_different_laws_each_name_theirs(tiny, tmp_path):
    searches = private_tables.plan_searches(tiny, "tiny", tmp_path)
    for s, mean in zip(searches, (4.0, 4.0, 2.0, 2.0), strict=True):
        _finish(s, 0.5, mean=mean)
    text = "\n".join(private_tables.lines(tiny, private_tables.collect(searches),
                                          lambda c: [], "tiny"))  # fmt: skip
    assert "each row's law below" in text
    assert "Repetitions(mean 4, shape 1)" in text and "Repetitions(mean 2, shape 1)" in text
