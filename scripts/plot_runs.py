"""``python scripts/plot_runs.py ARGS`` is ``dpsub-plot ARGS`` (:mod:`dpsub.experiments.plot_runs`)."""

from dpsub.experiments.plot_runs import cli

if __name__ == "__main__":
    cli()
