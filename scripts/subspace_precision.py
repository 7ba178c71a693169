"""``python scripts/subspace_precision.py ARGS`` runs :mod:`dpsub.experiments.subspace_precision` (its docstring: the usage)."""

from dpsub.experiments.subspace_precision import main

if __name__ == "__main__":
    main()
