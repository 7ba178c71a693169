"""``python scripts/extract_features.py ARGS`` runs :mod:`dpsub.experiments.extract_features`."""

import sys

from dpsub.experiments.extract_features import main

if __name__ == "__main__":
    main(sys.argv[1:])
