"""``python scripts/pate_teacher_probe.py ARGS`` runs :mod:`dpsub.experiments.pate_teacher_probe` (its docstring: the usage)."""

from dpsub.experiments.pate_teacher_probe import main

if __name__ == "__main__":
    main()
