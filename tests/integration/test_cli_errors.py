"""Mistakes on the command line: one line on stderr naming the culprit, exit code 2, nothing
written, and (where the mistake is in the config) no torch import, so no 20 s wait.

Each case drives the real entrypoint, ``dpsub.cli.train.cli()`` with the command line's argv and
environment, in this process (conftest.cli_in_process: a subprocess would spend seconds
starting); that no torch import happens is checked in a fresh interpreter.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SYNTH, cli_in_process
from helpers.cli_errors import fails, one_line_error


# ---------------------------------------------------------------- experiment=
def test_a_mistyped_experiment_is_refused_with_the_closest_names(tmp_path):
    line = one_line_error(
        fails(tmp_path, "experiment=gep_mnist_eps3"), "experiment=gep_mnist_eps3", "gep_mnist_eps2"
    )
    assert "closest" in line


def test_cfg_job_with_an_unknown_experiment_fails_instead_of_printing_the_default():
    proc = cli_in_process("--cfg", "job", "experiment=nonexistent", check=False)
    assert proc.stdout == ""
    one_line_error(proc, "experiment=nonexistent")


def test_a_sweep_over_experiments_checks_each_of_them(tmp_path):
    proc = fails(tmp_path, "-m", "experiment=demo,gep_mnist_eps22")
    one_line_error(proc, "experiment=gep_mnist_eps22", "gep_mnist_eps2")


# ----------------------------------------------------------------- key typos
@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["model.depthh=3"], ["model.depthh", "mnist_cnn", "norm"]),
        (["datset=mnist"], ["datset", "closest: dataset"]),
        (["mechanism=gep", "mechanism.clip=2"], ["mechanism.clip", "mechanism.clip_embedding"]),
        (["mechanism.num_bases=500"], ["mechanism.num_bases", "mechanism=bgep, gep"]),
        (["mechanism=gepp"], ["mechanism=gepp", "closest: gep"]),
        (["+model.depthh=3"], ["model.depthh", "not an option of model mnist_cnn"]),
        (["train.eval_ever=5"], ["train.eval_ever", "train.eval_every"]),
        (["~train.nope"], ["train.nope"]),
        (["paper=gep1-mnist"], ["paper=gep1-mnist", "dpsub-reproduce gep1-mnist"]),
    ],
)
def test_unknown_keys_groups_and_options_are_one_line(tmp_path, overrides, needles):
    one_line_error(fails(tmp_path, *overrides), *needles)


def test_a_mandatory_key_can_be_set(tmp_path):
    """features.path is ``???`` in conf/features/torchscript.yaml: setting it was refused as an
    unknown key ("no such key ...; closest: features.path"), so the documented SimCLR command
    could not run. Now the run gets as far as the file, which is not a model: one line."""
    bad = tmp_path / "simclr.pt"
    bad.write_text("not a model")
    for name in ("torchscript", "exported"):
        proc = fails(tmp_path, *SYNTH, "aux=gaussian", "model=linear", f"features={name}",
                     "features.norm=example", f"features.path={bad}")  # fmt: skip
        one_line_error(proc, "features.path", str(bad), "is not a file saved by")


# ------------------------------------------------------------- environment
def test_logger_online_without_an_api_key_fails_before_the_run_dir_exists(tmp_path):
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": ""}  # no key, no ~/.netrc
    proc = fails(tmp_path, "logger.mode=online", env=env)
    one_line_error(proc, "logger.mode", "API key", "logger.mode=offline")


def test_cuda_without_a_gpu_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    one_line_error(fails(tmp_path, "device=cuda"), "device", "cuda")


def test_missing_data_fails_on_one_line(tmp_path):
    proc = fails(tmp_path, "dataset=mnist", env={"DPSUB_DATA": str(tmp_path / "nodata")})
    one_line_error(proc, "mnist", "train-images-idx3-ubyte", str(tmp_path / "nodata"))


# --------------------------------------------------------------------- DP-Hero
def test_dphero_with_its_defaults_is_refused_before_training(tmp_path):
    line = one_line_error(fails(tmp_path, "mechanism=dphero"), "privacy.noise_multiplier")
    assert "experiment=dphero_mnist_lenet" in line and "honest epsilon" in line


# ---------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "override, needles",
    [
        ("train.eval_ever=5", ["train.eval_ever", "train.eval_every"]),
        ("logger=disabld", ["logger=disabld", "disabled"]),
        ("mechanism=gep", ["resume: cannot change", "mechanism.name"]),
    ],
)
def test_resume_names_unknown_keys_and_refused_changes(tmp_path, finished, override, needles):
    run_dir = shutil.copytree(finished, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    one_line_error(cli_in_process(f"resume={run_dir}", override, check=False), *needles)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


# ------------------------------------------------------------- no torch import
def test_config_and_environment_errors_do_not_import_torch(tmp_path):
    """The checks run before torch is imported (torch's import is most of a 20 s start)."""
    code = f"""
import sys
from dpsub.config import ConfigError, _gpu_driver_present, check_environment, compose, validate
from dpsub.errors import DataError
from dpsub.overrides import check_overrides
for bad in (["experiment=nope"], ["model.depthh=3"], ["mechanism.num_bases=5"]):
    try:
        check_overrides(bad)
        raise SystemExit(f"not refused: {{bad}}")
    except ConfigError:
        pass
cases = [["mechanism=dphero"], ["data.root={tmp_path}", "dataset=mnist"],
         ["logger.mode=online"], ["device=cuda"], ["+model.depthh=1"]]
for ov in cases:
    if ov == ["device=cuda"] and _gpu_driver_present():
        continue  # checked with torch there
    try:
        cfg = compose(ov)
        validate(cfg)
        check_environment(cfg)
        raise SystemExit(f"not refused: {{ov}}")
    except (ConfigError, DataError):
        pass
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": "", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ------------------------------------------- other commands' groups (in-process)
@pytest.mark.parametrize(
    "override, needles, absent",
    [
        ("datset=mnist", ["datset", "closest: dataset"], "pate"),  # suggested pate (issue 36)
        ("audit=onerun", ["audit", "dpsub-audit"], "No match"),
        ("pate.sigma2=4", ["pate.sigma2", "dpsub-pate"], "no such key"),
    ],
)
def test_dpsub_train_neither_suggests_nor_takes_audit_or_pate(override, needles, absent):
    from dpsub.errors import ConfigError
    from dpsub.overrides import check_overrides

    with pytest.raises(ConfigError) as e:
        check_overrides([override, "seed=1"])
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
    assert absent not in str(e.value)
