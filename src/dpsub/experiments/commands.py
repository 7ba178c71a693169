"""The installed research commands and how a user runs them.

Each command is a console entry point (``[project.scripts]`` in pyproject.toml) naming a
module's ``main`` in :mod:`dpsub.experiments`; in a checkout ``python scripts/<script>`` is
the same (a wrapper of a few lines). Outputs go under the working directory in an install
(:func:`dpsub.paths.project_root`).
"""

from __future__ import annotations

from dpsub.paths import wheel_install

#: command -> script (pyproject.toml's [project.scripts] lists the same commands)
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
