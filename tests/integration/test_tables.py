"""Paper tables (conf/paper/*.yaml): every cell composes, the grids are the papers' cells with
the papers' values, and reproduce.py + make_table.py turn tiny real runs into a table."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess

import pytest
from omegaconf import OmegaConf

from dpsub.errors import ConfigError
from dpsub.experiments import costs, tables

from conftest import REPO, compose_cfg, run_script_in_process
from helpers.tables import SCRIPTS, TINY, check_cells, load_script, one_cell_per_kind, script

PAPER_TEXT = REPO.parent / "shared" / "papers" / "gep-gradient-embedding-perturbation.txt"
needs_paper = pytest.mark.skipif(not PAPER_TEXT.is_file(), reason="the GEP paper's text not found")
TABLES = tables.table_names()


def cell_key(table: tables.Table, cell: dict) -> tuple:
    return tuple(cell[a] for a in table.axes)


# ----------------------------------------------------------------- specs
def test_the_gep_tables_are_there():
    assert {"gep1-mnist", "gep1-cifar10", "gep1-svhn", "gep5-aux", "gep6-anchors"} <= set(TABLES)
    assert {"gep-fig6-mnist", "gep-fig6-cifar10", "gep-fig6-svhn"} <= set(TABLES)


@pytest.mark.parametrize("name", TABLES)
def test_grid_is_the_papers_cells(name):
    """The grid (product of the axes) holds exactly the cells the paper reports, once each."""
    t = tables.load_table(name)
    grid = [cell_key(t, c) for c in t.cells("paper")]
    paper = [cell_key(t, e) for e in t.paper]
    if t.paper:  # (a study of this project's own, such as rgp-head-cifar10, has no values)
        assert sorted(grid, key=str) == sorted(paper, key=str)
    assert len(set(paper)) == len(paper)
    for setting in t.settings:  # a setting only restricts the grid
        assert {cell_key(t, c) for c in t.cells(setting)} <= set(grid)


@pytest.mark.parametrize("name", TABLES)
def test_one_cell_of_each_kind_composes_in_every_setting(name):
    """Each setting's experiment + overrides composes and validates, per kind of cell, a tuned
    one at its grid's last point (every cell at both ends: tests/e2e/test_e2e_tables.py)."""
    check_cells(name, one_cell_per_kind, slice(-1, None))


#: GEP paper, Section 4: epochs for epsilon 2 / 5 / 8, and delta.
GEP_EPOCHS = {"mnist": (50, 100, 200), "cifar10": (50, 100, 200), "svhn": (5, 10, 20)}
GEP_DELTA = {"mnist": 1e-5, "cifar10": 1e-5, "svhn": 1e-6}


@pytest.mark.parametrize("dataset", sorted(GEP_EPOCHS))
def test_table1_cells_run_the_papers_setting(dataset):
    t = tables.load_table(f"gep1-{dataset}")
    for cell in t.cells("paper"):
        cfg = compose_cfg(*t.overrides_of(cell, "paper"))
        assert cfg.mechanism.name == cell["mechanism"] and cfg.dataset.name == dataset
        assert cfg.privacy.epsilon == cell["epsilon"]
        assert cfg.privacy.delta == GEP_DELTA[dataset]
        assert cfg.train.epochs == GEP_EPOCHS[dataset][(2, 5, 8).index(cell["epsilon"])]
        assert (cfg.train.batch_size, cfg.optim.lr, cfg.optim.momentum) == (1000, 0.1, 0.9)
        assert cfg.optim.weight_decay == 1e-4 and list(cfg.optim.schedule.milestones) == [0.5]
        if cell["mechanism"] != "dpsgd":
            assert (cfg.aux.name, cfg.aux.num_samples) == ("natural", 2000)
            assert cfg.mechanism.clip_embedding == 10.0
        if cell["mechanism"] == "gep":
            assert cfg.mechanism.clip_residual == 2.0
        assert cfg.model.name == ("mnist_cnn" if dataset == "mnist" else "resnet20")


