"""``python scripts/profile_step.py ARGS`` runs :mod:`dpsub.experiments.profile_step` (its docstring: the usage)."""

from dpsub.experiments.profile_step import main

if __name__ == "__main__":
    main()
