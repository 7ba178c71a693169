"""``python scripts/gpu_run.py ARGS`` runs :mod:`dpsub.experiments.gpu_run` (its docstring: the usage)."""

import sys

from dpsub.experiments.gpu_run import main

if __name__ == "__main__":
    sys.exit(main())
