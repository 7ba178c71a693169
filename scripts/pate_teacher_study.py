"""``python scripts/pate_teacher_study.py ARGS`` runs :mod:`dpsub.experiments.pate_teacher_study` (its docstring: the usage)."""

from dpsub.experiments.pate_teacher_study import main

if __name__ == "__main__":
    main()
