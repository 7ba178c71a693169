"""``python scripts/pdpsgd_study.py ARGS`` runs :mod:`dpsub.experiments.pdpsgd_study` (its docstring: the usage)."""

import sys

from dpsub.experiments.pdpsgd_study import main

if __name__ == "__main__":
    sys.exit(main())
