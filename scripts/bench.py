"""``python scripts/bench.py ARGS`` runs :mod:`dpsub.experiments.benchmark` (its docstring: the usage)."""

import sys

from dpsub.experiments.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
