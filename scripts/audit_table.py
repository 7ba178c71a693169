"""``python scripts/audit_table.py ARGS`` runs :mod:`dpsub.experiments.audit_table` (its docstring: the usage)."""

import sys

from dpsub.experiments.audit_table import main

if __name__ == "__main__":
    sys.exit(main())
