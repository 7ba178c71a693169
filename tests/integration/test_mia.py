"""Membership inference (loss-threshold attack): the statistics, and evaluate_run on real runs."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from dpsub.eval.mia import (
    attack_success,
    best_threshold,
    evaluate_run,
    loss_threshold_attack,
    wilson_interval,
)
from dpsub.training.build import build_run

from conftest import REPO, SYNTH, compose_cfg, run_script_in_process


def test_wilson_interval_reference_values():
    # Wilson (1927) score interval at 95%: 50/100 -> [0.4038, 0.5962]; 9/10 -> [0.5958, 0.9821]
    assert wilson_interval(50, 100) == pytest.approx((0.40383, 0.59617), abs=1e-5)
    assert wilson_interval(9, 10) == pytest.approx((0.59585, 0.98212), abs=1e-5)
    low, high = wilson_interval(0, 20)
    assert low == pytest.approx(0, abs=1e-12) and 0 < high < 0.2
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_best_threshold_is_the_best_of_all_cuts():
    """Against brute force over every loss value (and -inf) as a threshold."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        m = torch.randint(0, 6, (9,), generator=gen).float()  # ties on purpose
        nm = torch.randint(2, 9, (7,), generator=gen).float()
        cands = [-float("inf"), *torch.cat([m, nm]).tolist()]
        best = max(attack_success(t, m, nm) for t in cands)
        assert attack_success(best_threshold(m, nm), m, nm) == best
    assert best_threshold(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])) == 2.5
    assert best_threshold(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == -float("inf")


def test_attack_uses_disjoint_halves_and_balances_the_sets():
    gen = torch.Generator().manual_seed(0)
    r = loss_threshold_attack(torch.rand(1001), torch.rand(300) + 0.5, gen)
    assert r.examples == 300  # 150 members + 150 non-members, the other 150 + 150 chose
    assert r.ci_low <= r.success <= r.ci_high


def test_success_is_measured_out_of_sample():
    """Members and non-members alike: a threshold chosen on the other half is right half the
    time on average (choosing it on the evaluation half itself would average ~0.6)."""
    gen = torch.Generator().manual_seed(5)
    rates = [
        loss_threshold_attack(torch.rand(40, generator=gen), torch.rand(40, generator=gen), gen)
        for _ in range(300)
    ]
    assert sum(r.success for r in rates) / len(rates) == pytest.approx(0.5, abs=0.015)


def synth_run(*extra):
    return build_run(compose_cfg(*SYNTH, "mechanism=nonprivate", *extra))


def test_a_model_that_never_saw_the_data_is_at_chance():
    """Untrained model: members and non-members are alike; 50% lies in the interval."""
    for seed in (0, 1):
        run = synth_run("dataset.synthetic.n_train=2000", "dataset.synthetic.n_test=2000",
                        f"seed={seed}")  # fmt: skip
        r = evaluate_run(run, examples=2000)
        assert r["private/mia/examples"] == 2000
        assert r["private/mia/ci_low"] <= 0.5 <= r["private/mia/ci_high"]
        assert r["private/mia/ci_high"] - r["private/mia/ci_low"] < 0.1


def test_non_members_exclude_what_the_aux_source_took():
    """aux=heldout_test removes m test examples: only the rest can be non-members."""
    run = synth_run("dataset.synthetic.n_test=200", "aux=heldout_test", "aux.num_samples=180")
    assert len(run.data.test_y) == 20
    assert evaluate_run(run, examples=1000)["private/mia/examples"] == 20


def test_example_count_defaults_when_the_config_leaves_it_null():
    """conf/config.yaml says ``eval.mia_examples: null``: 10,000, capped by the data."""
    run = synth_run("dataset.synthetic.n_train=64", "dataset.synthetic.n_test=64")
    assert OmegaConf.select(run.cfg, "eval.mia_examples", default=0) is None
    assert evaluate_run(run)["private/mia/examples"] == 64


def test_evaluate_run_touches_neither_model_nor_training_randomness():
    run = synth_run()
    before = [p.detach().clone() for p in run.model.parameters()]
    states = {k: g.get_state() for k, g in run.generators.items()}
    evaluate_run(run, examples=50)
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters(), strict=True))
    assert all(torch.equal(g.get_state(), states[k]) for k, g in run.generators.items())
    assert run.model.training


# ------------------------------------------------------------- trainer hook
def test_eval_mia_is_logged_under_private_and_uncovers_the_run(tmp_path):
    from dpsub.training.loop import train

    train(compose_cfg(*SYNTH, "eval.mia=true", "eval.mia_examples=50"), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["covered_by_epsilon"] is False
    assert summary["private/mia/examples"] == 50
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("private/mia/success" in m for m in logged)
    assert all(k.startswith("private/") for m in logged for k in m if "mia" in k)


# ------------------------------------------------------------------- script
def mia_script(*args) -> subprocess.CompletedProcess:
    """``python scripts/mia.py ARGS``, in this process (conftest.run_script_in_process)."""
    return run_script_in_process(REPO / "scripts" / "mia.py", *args)


def test_mia_script_on_a_finished_run(tmp_path):
    from dpsub.training.loop import train

    run_dir = tmp_path / "run"
    train(compose_cfg(*SYNTH, "aux=heldout_test", "aux.num_samples=40"), run_dir)
    proc = mia_script(run_dir, "--examples", 60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads((run_dir / "mia.json").read_text())
    assert out["examples"] == 60 and out["covered_by_epsilon"] is False  # 100 - 40 test left
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["covered_by_epsilon"] is False  # the run dir now holds an un-noised result
    assert summary["not_covered"] == ["membership_inference"]
    assert out["ci_low"] <= out["success"] <= out["ci_high"]
    assert "membership-inference success" in proc.stdout


@pytest.mark.parametrize("problem", ["missing", "no_checkpoint", "bad_yaml"])
def test_mia_script_bad_run_dir_is_one_line(tmp_path, problem):
    run_dir = tmp_path / "run"
    if problem != "missing":
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text("seed: [" if problem == "bad_yaml" else "seed: 0\n")
    if problem == "bad_yaml":
        (run_dir / "checkpoint.pt").write_bytes(b"")
    proc = mia_script(run_dir)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(run_dir) in lines[0]
    assert not (run_dir / "mia.json").exists()
