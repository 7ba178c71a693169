"""Extraction cost and non-private linear-probe accuracy of a frozen extractor at several
resizes (docs/features.md: how ``features=efficientnet_lite0``'s image_size was chosen).

For each size: wall-clock and CPU seconds per image of the extraction (one batch loop over
``--time-images`` training images, the threads torch is given; the CPU time does not grow
with the machine's load), then a logistic regression (scikit-learn,
non-private; features standardized with the probe set's own statistics, C chosen on the
validation images from a small grid) trained on ``--train`` random training images and
scored on ``--val`` other training images: a validation split, never the test set. The
features go through the project's cache (``--cache-dir``), so a rerun only trains probes::

    OMP_NUM_THREADS=1 nice -n 10 uv run python scripts/feature_size_probe.py \\
        --root <cifar10 root> --sizes 96 128 160 224 --train 2000 --val 1000
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch


def probe(train, ytr, val, yval, grid=(0.01, 0.1, 1.0)) -> tuple[float, float]:
    """(best validation accuracy, its C) of a logistic regression on standardized features."""
    from sklearn.linear_model import LogisticRegression

    mu, sd = train.mean(0), train.std(0) + 1e-6
    a, b = (train - mu) / sd, (val - mu) / sd
    scores = [(LogisticRegression(C=c, max_iter=3000).fit(a, ytr).score(b, yval), c) for c in grid]
    return max(scores)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="data.root holding CIFAR-10")
    p.add_argument("--name", default="efficientnet_lite0", help="features.name")
    p.add_argument("--sizes", type=int, nargs="+", default=[96, 128, 160, 224])
    p.add_argument("--train", type=int, default=2000, help="probe training images")
    p.add_argument(
        "--val", type=int, default=1000, help="validation images (other training images)"
    )
    p.add_argument("--time-images", type=int, default=200, help="images the cost is timed on")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default="outputs/cache")
    p.add_argument("--out", help="append one JSON line per size to this file")
    args = p.parse_args(argv)

    from dpsub.data.datasets import load_dataset
    from dpsub.features import _to_unit
    from dpsub.features.cache import cached_features, run_extractor
    from dpsub.features.extractors import build_extractor

    data = load_dataset("cifar10", args.root)
    x = _to_unit(data.train_x, data.mean, data.std)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    tr, va = perm[: args.train], perm[args.train : args.train + args.val]
    ext, ident = build_extractor({"name": args.name}, data.in_shape, Path(args.root))
    y = data.train_y.numpy()
    for size in args.sizes:
        t0, c0 = time.perf_counter(), time.process_time()
        run_extractor(ext, x[: args.time_images], args.batch, size)
        wall = (time.perf_counter() - t0) / args.time_images
        cpu = (time.process_time() - c0) / args.time_images

        def feats(idx, what, size=size):
            f = cached_features(ext, ident, x[idx], Path(args.cache_dir), args.batch, size, what)
            return f.flatten(1).numpy()

        acc, c = probe(feats(tr, "probe train"), y[tr], feats(va, "validation"), y[va])
        row = {
            "name": args.name, "image_size": size, "s_per_image": round(wall, 4),
            "cpu_s_per_image": round(cpu, 4), "load": round(os.getloadavg()[0], 1),
            "threads": torch.get_num_threads(), "train": args.train, "val": args.val,
            "val_acc": round(float(acc), 4), "C": c,
        }  # fmt: skip
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


def cli() -> None:
    np.set_printoptions(precision=4)
    main()


if __name__ == "__main__":
    cli()
