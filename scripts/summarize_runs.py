"""``python scripts/summarize_runs.py ARGS`` is ``dpsub-summarize ARGS`` (:mod:`dpsub.experiments.summarize_runs`)."""

from dpsub.experiments.summarize_runs import cli

if __name__ == "__main__":
    cli()
