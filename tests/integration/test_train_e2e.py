"""End-to-end runs: real data, resume after a kill, what the logs may hold, Hydra multirun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dpsub import rundir as runs
from dpsub.privacy import epsilon_for
from dpsub.tracking import read_metrics
from dpsub.training.loop import train

from conftest import cli_in_process, compose_cfg
from helpers.runs import (
    DEMO,
)

cfg_for = compose_cfg


#: What the logs may hold by default: released quantities, epsilon, test metrics, settings.
COVERED = {
    "step",
    "epsilon",
    "epsilon_rdp",
    "epsilon_nominal",
    "epsilon_nominal_rdp",
    "test/accuracy",
    "test/loss",
    "lr",
    "z_eff",
}  # fmt: skip  (validation/* of tuning runs: held-out private examples, see data/validation.py)
COVERED_MECH = {"mech/noise_std", "mech/noise_std_embedding", "mech/noise_std_residual"}


def test_digits_dpsgd_learns_and_spends_exactly_the_budget(tmp_path):
    res = train(cfg_for(*DEMO), tmp_path)
    assert res.steps == round(4 / (256 / 1437))
    assert 2.9 < res.epsilon <= 3.0
    assert res.test_accuracy > 0.4  # 10 classes: chance is 0.1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epsilon"] == pytest.approx(res.epsilon)
    assert summary["covered_by_epsilon"] is True
    eps = [m["epsilon"] for m in read_metrics(tmp_path) if "epsilon" in m]
    assert eps == sorted(eps)  # spent epsilon only grows
    assert (tmp_path / "config.yaml").exists()
    log = (tmp_path / "train.log").read_text()
    assert "eval step" in log and "final: test accuracy" in log  # not only the header
    # where it ran, for the tables' hardware line: summary.json and the log's header
    assert summary["hardware"] == runs.hardware() == runs.RunDir(tmp_path).hardware()
    assert f"] hardware         {summary['hardware']}" in log


def test_default_logs_hold_only_what_epsilon_covers(tmp_path):
    train(cfg_for(*DEMO, "train.max_steps=6"), tmp_path / "default")
    for m in read_metrics(tmp_path / "default"):
        assert set(m) <= COVERED | COVERED_MECH, set(m) - COVERED - COVERED_MECH
    summary = json.loads((tmp_path / "default" / "summary.json").read_text())
    assert not any("train" in k or "private" in k for k in summary)
    # opt-in: the private statistics appear under private/ and the run says it is not covered
    train(cfg_for(*DEMO, "train.max_steps=6", "privacy.private_diagnostics=true"), tmp_path / "opt")
    keys = set().union(*map(set, read_metrics(tmp_path / "opt")))
    assert {"private/train_loss", "private/batch_size", "private/clip_fraction"} <= keys
    assert (
        json.loads((tmp_path / "opt" / "summary.json").read_text())["covered_by_epsilon"] is False
    )
    assert "NOT covered" in (tmp_path / "opt" / "train.log").read_text()


def test_a_tuning_run_reports_validation_accuracy_and_never_the_test_set(tmp_path):
    train(cfg_for(*DEMO, "train.max_steps=5", "dataset.validation_size=200"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "validation_accuracy" in summary and "test_accuracy" not in summary
    keys = set().union(*map(set, read_metrics(tmp_path)))
    assert "validation/accuracy" in keys and not any(k.startswith("test/") for k in keys)
    assert "final: validation accuracy" in (tmp_path / "train.log").read_text()


def test_nonprivate_reports_infinite_epsilon(tmp_path):
    res = train(cfg_for(*DEMO, "mechanism=nonprivate", "optim.lr=0.1"), tmp_path)
    assert res.epsilon == float("inf")
    assert json.loads((tmp_path / "summary.json").read_text())["epsilon"] == "inf"


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_budget_stops_at_the_largest_step_count_under_the_budget(tmp_path, accountant):
    """A fixed privacy.noise_multiplier: both accountants stop where the budget runs out."""
    over = ("privacy.noise_multiplier=1.2", "train.epochs=20", f"privacy.accountant={accountant}")
    res = train(cfg_for(*DEMO, *over, "train.eval_every=0"), tmp_path)
    q = 256 / 1437
    assert res.stopped_by_budget and res.steps >= 1  # (none affordable: an error, test_cli_errors)
    assert res.epsilon <= 3.0
    assert (
        epsilon_for([(1.2, q, res.steps)], 1e-5, accountant)
        <= 3.0
        < epsilon_for([(1.2, q, res.steps + 1)], 1e-5, accountant)
    )


# ------------------------------------------------------------ kill and resume


def test_secure_noise_is_not_reproducible_from_the_config(tmp_path):
    a = train(cfg_for(*DEMO, "train.max_steps=3", "privacy.rng=secure"), tmp_path / "a")
    b = train(cfg_for(*DEMO, "train.max_steps=3", "privacy.rng=secure"), tmp_path / "b")
    wa = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)["state"]["model"]
    wb = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["state"]["model"]
    assert not all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.epsilon == b.epsilon


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A short finished run, made once; tests copy it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    cli_in_process(*DEMO, "train.max_steps=4", run_dir=run_dir)
    return run_dir


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, dst))


@pytest.mark.parametrize(
    "override",
    [
        "privacy.delta=1e-3",
        "privacy.epsilon=7",
        "privacy.accountant=prv",
        "mechanism.clip=0.5",
        "optim.lr=0.3",
        "dataset.image_size=20",
    ],
)
def test_resume_refuses_changed_privacy_settings_and_writes_nothing(
    tmp_path, finished_run, override
):
    run_dir = copy_run(finished_run, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    proc = cli_in_process(f"resume={run_dir}", override, check=False)
    assert proc.returncode == 2
    assert override.split("=")[0] in proc.stderr and "Traceback" not in proc.stderr
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert after == before  # nothing of the run was touched


def test_resume_refuses_an_edited_config_file(tmp_path, finished_run):
    run_dir = copy_run(finished_run, tmp_path / "run")
    cfg = run_dir / "config.yaml"
    cfg.write_text(cfg.read_text().replace("delta: 1.0e-05", "delta: 0.001"))
    proc = cli_in_process(f"resume={run_dir}", check=False)
    assert proc.returncode == 2 and "privacy.delta" in proc.stderr


def test_resume_of_a_run_saved_before_a_config_group_existed(tmp_path, finished_run):
    """A run dir from an older dpsub (no ``eval:`` group) resumes with the group's defaults."""
    import yaml

    run_dir = copy_run(finished_run, tmp_path / "run")
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    del cfg["eval"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = cli_in_process(f"resume={run_dir}", check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final: test accuracy" in proc.stdout + proc.stderr


def test_resume_of_a_missing_or_empty_dir_fails_and_creates_nothing(tmp_path):
    proc = cli_in_process(f"resume={tmp_path / 'typo'}", check=False)
    assert proc.returncode == 2 and "typo" in proc.stderr
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    proc = cli_in_process(f"resume={tmp_path / 'empty'}", check=False)
    assert proc.returncode == 2 and list((tmp_path / "empty").iterdir()) == []


def test_prv_accountant_and_shuffle_sampling_run(tmp_path):
    res = train(
        cfg_for(*DEMO, "privacy.accountant=prv", "privacy.sampling=shuffle", "train.max_steps=6"),
        tmp_path,
    )
    assert res.steps == 6 and 2.9 < res.epsilon <= 3.0
    metrics = read_metrics(tmp_path)
    assert any("epsilon_rdp" in m for m in metrics)  # cheap RDP value between PRV evaluations
