"""scripts/plot_runs.py and scripts/summarize_runs.py on tiny fake run dirs, run as
the user runs them (``python scripts/X.py ARGS`` from another working directory, in this
process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import run_script_in_process

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

CONFIG = """\
dataset: {name: mnist, train_size: 1000}
model: {name: mnist_cnn}
mechanism: {name: MECH}
privacy: {epsilon: 2.0, delta: 1.0e-05}
train: {epochs: 10, batch_size: 256}
optim: {lr: 0.5}
seed: SEED
"""


def make_run(parent: Path, name: str, mech: str = "dpsgd", acc: float = 0.5, seed: int = 0) -> Path:
    """A finished run dir: metrics.jsonl, summary.json and config.yaml."""
    run = parent / name
    run.mkdir(parents=True)
    rows = [
        {"step": 5, "train/loss": 2.0, "epsilon": 0.5},
        {"step": 10, "test/accuracy": acc, "epsilon": 1.0},
        {"step": 20, "test/accuracy": acc + 0.1, "epsilon": 1.9, "mech/projection_error": 0.3},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"steps": 20, "noise_multiplier": 1.1, "epsilon": 1.9, "delta": 1e-5}
    (run / "summary.json").write_text(json.dumps({**summary, "test_accuracy": acc + 0.1}))
    (run / "config.yaml").write_text(CONFIG.replace("MECH", mech).replace("SEED", str(seed)))
    return run


def run_script(script: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    """``python scripts/SCRIPT ARGS`` from ``cwd``, in this process (a subprocess each spent
    seconds starting; conftest.run_script_in_process)."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return run_script_in_process(SCRIPTS / script, *args, env=env, cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


# ------------------------------------------------------------------- plot_runs


