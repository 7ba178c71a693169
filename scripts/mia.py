"""``python scripts/mia.py ARGS`` is ``dpsub-mia ARGS`` (:mod:`dpsub.experiments.mia`)."""

from dpsub.experiments.mia import cli

if __name__ == "__main__":
    cli()
