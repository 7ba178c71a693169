"""Extract and cache the frozen features a ``dpsub-train`` run with these overrides would use,
and train nothing (docs/features.md). Resumable: run it again after a kill and it continues
after the last written batch; a later ``dpsub-train`` with the same data and ``features.*``
reads the cache::

    DPSUB_CACHE=<cache dir> OMP_NUM_THREADS=1 nice -n 10 uv run python scripts/extract_features.py \\
        dataset=cifar10 features=efficientnet_lite0 data.root=<cifar10 root>
"""

from __future__ import annotations

import logging
import sys
import time


def main(argv: list[str]) -> None:
    from dpsub.config import check_environment, compose, validate
    from dpsub.errors import exit_code

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    start = time.time()
    try:  # a bad override or a missing file (package, weights): one line, nothing written
        cfg = compose(argv)
        validate(cfg)
        check_environment(cfg)
    except Exception as e:
        if exit_code(e) is None:
            raise
        print(f"extract_features: {e}", file=sys.stderr)
        sys.exit(exit_code(e))
    from dpsub.training.build import load_data

    data = load_data(cfg)
    print(
        f"features of {data.name}: train {tuple(data.train_x.shape)}, test "
        f"{tuple(data.test_x.shape)}, {time.time() - start:.0f} s",
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