def test_plot_runs_writes_next_to_the_runs(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "runs", "a"), make_run(tmp_path / "runs", "b", mech="gep")
    cwd = tmp_path / "elsewhere"
    proc = run_script("plot_runs.py", a, b, "--metric", "mech/projection_error", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "runs" / "runs.png"
    assert proc.stdout.strip() == f"wrote {out}"
    assert out.read_bytes().startswith(b"\x89PNG")
    assert list(cwd.iterdir()) == []  # nothing in the working directory


def test_plot_runs_out(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a")
    (a / "config.yaml").unlink()  # the legend falls back to the dir name
    out = tmp_path / "figs" / "acc.png"
    proc = run_script("plot_runs.py", a, "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and not (tmp_path / "runs.png").exists()


@pytest.mark.parametrize("problem", ["missing", "no-metrics", "bad-json"])
def test_plot_runs_bad_run_dir(tmp_path: Path, problem: str) -> None:
    good, bad = make_run(tmp_path, "good"), tmp_path / "bad"
    if problem == "no-metrics":
        bad.mkdir()
        fragment = "no metrics.jsonl"
    elif problem == "bad-json":
        make_run(tmp_path, "bad")
        (bad / "metrics.jsonl").write_text('{"step": 1}\n{"step": \n')
        fragment = "metrics.jsonl:2: not a JSON line"
    else:
        fragment = "no such run directory"
    proc = run_script("plot_runs.py", good, bad, cwd=tmp_path)
    assert_one_line_error(proc, "plot_runs: ", str(bad), fragment)
    assert not list(tmp_path.glob("*.png"))


# -------------------------------------------------------------- summarize_runs


def test_summarize_runs_table(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "r1", acc=0.5), make_run(tmp_path, "r2", "gep", acc=0.7)]
    out = tmp_path / "table.md"
    proc = run_script("summarize_runs.py", *runs, "--out", out, cwd=tmp_path / "elsewhere")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("| run | seed | dataset | model | mechanism |")
    assert lines[2] == (
        "| r1 | 0 | mnist (1000) | mnist_cnn | dpsgd | 10 | 256 | 0.5 | 20 | 1.100 | 1.900 "
        "| 1e-05 | 60.00 |"
    )
    assert "| gep |" in lines[3] and lines[3].endswith("| 80.00 |")
    assert out.read_text() == proc.stdout.rstrip("\n") + "\n"


def make_sweep(tmp_path: Path) -> Path:
    """A Hydra sweep folder: two mechanisms x three seeds, numbered job dirs."""
    sweep = tmp_path / "multirun" / "2026-11-24" / "01-00-00"
    for i, (mech, seed) in enumerate((m, s) for m in ("dpsgd", "gep") for s in range(3)):
        make_run(sweep, str(i), mech, acc=0.5 + 0.1 * (mech == "gep") + 0.01 * seed, seed=seed)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    return sweep


def test_summarize_runs_takes_a_sweep_folder_and_averages_over_seeds(tmp_path: Path) -> None:
    proc = run_script("summarize_runs.py", make_sweep(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    per_run, per_setting = proc.stdout.strip().split("\n\n")
    assert len(per_run.splitlines()) == 2 + 6
    rows = per_setting.splitlines()[2:]
    assert len(rows) == 2  # one row per mechanism, over its three seeds
    assert rows[0].startswith("| mechanism.name=dpsgd | 0,1,2 | 61.00 ± 1.00 [")
    assert rows[0].endswith("] (3) | 1.900 |") and "mechanism.name=gep" in rows[1]


def test_plot_runs_takes_a_sweep_folder_one_legend_entry_per_setting(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from dpsub.experiments import plot_runs

    runs = plot_runs.load([make_sweep(tmp_path)])
    assert [name for name, _ in runs] == ["mechanism.name=dpsgd", "mechanism.name=gep"]
    assert [len(seeds) for _, seeds in runs] == [3, 3]
    proc = run_script("plot_runs.py", make_sweep(tmp_path / "again"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_summarize_runs_help_says_what_it_reads_and_prints(tmp_path: Path) -> None:
    proc = run_script("summarize_runs.py", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    for text in ("Markdown table", "summary.json", "config.yaml", "--out"):
        assert text in proc.stdout, text


@pytest.mark.parametrize("problem", ["missing", "no-summary", "no-config", "lacks-key"])
def test_summarize_runs_bad_run_dir(tmp_path: Path, problem: str) -> None:
    good, bad = make_run(tmp_path, "good"), tmp_path / "bad"
    fragment = "no such run directory"
    if problem != "missing":
        make_run(tmp_path, "bad")
    if problem == "no-summary":
        (bad / "summary.json").unlink()
        fragment = "no summary.json"
    elif problem == "no-config":
        (bad / "config.yaml").unlink()
        fragment = "no config.yaml"
    elif problem == "lacks-key":
        (bad / "config.yaml").write_text("dataset: {name: mnist}\n")
        fragment = "lacks a key"
    proc = run_script("summarize_runs.py", good, bad, cwd=tmp_path)
    assert_one_line_error(proc, "summarize_runs: ", str(bad), fragment)
    assert proc.stdout == ""


def _mutation_check():
    """What scripts/mutation_check.py runs: dpsub.experiments.mutations."""
    import importlib

    return importlib.import_module("dpsub.experiments.mutations")


def test_every_mutant_of_mutation_check_still_applies():
    """scripts/mutation_check.py: each deliberate bug's pattern is still in the code."""
    mod = _mutation_check()
    for m in mod.MUTANTS:
        assert m.old in (mod.ROOT / m.file).read_text(), m.name


def test_every_mutant_of_mutation_check_selects_a_test():
    """Each mutant's test files exist and its ``-k`` words name a test in them (a test that
    moved would leave pytest collecting nothing: exit 5, the mutant reported as surviving)."""
    mod = _mutation_check()
    for m in mod.MUTANTS:
        files = [a for a in m.tests if a.endswith(".py")]
        assert files and all((mod.ROOT / f).is_file() for f in files), m.name
        names = re.findall(
            r"^def (test_\w+)", "\n".join((mod.ROOT / f).read_text() for f in files), re.M
        )
        if "-k" in m.tests:
            words = m.tests[m.tests.index("-k") + 1].split(" or ")  # the only operator used
            assert all(w.isidentifier() for w in words), (m.name, words)
            assert any(w in n for w in words for n in names), (m.name, words)
        else:
            assert names, m.name


def test_mutation_check_flags_a_mutant_run_that_writes_into_the_checkout(tmp_path, monkeypatch):
    """A test run under a mutant must leave the checkout as it found it: new untracked files
    (toy results beside the committed tables, once) make the mutant's verdict a failure."""
    mod = _mutation_check()
    (tmp_path / "code.py").write_text("SAFE = True\n")
    (tmp_path / "test_leak.py").write_text(
        "from pathlib import Path\n\n\ndef test_x():\n"
        "    Path('leaked.json').write_text('{}')\n    assert False\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run(git + args, cwd=tmp_path, check=True, capture_output=True)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    m = mod.Mutant("leaky", "code.py", "SAFE = True", "SAFE = False", ("test_leak.py",))
    verdict = mod.run_mutant(m)
    assert verdict.startswith("LEFT 1 FILES") and "leaked.json" in verdict, verdict
    assert (tmp_path / "code.py").read_text() == "SAFE = True\n"  # restored
    (tmp_path / "test_leak.py").write_text("def test_x():\n    assert False\n")
    subprocess.run(git + ["commit", "-qam", "d"], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "leaked.json").unlink()
    assert mod.run_mutant(m) == "caught"
