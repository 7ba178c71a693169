"""The wheel is installable and carries its Hydra configs (dpsub/conf).

Builds the wheel with uv, installs it into a fresh venv and checks, from a working
directory outside the repository, that the installed package holds
``dpsub/conf/config.yaml`` and that :func:`dpsub.paths.conf_dir` points at it.

The dependencies come from uv's cache, offline: uv's cache holds the wheels of the
locked versions but not the package index pages an offline resolve of the wheel's
requirements would need, so the fresh venv gets exactly the locked dependencies
(``uv sync --frozen --no-install-project``), the wheel is installed on top with
``--no-deps`` and ``uv pip check`` confirms that the two agree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _uv() -> list[str]:
    """The command that runs uv, or skip the test."""
    found = shutil.which("uv")
    candidates = [[found]] if found else []
    candidates += [[sys.executable, "-m", "uv"], ["python3", "-m", "uv"]]
    for cmd in candidates:
        try:
            if subprocess.run([*cmd, "--version"], capture_output=True).returncode == 0:
                return cmd
        except OSError:
            continue
    pytest.skip("uv is not available (neither `uv` nor `python -m uv`); it builds the wheel")


def _run(*args, cwd: Path, env: dict | None = None) -> str:
    proc = subprocess.run(list(map(str, args)), cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with the built wheel installed (not editable)."""
    uv, tmp = _uv(), tmp_path_factory.mktemp("wheel")
    _run(*uv, "build", "--wheel", "--out-dir", tmp / "dist", cwd=REPO)
    (wheel,) = (tmp / "dist").glob("dpsub-*.whl")
    venv = tmp / "venv"
    _run(*uv, "venv", "--python", sys.executable, venv, cwd=tmp)
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    sync = ("sync", "--frozen", "--offline", "--no-dev", "--no-install-project")
    _run(*uv, *sync, cwd=REPO, env=env)
    python = venv / "bin" / "python"
    _run(*uv, "pip", "install", "--offline", "--no-deps", "--python", python, wheel, cwd=tmp)
    _run(*uv, "pip", "check", "--python", python, cwd=tmp)
    return python


def test_installed_package_carries_its_configs(installed: Path, tmp_path: Path) -> None:
    code = (
        "import dpsub, pathlib\n"
        "from dpsub.paths import conf_dir\n"
        "pkg = pathlib.Path(dpsub.__file__).parent\n"
        "print(pkg)\n"
        "print(conf_dir())\n"
    )
    pkg, conf = map(Path, _run(installed, "-c", code, cwd=tmp_path).split())
    assert installed.parent.parent in pkg.parents  # the venv's copy, not the checkout
    assert (pkg / "conf" / "config.yaml").is_file()
    assert conf == pkg / "conf"
    groups = {p.name for p in (REPO / "conf").iterdir() if p.is_dir()}
    assert groups <= {p.name for p in conf.iterdir() if p.is_dir()}


def test_installed_configs_compose(installed: Path, tmp_path: Path) -> None:
    """Hydra composes the packaged configs, groups included, in the installed venv."""
    code = (
        "from dpsub.config import compose\n"
        "cfg = compose(['dataset=mnist', 'mechanism=gep', 'aux=natural'])\n"
        "print(cfg.dataset.name, cfg.mechanism.name, cfg.aux.name)\n"
    )
    assert _run(installed, "-c", code, cwd=tmp_path).split() == ["mnist", "gep", "natural"]


def test_conf_dir_in_a_checkout_is_the_repository_conf() -> None:
    """Editable / dev install: the top-level conf/, so edits apply without reinstalling."""
    from dpsub.paths import conf_dir

    assert conf_dir() == REPO / "conf"


def test_installed_dpsub_train_runs_from_another_directory(installed: Path, tmp_path: Path) -> None:
    """The README's first command, from the wheel: the console script trains and prints epsilon."""
    script = installed.parent / "dpsub-train"
    env = {**os.environ, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    out = _run(
        script, "experiment=demo", "train.max_steps=3", "train.eval_every=0", "logger=disabled",
        "train.progress=false", f"out_dir={tmp_path / 'run'}", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert "final: test accuracy" in out and "epsilon" in out
    assert (tmp_path / "run" / "summary.json").is_file()
    assert not (tmp_path / "outputs").exists()  # nothing written where it was not asked


def test_installed_script_commands_run_from_another_directory(installed: Path, tmp_path: Path):
    """The scripts an install needs are console commands (dpsub/commands.py): each runs from
    the wheel's own copy and puts its outputs under the working directory, not the venv."""
    from dpsub.commands import COMMANDS

    bin_dir = installed.parent
    for command in COMMANDS:
        out = _run(bin_dir / command, "--help", cwd=tmp_path)
        assert out.startswith(f"usage: {command} "), command
    code = (
        "from dpsub.paths import committed_step_times, project_root, scripts_dir\n"
        "from dpsub.commands import how_to_run\n"
        "print(project_root(), scripts_dir(), committed_step_times(), how_to_run('make_table.py'))"
    )
    root, scripts, times, render = _run(installed, "-c", code, cwd=tmp_path).split()
    root, scripts = Path(root), Path(scripts)
    assert root == tmp_path and installed.parent.parent in scripts.parents
    # the committed step times ship (dpsub-reproduce --dry-run's costs); messages name commands
    assert Path(times).read_bytes() == (REPO / "results/tables/step_times.json").read_bytes()
    assert render == "dpsub-table"
    assert {p.name for p in scripts.iterdir()} == set(COMMANDS.values())
    # a real use: the run the console script trains, summarized by the installed command
    env = {**os.environ, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    _run(
        bin_dir / "dpsub-train", "experiment=demo", "train.max_steps=2", "train.eval_every=0",
        "logger=disabled", "train.progress=false", f"out_dir={tmp_path / 'run'}",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    table = _run(bin_dir / "dpsub-summarize", tmp_path / "run", cwd=tmp_path)
    assert "| run |" in table and "digits" in table


def test_every_command_s_script_is_in_the_wheel_list() -> None:
    """pyproject.toml's entry points and force-include list name the same scripts."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from dpsub.commands import COMMANDS

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    scripts = project["project"]["scripts"]
    include = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for command, script in COMMANDS.items():
        assert scripts[command] == f"dpsub.commands:{command.removeprefix('dpsub-')}", command
        assert include[f"scripts/{script}"] == f"dpsub/scripts/{script}"
        assert (REPO / "scripts" / script).is_file()


def test_messages_name_the_scripts_in_a_checkout_and_the_commands_in_an_install(monkeypatch):
    from dpsub import commands

    assert commands.how_to_run("make_table.py") == "python scripts/make_table.py"  # checkout
    monkeypatch.setattr(commands, "wheel_install", lambda: True)
    assert commands.how_to_run("make_table.py") == "dpsub-table"
    assert commands.how_to_run("reproduce.py") == "dpsub-reproduce"
    assert commands.how_to_run("audit_table.py") == "python scripts/audit_table.py"  # not shipped
