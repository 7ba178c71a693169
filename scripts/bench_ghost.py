"""``python scripts/bench_ghost.py ARGS`` runs :mod:`dpsub.experiments.bench_ghost` (its docstring: the usage)."""

from dpsub.experiments.bench_ghost import main

if __name__ == "__main__":
    main()
