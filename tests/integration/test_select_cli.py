"""``dpsub-select``: a private hyper-parameter search from the command line.

What it keeps (one run's released files and its record, nothing un-noised), what it prints
(nothing of any run), the bound it charges (the largest candidate plan), and the mistakes
it refuses before anything is written (one line, exit code 2).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import yaml

from conftest import run_in_process

TOY = (
    "dataset=synthetic",
    "dataset.synthetic.n_train=400",
    "dataset.synthetic.n_test=100",
    "train.batch_size=64",
    "train.epochs=1",
    "train.eval_every=2",
    "dataset.validation_size=100",
)
SEARCH = ("--mean", "3", "--score-sigma", "5")


def select(out, *words, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_in_process("dpsub.cli.select", [*words, "--out", str(out)], env)
    if check and proc.returncode != 0:
        raise AssertionError(f"dpsub-select failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def test_a_search_keeps_the_best_run_and_nothing_un_noised(tmp_path):
    out = tmp_path / "pick"
    proc = select(out, "--grid", "optim.lr=0.1,0.5,1.0", *SEARCH, *TOY)
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint.pt", "config.yaml", "ledger.json", "selection.json",
    ]  # fmt: skip
    printed = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(printed) == 2 and all("select:" in line for line in printed), printed  # no run's
    record = json.loads((out / "selection.json").read_text())
    assert record["candidate"][0] in {"optim.lr=0.1", "optim.lr=0.5", "optim.lr=1.0"}
    assert record["covered_by_epsilon"] is True
    assert record["epsilon"] > record["epsilon_of_each_run"] > 0
    assert 0 <= record["test_accuracy"] <= 1 and record["validation_score"] is not None
    assert not any(k in record for k in ("runs", "k", "K", "scores"))  # K stays secret
    kept = yaml.safe_load((out / "config.yaml").read_text())
    assert kept["seed"] >= 1000 and kept["out_dir"] == str(out)  # neither counts the runs
    assert kept["dataset"]["validation_pick"] == record["validation_pick"] == "hash"
    assert 60 < record["validation_size"] < 140  # as drawn (100 expected of 400)


def test_a_poisson_search_that_draws_no_run_releases_nothing(tmp_path):
    """K = 0 has probability exp(-1) at mean 1: a seed that draws it (the first uniform
    draw of select_privately decides K)."""
    from dpsub.privacy.selection import Repetitions

    law = Repetitions(mean=1.0)
    seed = next(s for s in range(100) if law.sample(np.random.default_rng(s).random()) == 0)
    out = tmp_path / "pick"
    select(out, "--grid", "optim.lr=0.5", "--mean", "1", "--shape", "inf", "--score-sigma", "5",
           "--seed", str(seed), *TOY)  # fmt: skip
    record = json.loads((out / "selection.json").read_text())
    assert record["candidate"] is None and record["validation_score"] is None
    assert [p.name for p in out.iterdir()] == ["selection.json"]


def test_the_kept_checkpoint_holds_no_plain_hash_of_the_private_data(tmp_path):
    """A plain hash of the training set lets whoever holds every candidate dataset but one
    example's test which one it was: the checkpoint's fingerprint is keyed, and its key
    (in the run dir it trained in) is not kept."""
    from omegaconf import OmegaConf

    from dpsub.config import validate
    from dpsub.training.build import private_data
    from dpsub.training.checkpoint import data_fingerprint

    out = tmp_path / "pick"
    select(out, "--grid", "optim.lr=0.5", *SEARCH, *TOY)
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False, map_location="cpu")
    _, data = private_data(validate(OmegaConf.load(out / "config.yaml")))
    assert ckpt["data_fingerprint"] != data_fingerprint(data.train_x, data.train_y)
    assert ckpt["data_fingerprint_keyed"] is True and not (out / "fingerprint.key").exists()


def test_the_bound_is_the_largest_plan_of_the_candidates(tmp_path):
    from dpsub.cli.select import check_search, parse
    from dpsub.training.build import planned_run_rdp, private_data

    args = parse(["--grid", "train.batch_size=32,64", *SEARCH, "--out", str(tmp_path / "o"),
                  *TOY])  # fmt: skip
    settings, bound, _ = check_search(args)
    n = int(private_data(settings[0][1])[1].train_y.shape[0])
    curves = [planned_run_rdp(s, n) for _, s in settings]
    assert not np.allclose(curves[0], curves[1])
    np.testing.assert_allclose(bound, np.maximum(*curves))


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (("--grid", "seed=1,2"), "--grid seed=1,2"),
        (("--grid", "dataset.validation_size=50,60"), "--grid dataset.validation_size"),
        (("--grid", "optim.lr=0.1", "dataset.validation_pick=balanced"), "validation_pick"),
        (("--grid", "optim.lr=0.1", "logger.mode=online"), "logger.mode"),
        (("--grid", "optim.lr=0.1", "mechanism=nonprivate"), "mechanism"),
        (("--grid", "optim.lr=0.1", "privacy.sampling=shuffle"), "privacy.sampling"),
        (("--grid", "optim.lr=0.1", "privacy.private_diagnostics=true"), "private_diagnostics"),
        (("--grid", "optim.lr=0.1", "--score-sigma", "0"), "--score-sigma"),
        (("--grid", "optim.lrr=0.1,0.2"), "optim.lrr"),
        (("--grid", "optim.lr=0.1", "dataset.validation_size=null"), "dataset.validation_size"),
        (
            ("--grid", "optim.lr=0.1", "mechanism=gep", "aux=natural", "data.root=/nowhere"),
            "aux.path",
        ),  # fmt: skip
        (("--grid", "optim.lr=0.1", "--bogus"), "--bogus"),
        (("--grid", "optim.lr=0.1", "aux=public_train", "aux.pick=balanced"), "aux.pick: its runs"),
    ],
)
def test_a_mistake_is_one_line_exit_2_and_nothing_written(tmp_path, words, named):
    out = tmp_path / "pick"
    proc = select(out, *SEARCH, *TOY, *words, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], proc.stderr
    assert not out.exists()


def test_a_non_empty_out_is_refused(tmp_path):
    out = tmp_path / "pick"
    out.mkdir()
    (out / "x").write_text("")
    proc = select(out, "--grid", "optim.lr=0.1", *SEARCH, *TOY, check=False)
    assert proc.returncode == 2 and "--out" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["x"]


def test_a_subset_drawn_with_each_runs_seed_is_refused():
    """dataset.train_size draws its subset with the run's seed: the runs of a search, each
    with its own seed, would train and be scored on examples the bound did not count."""
    from dpsub.cli.select import _check_covered
    from dpsub.config import validate
    from dpsub.errors import ConfigError
    from dpsub.overrides import compose, config_context

    with config_context():
        s = validate(compose(["dataset=mnist", "dataset.train_size=300"]))
    with pytest.raises(ConfigError, match="dataset.train_size: its subset is drawn"):
        _check_covered(s)
