"""``python scripts/gep_staleness.py ARGS`` runs :mod:`dpsub.experiments.gep_staleness` (its docstring: the usage)."""

import sys

from dpsub.experiments.gep_staleness import main

if __name__ == "__main__":
    sys.exit(main())
