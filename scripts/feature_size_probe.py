"""``python scripts/feature_size_probe.py ARGS`` runs :mod:`dpsub.experiments.feature_size_probe`."""

from dpsub.experiments.feature_size_probe import cli

if __name__ == "__main__":
    cli()
