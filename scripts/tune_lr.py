"""``python scripts/tune_lr.py ARGS`` runs :mod:`dpsub.experiments.tune_lr` (its docstring: the usage)."""

import sys

from dpsub.experiments.tune_lr import main

if __name__ == "__main__":
    sys.exit(main())
