"""``python scripts/reproduce.py ARGS`` is ``dpsub-reproduce ARGS`` (:mod:`dpsub.experiments.reproduce`)."""

from dpsub.experiments.reproduce import cli

if __name__ == "__main__":
    cli()
