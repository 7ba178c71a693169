"""``python scripts/private_tuning.py ARGS`` runs :mod:`dpsub.experiments.private_tuning` (its docstring: the usage)."""

import sys

from dpsub.experiments.private_tuning import main

if __name__ == "__main__":
    sys.exit(main())
