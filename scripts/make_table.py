"""``python scripts/make_table.py ARGS`` is ``dpsub-table ARGS`` (:mod:`dpsub.experiments.make_table`)."""

from dpsub.experiments.make_table import cli

if __name__ == "__main__":
    cli()
