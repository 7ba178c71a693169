"""``python scripts/bench_scaling.py ARGS`` runs :mod:`dpsub.experiments.bench_scaling` (its docstring: the usage)."""

import sys

from dpsub.experiments.bench_scaling import main

if __name__ == "__main__":
    sys.exit(main())