def test_axis_cells_set_what_they_name():
    t6 = tables.load_table("gep6-anchors")
    for cell in t6.cells("paper"):
        assert compose_cfg(*t6.overrides_of(cell, "paper")).aux.num_samples == cell["m"]
    for setting in ("cpu", "reduced"):  # the CPU settings run m / 4 anchors
        for cell in t6.cells(setting):
            cfg = compose_cfg(*t6.overrides_of(cell, setting))
            assert cfg.aux.num_samples == cell["m"] // 4
    fig = tables.load_table("gep-fig6-mnist")
    for cell in fig.cells("cpu"):
        assert compose_cfg(*fig.overrides_of(cell, "cpu")).mechanism.num_bases == cell["k"]
    t5 = tables.load_table("gep5-aux")
    names = {c["aux"]: compose_cfg(*t5.overrides_of(c, "paper")).aux for c in t5.cells("paper")}
    assert (names["cifar10_true"].name, names["cifar10_true"].labels) == ("heldout_test", "true")
    assert names["cifar10_random"].labels == "random_per_step"
    assert (
        names["cifar100_random"].name == "cifar100" and names["imagenet_random"].name == "natural"
    )


def _paper_rows(text: str, first: str, last: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    return lines[start : start + last]


@needs_paper
def test_table1_values_are_the_papers():
    """conf/paper/gep1-*.yaml hold the numbers printed in the paper's Table 1."""
    text = PAPER_TEXT.read_text()
    names = {"GP": "dpsgd", "B-GEP": "bgep", "GEP": "gep"}
    for dataset, heading in (
        ("mnist", "MNIST GP"),
        ("svhn", "SVHN GP"),
        ("cifar10", "CIFAR-10 GP"),
    ):
        t = tables.load_table(f"gep1-{dataset}")
        found = 0
        for line in _paper_rows(text, heading, 4):
            words = line.split()
            name = words[1] if words[1] == "GP" else words[0]
            if name not in names:
                continue  # PATE
            values = [float(v) for v in re.findall(r"[+-]?\d+\.\d", line)][0::2][:3]
            for eps, v in zip((2, 5, 8), values, strict=True):
                assert t.paper_cell({"mechanism": names[name], "epsilon": eps})["value"] == v
                found += 1
        assert found == 9


@needs_paper
def test_tables5_and_6_values_are_the_papers():
    text = PAPER_TEXT.read_text()
    t5 = tables.load_table("gep5-aux")
    rows = _paper_rows(text, "CIFAR10 No", 4)
    keys = ["cifar10_true", "cifar10_random", "cifar100_random", "imagenet_random"]
    for key, line in zip(keys, rows, strict=True):
        mean, std = map(float, re.findall(r"\d+\.\d+", line)[-2:])
        entry = t5.paper_cell({"mechanism": "gep", "aux": key})
        assert (entry["value"], entry["std"]) == (mean, std)
    t6 = tables.load_table("gep6-anchors")
    for mech, line in zip(("bgep", "gep"), _paper_rows(text, "B-GEP 62.2", 2), strict=True):
        pairs = list(zip(*[iter(map(float, re.findall(r"\d+\.\d+", line)))] * 2, strict=True))
        for m, (mean, std) in zip((1000, 2000, 4000), pairs, strict=True):
            entry = t6.paper_cell({"mechanism": mech, "m": m})
            assert (entry["value"], entry["std"]) == (mean, std)


def test_a_bad_table_file_names_the_key(tmp_path):
    good = (tables.tables_dir() / "gep1-mnist.yaml").read_text()
    cases = {
        "colums": good.replace("columns: epsilon", "colums: epsilon"),
        "paper[0]": good.replace(
            "{mechanism: dpsgd, epsilon: 2, value: 94.7}", "{mechanism: dpsgd}"
        ),
        "settings.cpu.axes": good.replace("axes: {epsilon: [2]}", "axes: {eps: [2]}"),
        "unknown key": good + "\nextra: 1\n",
    }
    for fragment, text in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            tables.load_table(path)


# ------------------------------------------------------------------ jobs
def test_jobs_name_their_cell_and_fold_run_changing_overrides_into_the_folder(tmp_path):
    t = tables.load_table("gep1-mnist")
    jobs = tables.plan_jobs(t, "cpu", tmp_path, "paper", extra=["train.epochs=3"])
    assert len(jobs) == 3 * 3  # mechanisms x seeds at eps 2
    j = jobs[0]
    assert j.dir == tmp_path / "gep1-mnist" / "cpu+train.epochs=3" / "paper" / (
        "mechanism=dpsgd,epsilon=2,seed=0"
    )
    cfg = compose_cfg(*j.hydra_overrides())
    assert (cfg.train.epochs, cfg.seed, cfg.out_dir) == (3, 0, str(j.dir))
    tune = tables.plan_jobs(t, "cpu", tmp_path, "tune")
    assert len(tune) == 3 * len(t.tune.lr) * 2
    assert all(compose_cfg(*x.overrides).dataset.validation_size == 5000 for x in tune[:2])


def test_pick_best_is_the_best_validation_accuracy_first_on_ties(tmp_path):
    t = tables.load_table("gep1-mnist")
    jobs = [j for j in tables.plan_jobs(t, "cpu", tmp_path, "tune") if j.cell["mechanism"] == "gep"]
    scores = [0.5, 0.9, 0.9, 0.1]
    for j, s in zip(jobs, scores, strict=True):
        j.dir.mkdir(parents=True)
        (j.dir / "summary.json").write_text(json.dumps({"validation_accuracy": s}))
    pick = tables.pick_best(t, jobs)["mechanism=gep,epsilon=2"]
    assert (pick["lr"], pick["clip"]) == jobs[1].point
    assert "dataset.validation_size=5000" not in pick["overrides"]
    assert f"optim.lr={jobs[1].point[0]}" in pick["overrides"]
    (jobs[3].dir / "summary.json").unlink()  # an unfinished grid has no pick yet
    assert tables.pick_best(t, jobs) == {}


# --------------------------------------------------------- tiny real runs


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["no-such-table"], "no-such-table"),
        (["gep1-mnist", "--setting", "gpu"], "--setting"),
        (["gep1-mnist", "--setting", "cpu", "train.epochs=-1"], "train.epochs"),
        (["gep1-mnist", "--setting", "cpu", "train.epochz=3"], "epochz"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    def run(name, *words):  # the script's module, in this process
        return run_script_in_process(SCRIPTS / f"{name}.py", *words, cwd=tmp_path)

    proc = run("reproduce", *argv, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
    if len(argv) <= 3:  # a bad table or setting (make_table takes no overrides)
        made = run("make_table", *argv, "--runs", tmp_path / "out", "--out", tmp_path / "t")
        assert made.returncode == 2 and made.stderr.count("\n") == 1, made.stderr
        assert not (tmp_path / "t").exists()


def test_timing_key_ignores_what_does_not_change_a_steps_cost():
    t = tables.load_table("gep1-mnist")
    cells = {
        c["epsilon"]: t.overrides_of(c, "paper")
        for c in t.cells("paper")
        if c["mechanism"] == "gep"
    }
    keys = {costs.timing_key(compose_cfg(*ov, f"seed={s}", f"optim.lr={lr}", "mechanism.clip_residual=0.4"))
            for ov, s, lr in itertools.product(cells.values(), (0, 1), (0.1, 1.0))}  # fmt: skip
    assert len(keys) == 1
    other = costs.timing_key(compose_cfg(*cells[2], "mechanism.num_bases=250"))
    assert other not in keys


def test_views_per_example_are_part_of_the_step_cost_key():
    """K views cost about K times a step: K = 4 must not borrow K = 1's step time (the
    augmult study's dry run once priced its K = 4 runs at K = 1's 1.17 s)."""
    one = costs.timing_key(compose_cfg("experiment=dpsgd_mnist"))
    four = costs.timing_key(compose_cfg("experiment=dpsgd_mnist", "train.augmult=4"))
    assert one != four and "augmult" not in one  # K = 1: the key committed times were made under


def test_recorded_step_times_come_from_cpu_runs_only(tmp_path):
    """A GPU run's steps_per_s is no CPU step time (sim-eps2's CPU estimate once read an H100
    run's 0.10 s a step for a 5.6 s CPU step): only runs whose summary or log says cpu count."""
    cfg = compose_cfg("experiment=dpsgd_mnist")
    key = costs.timing_key(cfg)
    for name, rate, device, where in [
        ("a", 2.0, "cpu", "summary"),
        ("b", 100.0, "cuda", "log"),
        ("c", 50.0, "cuda", "summary"),
        ("d", 4.0, None, None),
    ]:
        d = tmp_path / name
        d.mkdir()
        OmegaConf.save(cfg, d / "config.yaml")
        summary = {"steps_per_s": rate, **({"device": device} if where == "summary" else {})}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text("")
        if where == "log":
            (d / "train.log").write_text(
                f"[17:41:28][INFO] device           {device}:0 (world size 1)\n"
            )
    # a (0.5 s) and d (0.25 s: no device recorded, an old CPU run); b and c are GPU runs
    assert costs.recorded_step_times([tmp_path], {key}) == {key: pytest.approx(0.375)}
    # CPU seconds per step where recorded: a lane paused for hours (wall 1 step/s) costs 0.1 s
    (tmp_path / "d" / "summary.json").write_text(
        json.dumps({"steps_per_s": 1.0, "steps": 40, "cpu_seconds": 4.0})
    )
    assert costs.recorded_step_times([tmp_path], {key}) == {key: pytest.approx(0.3)}


def test_a_step_time_from_the_log_ignores_a_paused_window(tmp_path):
    """No cpu_seconds (a run older than it): the rate between train.log's step lines without
    the windows 5x slower than the median (4 s a step, one window 5 s; one paused for an
    hour, one across midnight), not the run average the pause inflated (a K = 4 run once
    read 10.6 s a step for ~4)."""
    cfg = compose_cfg("experiment=dpsgd_mnist")
    key = costs.timing_key(cfg)
    d = tmp_path / "run"
    d.mkdir()
    OmegaConf.save(cfg, d / "config.yaml")
    (d / "summary.json").write_text(json.dumps({"steps_per_s": 0.05, "steps": 50}))
    (d / "metrics.jsonl").write_text("")
    stamps = ["23:58:00", "23:58:40", "23:59:20", "00:00:00", "01:00:40", "01:01:30"]
    log = [f"[{t}][INFO] step {10 * (i + 1)}/50 | epsilon 1.0" for i, t in enumerate(stamps)]
    log.insert(
        3, "[00:00:01][INFO] resumed run at step 20; steps after it logged above are run again"
    )
    (d / "train.log").write_text("\n".join(log) + "\n")
    assert costs.recorded_step_times([tmp_path], {key}) == {key: pytest.approx(170 / 40)}


def test_make_table_help_stops_after_the_help_and_the_default_setting_agrees():
    """`make table ARGS=--help` prints reproduce.py's help and renders nothing (it used to fail
    in make_table.py); `make table`, reproduce.py and make_table.py share one default setting."""

    def make(*args):
        proc = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    helped = make("table", "ARGS=--help")
    assert "scripts/reproduce.py gep1-mnist --setting paper --help" in helped
    assert "make_table.py" not in helped and "make_table.py" not in make("table", "ARGS=--dry-run")
    assert "scripts/make_table.py gep1-mnist --setting paper" in make("table")
    assert "scripts/make_table.py gep1-mnist --setting cpu" in make("render", "SETTING=cpu")
    for name in ("reproduce", "make_table"):
        assert load_script(name).parse(["gep1-mnist"]).setting == "paper"


def test_the_cifar100_row_reads_the_npz_under_data_root(tmp_path):
    table = tables.load_table("gep5-aux")
    cell = {"mechanism": "gep", "aux": "cifar100_random"}
    cfg = compose_cfg(*table.overrides_of(cell, "reduced"), f"data.root={tmp_path}")
    assert cfg.aux.name == "cifar100"
    assert cfg.aux.path == f"{tmp_path}/aux/cifar100_train_first10000.npz"


def test_a_brace_that_is_not_an_axis_is_one_line(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text(
        TINY.replace('"mechanism={mechanism}"', '"mechanism={mechanism}", "x=${data.root}"')
    )
    with pytest.raises(ConfigError, match="twice"):
        tables.plan_jobs(tables.load_table(spec), "tiny", tmp_path)


def test_only_takes_a_list_of_values():
    reproduce = load_script("reproduce")
    args = reproduce.parse(["gep6-anchors", "--setting", "reduced", "--only", "m=1000,4000"])
    table = tables.load_table("gep6-anchors")
    args.extra, args.passthrough, args.tune, args.skip_paper = [], [], False, False
    jobs, _, _ = reproduce.plan(args, table)
    assert sorted({j.cell["m"] for j in jobs}) == [1000, 4000] and len(jobs) == 6


def test_make_table_takes_the_committed_runs_a_partial_outputs_tree_lacks(tmp_path):
    """`make table` on a clone re-runs or links only some jobs under outputs/tables: the render
    takes every other finished job from the committed runs (--out), so no variant drops out."""
    from types import SimpleNamespace

    make_table = load_script("make_table")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    table = tables.load_table(spec)
    outputs, committed = tmp_path / "outputs", tmp_path / "results"

    def finish(root, variant, name, **summary):
        d = tables.setting_dir(root, table, "tiny", []) / variant / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(summary))

    for m in ("dpsgd", "gep"):
        for s in (0, 1):  # the paper variant re-run (or linked) under outputs
            finish(outputs, "paper", f"mechanism={m},epsilon=2,seed={s}", test_accuracy=0.5)
        for lr, acc in ((0.5, 0.7), (1.0, 0.6)):  # tuning and picks committed only
            finish(committed, "tune", f"mechanism={m},epsilon=2,lr={lr},clip=0",
                   validation_accuracy=acc)  # fmt: skip
        finish(committed, "tuned", f"mechanism={m},epsilon=2,seed=0", test_accuracy=0.8)
    args = SimpleNamespace(setting="tiny", extra=[], runs=outputs, out=committed)
    found = make_table.collect(table, args)
    assert {v: sum(map(len, found[v].values())) for v in ("paper", "tune", "tuned")} == {
        "paper": 4, "tune": 4, "tuned": 2,
    }  # fmt: skip
    assert all(p["lr"] == 0.5 for p in found["picks"].values())
    assert all(outputs in j.dir.parents for js in found["paper"].values() for j in js)
    # without the committed root (the harness's own re-render check) only outputs count
    alone = make_table.collect(table, SimpleNamespace(setting="tiny", extra=[], runs=outputs))
    assert not alone["tune"] and not alone["tuned"] and len(alone["paper"]) == 2
    # under a table with tuned rows: the tuning statistics are not covered by epsilon
    assert "not covered by the epsilons shown" in " ".join(make_table.tuned_note(found))
    assert "not covered by any epsilon" in " ".join(make_table.tuning_lines(table, found, "tiny"))
    assert make_table.tuned_note(alone) == []


def test_a_finished_run_whose_config_moved_is_stale_set_aside_and_run_again(tmp_path):
    """A tuned pick that moved (its grid was extended) must not keep the old pick's run."""
    from omegaconf import OmegaConf

    reproduce = load_script("reproduce")
    cfg = compose_cfg("train.max_steps=2")
    d = tmp_path / "tuned" / "mechanism=dpsgd,seed=0"
    d.mkdir(parents=True)
    OmegaConf.save(cfg, d / "config.yaml", resolve=True)
    (d / "summary.json").write_text("{}")
    job = tables.Job("t", "s", "tuned", {"mechanism": "dpsgd"}, 0, [], d)
    assert reproduce.status(job, cfg, []) == "done"
    # a GPU cell runs at grads.microbatch=auto: how it computed, not what it released; a CPU
    # harness once set such cells aside as stale and would have run them again for hours
    on_gpu = compose_cfg("train.max_steps=2", "grads.microbatch=auto")
    assert reproduce.status(job, on_gpu, []) == "done"
    moved = reproduce.status(job, compose_cfg("train.max_steps=2", "optim.lr=0.7"), [])
    assert moved == "stale:optim.lr"
    states = {d: moved}
    reproduce.set_aside_stale([job], states, tmp_path)
    assert states[d] == "todo" and not d.exists()  # runs again
    kept = list((tmp_path / ".stale" / "tuned").glob("mechanism=dpsgd,seed=0@*/summary.json"))
    assert len(kept) == 1  # nothing lost


def test_a_run_made_before_a_key_existed_is_done_and_a_stale_one_shows_why(tmp_path, capsys):
    """A finished run saved before ``dataset.validation_pick`` existed (default ``balanced``,
    what it ran with) is done, not stale; the dry run names a stale run's changed keys and
    counts it as still to run (it runs again)."""
    import yaml
    from omegaconf import OmegaConf

    reproduce = load_script("reproduce")
    cfg = compose_cfg("train.max_steps=2")
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["dataset"]["validation_pick"]
    d = tmp_path / "tuned" / "mechanism=dpsgd,seed=0"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(old))
    (d / "summary.json").write_text("{}")
    job = tables.Job("t", "s", "tuned", {"mechanism": "dpsgd"}, 0, [], d)
    assert reproduce.status(job, cfg, []) == "done"
    uniform = compose_cfg("train.max_steps=2", "dataset.validation_pick=uniform")
    assert reproduce.status(job, uniform, []) == "stale:dataset.validation_pick"
    row = {"job": job, "sec": 60.0, "steps": 2, "why": "", "step_s": 30.0, "n": 10}
    reproduce.print_grid([row], {d: "stale:dataset.validation_pick"}, 0.1)
    out = capsys.readouterr().out
    assert "| stale (dataset.validation_pick) |" in out and "still to run: 1m00s CPU" in out


def test_table6_m2000_reduced_is_table5_imagenet_reduced():
    """The reduced Table 6's m = 2000 cell reuses Table 5's ImageNet row: the two configs must
    be one run (reproduce.py links a finished run whose config equals a job's)."""
    t5, t6 = tables.load_table("gep5-aux"), tables.load_table("gep6-anchors")
    a = compose_cfg(*t5.overrides_of({"mechanism": "gep", "aux": "imagenet_random"}, "reduced"))
    b = compose_cfg(*t6.overrides_of({"mechanism": "gep", "m": 2000}, "reduced"))
    assert OmegaConf.to_container(a) == OmegaConf.to_container(b)


def test_a_re_render_of_the_committed_runs_is_byte_identical_and_dry_run_writes_nothing(
    tmp_path, capsys
):
    """Re-rendering a committed table changed its README (a "re-rendered at commit" line,
    issue 36): the README is now a function of the runs and their recorded provenance, and
    ``--dry-run`` says what would be written without writing."""
    import shutil

    make_table = load_script("make_table")
    committed = REPO / "results" / "tables"
    dest = tmp_path / "gep1-mnist" / "cpu+train.epochs=10"
    shutil.copytree(committed / "gep1-mnist" / "cpu+train.epochs=10", dest)

    def files() -> dict:
        return {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    argv = ["gep1-mnist", "--setting", "cpu", "train.epochs=10", "--runs", str(committed),
            "--out", str(tmp_path), "--no-projection"]  # fmt: skip
    before = files()
    assert make_table.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run (nothing written)" in out and "README.md: unchanged" in out
    assert files() == before
    assert make_table.main(argv) == 0
    assert files() == before  # every file byte-identical: README, provenance, figure, runs


def test_dry_run_counts_n_without_extracting_features(monkeypatch):
    """A --dry-run's N (the private training set after the carve-outs) comes from the
    images: planning a frozen-features cell never starts an extraction."""
    import dpsub.features

    def refuse(*a, **k):
        raise AssertionError("a dry run extracted features")

    monkeypatch.setattr(dpsub.features, "featurize", refuse)
    cfg = compose_cfg("features=efficientnet_lite0", "dataset.validation_size=100")
    n, note = costs.train_size(cfg)
    assert note == "" and n == 1797 - 360 - 100  # digits, its test split and validation out


def test_stop_at_reads_a_clock_time_or_a_duration():
    reproduce = load_script("reproduce")
    import datetime as dt

    now = dt.datetime(2026, 11, 27, 11, 0, 30)
    assert reproduce.seconds_until("11:35", now) == 35 * 60 - 30
    assert reproduce.seconds_until("10:00", now) == 23 * 3600 - 30  # tomorrow
    assert reproduce.seconds_until("+2h30m", now) == 9000
    assert reproduce.seconds_until("+90s", now) == 90
    for bad in ("25:00", "+", "11h", "noon"):
        with pytest.raises(ConfigError, match="--stop-at"):
            reproduce.seconds_until(bad, now)


def test_the_deadline_signal_is_recorded_not_fatal_between_jobs():
    """The timer's SIGTERM reaches the process; between jobs it only stops the next one."""
    import signal
    import time

    reproduce = load_script("reproduce")
    old = signal.getsignal(signal.SIGTERM)
    timer = None
    try:
        timer = reproduce.Deadline.arm(0.05, "+0s")
        timer.join(60)  # fired (a busy machine may take a while to run the thread)
        deadline = time.monotonic() + 60
        while not reproduce.Deadline.reached and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler runs in the main thread, between bytecodes
        assert reproduce.Deadline.reached
        with pytest.raises(SystemExit, match="the same command resumes"):
            reproduce.Deadline.check()
    finally:
        if timer is not None:
            timer.cancel()  # never a SIGTERM after the handler is gone
            timer.join()
        signal.signal(signal.SIGTERM, old)
        reproduce.Deadline.reached = False


def test_a_campaign_past_its_stop_time_starts_no_job(tmp_path):
    """--stop-at already reached: exit 1 with the reason, no run trained; a bad time: exit 2."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    args = (spec, "--setting", "tiny", "--out", tmp_path / "runs", "logger=disabled")
    proc = script("reproduce", *args, "--stop-at", "+0s", cwd=tmp_path)
    assert proc.returncode == 1 and "stopped at --stop-at +0s" in proc.stderr, proc.stderr[-2000:]
    assert not list((tmp_path / "runs").rglob("summary.json"))
    bad = script("reproduce", *args, "--stop-at", "25:99", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--stop-at" in bad.stderr


def test_fit_starts_no_job_that_would_end_after_the_stop_time(tmp_path):
    """--fit: a job whose estimate (the step time its finished sibling recorded, x the margin)
    ends after --stop-at is not started and the command says so; without an estimate
    (nothing recorded) a job starts. --fit without --stop-at: exit 2."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    args = (spec, "--setting", "tiny", "--out", tmp_path / "runs", "logger=disabled",
            "train.progress=false", "--only", "mechanism=dpsgd")  # fmt: skip
    first = script("reproduce", *args, "--only", "seed=0", "--stop-at", "+1h", "--fit",
                   cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]  # unknown cost: it started
    proc = script("reproduce", *args, "--stop-at", "+1h", "--fit", "--fit-margin", "1e9",
                  cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "not started" in proc.stdout + proc.stderr and "(--fit)" in proc.stdout + proc.stderr
    done = [p.parent.name for p in (tmp_path / "runs").rglob("summary.json")]
    assert done == ["mechanism=dpsgd,epsilon=2,seed=0"]
    bad = script("reproduce", *args, "--fit", cwd=tmp_path)
    assert bad.returncode == 2 and "--fit: needs --stop-at" in bad.stderr


def test_the_deadline_fits_a_job_that_ends_before_it(monkeypatch):
    reproduce = load_script("reproduce")
    monkeypatch.setattr(reproduce.Deadline, "at", __import__("time").time() + 100)
    assert reproduce.Deadline.fits(50) and reproduce.Deadline.fits(None)
    assert reproduce.Deadline.fits(float("nan")) and not reproduce.Deadline.fits(200)


def test_the_lanes_campaigns_are_valid_reproduce_commands(tmp_path):
    """conf/lanes/cpu.yaml: every entry names a table, a setting and reproduce.py's flags."""
    lanes, reproduce = load_script("lanes"), load_script("reproduce")
    todo = lanes.campaigns(REPO / "conf" / "lanes" / "cpu.yaml")
    assert todo
    for words in todo:
        args = reproduce.parse(words)
        tables.load_table(args.table).setting(args.setting)
    bad = tmp_path / "bad.yaml"
    bad.write_text("campaigns: []\n")
    with pytest.raises(ConfigError, match="campaigns: a non-empty list"):
        lanes.campaigns(bad)
    with pytest.raises(ConfigError, match="no such file"):
        lanes.campaigns(tmp_path / "none.yaml")
    for entry, why in (("nope --setting paper", "table nope"),
                       ("gep1-cifar10 --setting nope", "no setting 'nope'"),
                       ("gep1-cifar10 --bogus", "not reproduce.py's arguments")):  # fmt: skip
        bad.write_text(f"campaigns: ['{entry}']\n")
        with pytest.raises(ConfigError, match=f"campaigns\\[0\\]: .*{why}"):
            lanes.campaigns(bad)


def test_a_resumed_job_costs_only_its_steps_left(tmp_path, capsys):
    """--dry-run (and lanes.py --plan): a run stopped at step 750 of 1,000 has a quarter left."""
    reproduce = load_script("reproduce")
    jobs = []
    for name, logged in (("a", 750), ("b", None)):
        d = tmp_path / name
        d.mkdir()
        if logged:
            (d / "metrics.jsonl").write_text(json.dumps({"step": 10}) + "\n"
                                             + json.dumps({"step": logged}) + "\n")  # fmt: skip
        jobs.append(tables.Job("t", "s", "paper", {"mechanism": "dpsgd"}, 0, [], d))
    rows = [{"job": j, "sec": 1000.0, "steps": 1000, "step_s": 1.0, "n": 10, "why": None}
            for j in jobs]  # fmt: skip
    reproduce.print_grid(rows, {jobs[0].dir: "resume", jobs[1].dir: "todo"}, 1 / 30)
    out = capsys.readouterr().out
    assert "| resume@750 |" in out and "still to run: 20m50s CPU" in out  # 250 s + 1,000 s


def test_the_lanes_plan_lists_each_campaigns_jobs_and_what_is_left(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    todo = tmp_path / "lanes.yaml"
    private = "--private-tune --skip-paper --select-mean 2 --select-sigma 5"
    todo.write_text(f"campaigns:\n  - {spec} --setting tiny\n  - {spec} --setting tiny {private}\n")
    proc = script("lanes", "--campaigns", todo, "--plan", "--out", tmp_path / "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row, searches = [line for line in proc.stdout.splitlines() if "--setting tiny" in line]
    assert "| 4 | 0 | 4 |" in row and "CPU" in row
    assert "| 4 | 0 | 4 |" in searches and "failed" not in searches  # one search a cell x seed
    bare = script("lanes", "--campaigns", todo, cwd=tmp_path)
    assert bare.returncode == 2 and "--stop-at" in bare.stderr and bare.stderr.count("\n") == 1


def test_a_lane_of_two_threads_gets_them_and_scales_the_fit(tmp_path, monkeypatch):
    """``--lanes 1 --threads 2`` (one long job on both cores): the job gets OMP_NUM_THREADS=2
    and reproduce.py the lane's --fit-margin; more lanes x threads than cores is refused."""
    import time

    from dpsub.experiments import lanes

    monkeypatch.setattr(lanes.os, "cpu_count", lambda: 2)
    argv = ["--lanes", "1", "--threads", "2", "--fit-margin", "0.45", "--stop-at", "+1h",
            "--out", str(tmp_path), "data.root=x"]  # fmt: skip
    seen = []

    class Recorder(lanes.Stop):
        def run(self, argv, nice=0, **kw):
            seen.append((argv, kw["env"]))
            return 0

    lanes.lane(0, [["t", "--setting", "s"]], lanes.parse(argv), time.time() + 3600, Recorder())
    ((job, env),) = seen
    assert env["OMP_NUM_THREADS"] == "2" and job[job.index("--fit-margin") + 1] == "0.45"
    assert "--fit" in job and job[-1] == "data.root=x"
    seen.clear()
    lanes.lane(0, [["t"]], lanes.parse(["--stop-at", "+1h", "--out", str(tmp_path)]),
               time.time() + 3600, Recorder())  # fmt: skip
    ((job, env),) = seen
    assert env["OMP_NUM_THREADS"] == "1" and "--fit-margin" not in job  # reproduce's default
    assert lanes.main(["--lanes", "2", "--threads", "2", "--stop-at", "+1h"]) == 2


def test_a_non_positive_fit_margin_is_one_line_and_exit_2(tmp_path):
    """reproduce.py --fit-margin 0 would start every job as if it cost nothing; the lanes
    check it with the same function before any lane starts."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    proc = script("reproduce", spec, "--setting", "tiny", "--out", tmp_path / "runs",
                  "--fit-margin", "0", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "--fit-margin 0.0: must be positive" in proc.stderr
    assert not (tmp_path / "runs").exists()
    lanes = script("lanes", "--stop-at", "+1h", "--fit-margin", "-1", cwd=tmp_path)
    assert (
        lanes.returncode == 2 and lanes.stderr.count("\n") == 1 and "--fit-margin" in lanes.stderr
    )


def test_finished_runs_much_slower_than_the_time_cache_win(tmp_path):
    """A --time figure from older code priced the augmult study's GEP steps at 5.8 s while its
    lanes' runs took 9.1 CPU-seconds a step: ``--fit`` must use the runs' (said once), and a
    --time figure near the runs' (or with no runs) stays."""
    said = []
    key, other = "k", "o"
    cached, recorded = {key: 5.8, other: 1.0}, {key: 9.1, other: 1.2}
    assert costs.step_time(key, cached, recorded, set(), said.append) == 9.1
    assert len(said) == 1 and "9.10" in said[0] and "5.80" in said[0]
    assert costs.step_time(other, cached, recorded, set(), said.append) == 1.0
    assert costs.step_time(key, {}, recorded, set(), said.append) == 9.1
    assert costs.step_time(key, cached, {}, set(), said.append) == 5.8
    assert math.isnan(costs.step_time(key, {}, {}, set(), said.append)) and len(said) == 1


def test_a_run_in_progress_gives_its_log_s_pace(tmp_path):
    """The augmult study's K = 4 GEP runs, checkpointed mid-way, were priced '?' although their
    train.log had 60 step lines: a run with no summary.json yet counts by its log's pace."""
    cfg = compose_cfg("experiment=dpsgd_mnist")
    key = costs.timing_key(cfg)
    d = tmp_path / "running"
    d.mkdir()
    OmegaConf.save(cfg, d / "config.yaml")
    (d / "metrics.jsonl").write_text("")
    log = [f"[10:00:{10 * i:02d}][INFO] step {5 * (i + 1)}/500 | epsilon 1.0" for i in range(4)]
    (d / "train.log").write_text("\n".join(log) + "\n")
    assert costs.recorded_step_times([tmp_path], {key}) == {key: pytest.approx(2.0)}
    (d / "config.yaml").unlink()  # not a run: skipped
    assert costs.recorded_step_times([tmp_path], {key}) == {}
