"""``python scripts/mutation_check.py ARGS`` runs :mod:`dpsub.experiments.mutations` (its docstring: the usage)."""

import sys

from dpsub.experiments.mutations import main

if __name__ == "__main__":
    sys.exit(main())
