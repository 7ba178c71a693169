"""End-to-end runs: real data, resume after a kill, W&B offline files, Hydra multirun."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import dpsub.train  # noqa: F401  (registers the run-dir resolver)
from dpsub.logging import read_metrics
from dpsub.training.trainer import train

from conftest import CONF_DIR, REPO, SHARED, cli_command, needs_shared, run_cli


def cfg_for(*overrides: str, data_root: Path | None = None):
    root = data_root or SHARED or Path("./data")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            config_name="config",
            overrides=[
                f"data.root={root}",
                "logger.mode=disabled",
                "train.progress=false",
                *overrides,
            ],
        )


DEMO = (
    "train.epochs=4",
    "train.batch_size=256",
    "optim.lr=1.0",
    "optim.momentum=0.0",
    "privacy.epsilon=3.0",
    "train.eval_every=5",
    "train.log_every=2",
)


def test_digits_dpsgd_learns_and_spends_exactly_the_budget(tmp_path):
    res = train(cfg_for(*DEMO), tmp_path)
    assert res.steps == round(4 / (256 / 1437))
    assert 2.9 < res.epsilon <= 3.0
    assert res.test_accuracy > 0.4  # 10 classes: chance is 0.1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epsilon"] == pytest.approx(res.epsilon)
    metrics = read_metrics(tmp_path)
    eps = [m["epsilon"] for m in metrics if "epsilon" in m]
    assert eps == sorted(eps)  # spent epsilon only grows
    assert (tmp_path / "config.yaml").exists()


def test_nonprivate_reports_infinite_epsilon(tmp_path):
    res = train(cfg_for(*DEMO, "mechanism=nonprivate", "optim.lr=0.1"), tmp_path)
    assert res.epsilon == float("inf")
    assert json.loads((tmp_path / "summary.json").read_text())["epsilon"] == "inf"


def test_budget_stops_training_when_fixed_noise_is_too_small(tmp_path):
    res = train(cfg_for(*DEMO, "privacy.noise_multiplier=0.8", "train.epochs=20"), tmp_path)
    assert res.stopped_by_budget and res.epsilon <= 3.0
    assert res.steps < round(20 / (256 / 1437))


@needs_shared
def test_dpsgd_on_real_mnist(tmp_path):
    res = train(
        cfg_for(
            "dataset=mnist",
            "train.batch_size=512",
            "train.max_steps=60",
            "optim.lr=2.0",
            "optim.momentum=0.0",
            "privacy.epsilon=2.0",
            "train.eval_every=0",
        ),
        tmp_path,
    )
    assert res.steps == 60
    assert res.epsilon <= 2.0 and res.epsilon > 1.9
    assert res.test_accuracy > 0.75


@needs_shared
def test_gep_on_real_mnist_with_natural_aux(tmp_path):
    res = train(
        cfg_for(
            "dataset=mnist",
            "mechanism=gep",
            "aux=natural",
            "aux.num_samples=300",
            "mechanism.num_bases=100",
            "mechanism.diagnostics_every=5",
            "train.batch_size=256",
            "train.max_steps=12",
            "optim.lr=0.5",
            "train.log_every=1",
            "train.eval_every=0",
        ),
        tmp_path,
    )
    assert res.steps == 12 and res.epsilon <= 2.0
    metrics = read_metrics(tmp_path)
    errs = [m["mech/projection_error"] for m in metrics if "mech/projection_error" in m]
    assert errs and all(0 < e < 1.5 for e in errs)
    assert any("mech/stable_rank_residual" in m for m in metrics)


def test_wandb_offline_run_holds_the_metrics(tmp_path):
    train(cfg_for(*DEMO, "logger.mode=offline", "train.max_steps=4"), tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    blob = b"".join(p.read_bytes() for p in runs[0].glob("*.wandb"))
    for key in (b"test/accuracy", b"epsilon", b"train/loss"):
        assert key in blob, key


def test_kill_and_resume_reaches_the_same_run(tmp_path):
    """SIGTERM mid-run, resume from the checkpoint: same steps, same epsilon, same model."""
    overrides = (*DEMO, "train.epochs=12", "train.checkpoint_every=5", "train.eval_every=0")
    reference = train(cfg_for(*overrides), tmp_path / "ref")

    run_dir = tmp_path / "killed"
    args, env = cli_command(*overrides, run_dir=run_dir)
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ckpt, deadline = run_dir / "checkpoint.pt", time.time() + 300
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    import torch

    killed_at = torch.load(ckpt, weights_only=False)["step"]
    assert 0 < killed_at < reference.steps

    run_cli(f"resume={run_dir}", *overrides, check=True)
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["steps"] == reference.steps
    assert final["epsilon"] == pytest.approx(reference.epsilon, rel=1e-9)
    assert final["test_accuracy"] == pytest.approx(reference.test_accuracy, abs=1e-9)
    ledger = torch.load(ckpt, weights_only=False)["ledger"]
    assert sum(n for _, _, n in ledger["history"]) == reference.steps  # each step counted once
    steps_logged = [m["step"] for m in read_metrics(run_dir) if "train/loss" in m]
    assert len(steps_logged) == len(set(steps_logged))  # no duplicated lines after resume


def test_multirun_over_two_epsilons(tmp_path):
    run_cli(
        "-m",
        "privacy.epsilon=1,4",
        "train.max_steps=3",
        "train.eval_every=0",
        f"hydra.sweep.dir={tmp_path}",
    )
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and (p / "summary.json").exists())
    assert len(jobs) == 2
    eps = sorted(json.loads((p / "summary.json").read_text())["epsilon"] for p in jobs)
    assert eps[0] <= 1.0 < eps[1] <= 4.0


@needs_shared
@pytest.mark.slow
def test_gep_resnet20_on_partial_cifar10(tmp_path):
    res = train(
        cfg_for(
            "dataset=cifar10_subset",
            "model=resnet20",
            "mechanism=gep",
            "aux=natural",
            "aux.num_samples=64",
            "mechanism.num_bases=32",
            "train.batch_size=64",
            "train.max_steps=3",
            "grads.microbatch=32",
            "train.eval_every=0",
            "train.eval_batch_size=512",
        ),
        tmp_path,
    )
    assert res.steps == 3 and res.epsilon <= 2.0


def test_prv_accountant_and_shuffle_sampling_run(tmp_path):
    res = train(
        cfg_for(*DEMO, "privacy.accountant=prv", "privacy.sampling=shuffle", "train.max_steps=6"),
        tmp_path,
    )
    assert res.steps == 6 and 2.9 < res.epsilon <= 3.0
    metrics = read_metrics(tmp_path)
    assert any("epsilon_rdp" in m for m in metrics)  # cheap RDP value between PRV evaluations
    assert all(m["train/batch_size"] == 256 for m in metrics if "train/batch_size" in m)
