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

from pathlib import Path

import pytest

from helpers.packaging import _run

REPO = Path(__file__).resolve().parents[2]


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
    assert (pkg / "py.typed").is_file()  # PEP 561: type checkers read the API's annotations
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


def test_type_checkers_see_the_lazily_imported_api() -> None:
    """``dpsub.make_private`` is imported on first use (``__getattr__``), which a type checker
    cannot follow: the ``TYPE_CHECKING`` block must import every name of ``__all__``."""
    import ast

    import dpsub

    tree = ast.parse((REPO / "src/dpsub/__init__.py").read_text())
    guarded = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    )
    names = {a.name for n in guarded.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert names == set(dpsub.__all__)
    assert (REPO / "src/dpsub/py.typed").is_file()


def test_every_command_is_a_module_entry_point_with_a_script_wrapper() -> None:
    """pyproject.toml's entry points are functions of dpsub.experiments (no scripts shipped)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from dpsub.experiments.commands import COMMANDS

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    scripts = project["project"]["scripts"]
    include = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert not any(k.startswith("scripts/") for k in include)  # the commands are modules
    for command, script in COMMANDS.items():
        assert scripts[command] == f"dpsub.experiments.{script.removesuffix('.py')}:cli", command
        assert (REPO / "scripts" / script).is_file()


def test_messages_name_the_scripts_in_a_checkout_and_the_commands_in_an_install(monkeypatch):
    from dpsub.experiments import commands

    assert commands.how_to_run("make_table.py") == "python scripts/make_table.py"  # checkout
    monkeypatch.setattr(commands, "wheel_install", lambda: True)
    assert commands.how_to_run("make_table.py") == "dpsub-table"
    assert commands.how_to_run("reproduce.py") == "dpsub-reproduce"
    assert commands.how_to_run("audit_table.py") == "python scripts/audit_table.py"  # not shipped
