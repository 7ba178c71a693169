"""``python scripts/lanes.py ARGS`` runs :mod:`dpsub.experiments.lanes` (its docstring: the usage)."""

from dpsub.experiments.lanes import cli

if __name__ == "__main__":
    cli()
