"""``python scripts/heldout_eval.py ARGS`` runs :mod:`dpsub.experiments.heldout_eval` (its docstring: the usage)."""

import sys

from dpsub.experiments.heldout_eval import main

if __name__ == "__main__":
    sys.exit(main())
