"""Hydra's own conventions work with dpsub or are refused on one line (issue 36):
``hydra.run.dir=X`` was ignored (the run went to out_dir, X stayed empty), and
``hydra.searchpath=[...]`` was refused while ``--config-dir`` worked. In-process: the
command-line checks only (the slow end-to-end run is tests/e2e/test_e2e_hydra_conventions.py).
"""

from __future__ import annotations

import shlex

import pytest

from dpsub.cli.common import config_dirs, run_dir_arg
from dpsub.errors import ConfigError
from dpsub.overrides import check_overrides, compose, use_config_dirs

from conftest import REPO

FOO = """# @package _global_
defaults:
  - override /mechanism: gep
train:
  max_steps: 1
"""


@pytest.fixture
def my_conf(tmp_path):
    """A user's config folder with an experiment of their own (docs/usage.md)."""
    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "foo.yaml").write_text(FOO)
    yield tmp_path / "my_conf"
    use_config_dirs([])


def test_hydra_run_dir_is_the_run_dir():
    assert run_dir_arg(["hydra.run.dir=X", "seed=1"]) == ["out_dir=X", "seed=1"]
    assert run_dir_arg(["seed=1"]) == ["seed=1"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-m", "hydra.run.dir=X", "seed=0,1"], "hydra.sweep.dir"),
        (["hydra.run.dir=X", "out_dir=Y"], "out_dir=DIR"),
    ],
)
def test_hydra_run_dir_where_it_cannot_apply_is_one_line(args, needle, capsys):
    with pytest.raises(SystemExit) as e:
        run_dir_arg(args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("dpsub: invalid config: hydra.run.dir: ") and needle in err


@pytest.mark.parametrize("how", ["--config-dir", "-cd", "--config-dir=", "hydra.searchpath"])
def test_an_experiment_of_ones_own_config_folder(my_conf, how):
    if how == "hydra.searchpath":
        args = [f"hydra.searchpath=[file://{my_conf}]"]
    else:
        args = [f"{how}{my_conf}"] if how.endswith("=") else [how, str(my_conf)]
    assert config_dirs([*args, "seed=1"]) in ([str(my_conf)], [f"file://{my_conf}"])
    use_config_dirs(config_dirs(args))
    check_overrides(["experiment=foo", "mechanism.num_bases=3"])  # a key of foo's mechanism
    assert compose(["experiment=foo"]).mechanism.name == "gep"
    with pytest.raises(ConfigError, match="experiment=fo0: .*your config folders.*closest: foo"):
        check_overrides(["experiment=fo0"])


def test_the_documented_own_experiment_is_valid(tmp_path):
    """docs/usage.md's example (its YAML and its two command lines) passes every check."""
    from dpsub.config import validate

    text = (REPO / "docs" / "usage.md").read_text()
    yaml = text.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "foo.yaml").write_text(yaml)
    lines = [
        line for line in text.splitlines() if line.startswith("dpsub-train ") and "foo" in line
    ]
    assert len(lines) == 2
    try:
        for line in lines:
            args = shlex.split(line.split(" #")[0].replace("my_conf", str(tmp_path / "my_conf")))[
                1:
            ]
            use_config_dirs(config_dirs(args))
            overrides = [a for a in args if "=" in a and not a.startswith(("-", "hydra."))]
            check_overrides(overrides)
            validate(compose(overrides))
    finally:
        use_config_dirs([])
