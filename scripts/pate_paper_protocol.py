"""``python scripts/pate_paper_protocol.py ARGS`` runs :mod:`dpsub.experiments.pate_paper_protocol` (its docstring: the usage)."""

from dpsub.experiments.pate_paper_protocol import main

if __name__ == "__main__":
    main()
