"""A sweep job's dir name: what identifies the job, never a setting a resume may change."""

from __future__ import annotations

import pytest

from dpsub.cli.sweeps import continue_args, job_label, job_subdir
from dpsub.errors import ConfigError
from dpsub.training.checkpoint import RESUME_MAY_CHANGE


def test_a_job_dir_name_leaves_out_every_key_a_resume_may_change():
    """Issue 36.3: continuing a sweep with train.log_every=5 re-ran every job in new dirs."""
    job = ["seed=1", "privacy.epsilon=2", "mechanism=gep"]
    allowed = [f"{k}=1" for k in RESUME_MAY_CHANGE]  # resume, out_dir, data.root, logger, ...
    allowed += ["logger.mode=disabled", "+eval.mia=true", "train.eval_every=3"]  # under groups
    assert job_label(job + allowed) == job_label(job) == "mechanism=gep,privacy.epsilon=2,seed=1"
    assert job_label(["train.log_every=5"]) == ""


def test_a_sweep_made_before_keeps_its_job_dirs(tmp_path):
    """Job dirs named when only Hydra's few keys were left out are found, not made anew."""
    job = ["seed=0", "train.eval_every=0"]
    assert job_subdir(tmp_path, 0, job) == "0_seed=0"
    (tmp_path / "0_seed=0,train.eval_every=0").mkdir()
    assert job_subdir(tmp_path, 0, job) == "0_seed=0,train.eval_every=0"
    assert job_subdir(tmp_path, 1, ["train.log_every=5"]) == "1"


def test_continuing_a_sweep_refuses_an_added_sweep(tmp_path):
    """More jobs would renumber them: job 1 would find job 0's dir."""
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra.mode=MULTIRUN]\n    task: ['seed=0,1']\n"
    )
    assert "train.log_every=5" in continue_args(tmp_path, ["train.log_every=5"])
    with pytest.raises(ConfigError, match="one value"):
        continue_args(tmp_path, ["train.log_every=5,10"])


def test_two_lanes_launching_in_the_same_second_get_their_own_sweep_folders(tmp_path):
    """Both lanes once wrote <setting>/.sweeps/<second>/jobs.json, the second over the first,
    and both trained the second lane's job (the run dir's lock then stopped one of them)."""
    from dpsub.experiments.reproduce import new_sweep_dir

    a, b = new_sweep_dir(tmp_path), new_sweep_dir(tmp_path)
    assert a != b and a.is_dir() and b.is_dir() and a.parent == b.parent == tmp_path / ".sweeps"
