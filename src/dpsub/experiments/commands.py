"""Console commands for the helper scripts, so that an install has them too.

The scripts live in the repository's ``scripts/``; the wheel ships the ones below as
``dpsub/scripts/`` (``force-include`` in pyproject.toml) and :func:`dpsub.paths.scripts_dir`
finds either copy. Each command runs its script as ``__main__`` with the same
arguments: ``dpsub-reproduce gep1-mnist`` is ``python scripts/reproduce.py gep1-mnist``.
Outputs go under the working directory in an install (:func:`dpsub.paths.project_root`).
"""

from __future__ import annotations

import sys
import types

from dpsub.paths import scripts_dir, wheel_install

#: command -> script (pyproject.toml's [project.scripts] and force-include list these)
COMMANDS = {
    "dpsub-reproduce": "reproduce.py",  # run a paper table's grid (docs/tables.md)
    "dpsub-table": "make_table.py",  # render a table from its runs
    "dpsub-summarize": "summarize_runs.py",  # a Markdown table of run dirs
    "dpsub-plot": "plot_runs.py",  # accuracy against steps and epsilon
    "dpsub-mia": "mia.py",  # membership inference on a finished run
}


def how_to_run(script: str) -> str:
    """What a user types to run ``scripts/<script>``: its console command in a wheel install
    (which has no scripts/ folder), else ``python scripts/<script>``."""
    command = {s: c for c, s in COMMANDS.items()}.get(script)
    return command if command and wheel_install() else f"python scripts/{script}"


def _run(command: str) -> None:
    """Run the script as ``__main__`` (like runpy.run_path, but argv[0] stays the command,
    so that the usage line names it)."""
    path = scripts_dir() / COMMANDS[command]
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    saved, sys.modules["__main__"] = sys.modules["__main__"], module
    sys.argv[0] = command
    try:
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = saved


def reproduce() -> None:
    _run("dpsub-reproduce")


def table() -> None:
    _run("dpsub-table")


def summarize() -> None:
    _run("dpsub-summarize")


def plot() -> None:
    _run("dpsub-plot")


def mia() -> None:
    _run("dpsub-mia")
