"""Time book-keeping ghost clipping against materialized per-example gradients and plain SGD.

For each model, at one batch size, it times three computations on the same batch:

* ``nonprivate``: ``model(x)``, mean cross-entropy, ``backward()`` (grads set to None first);
* ``ghost``: :meth:`dpsub.grads.ghost.GhostClipper.clipped_sum` (one micro-batch);
* ``vmap``: ``vmap(grad(loss_i))`` per-example gradients flattened to ``(b, p)``, then
  :func:`dpsub.grads.clip.clipped_sum` (materialize + clip, the GradEngine default).

The three are interleaved within each repetition (after one warm-up round), so that load
drift on a shared machine hits them alike; the median over repetitions is reported.
Runs with ``torch.set_num_threads(threads)`` (1 by default).

    python scripts/bench_ghost.py --models mnist_cnn resnet20 --batch 256 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from dpsub.grads.clip import clipped_sum
from dpsub.grads.ghost import GhostClipper
from dpsub.grads.layout import ParamLayout
from dpsub.models import build_model

SHAPES = {"mnist_cnn": (1, 28, 28), "lenet": (1, 28, 28), "resnet20": (3, 32, 32)}


def methods(model, x, y, clip: float, strategy: str, keep_bytes: int):
    """The three timed closures: name -> callable."""
    layout = ParamLayout.of(model)
    params = [p for p in model.parameters() if p.requires_grad]
    ghost = GhostClipper(model, x.shape[0], strategy=strategy, keep_bytes=keep_bytes)

    def loss_i(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_example = vmap(grad(loss_i), in_dims=(None, 0, 0))

    def nonprivate():
        for p in params:
            p.grad = None
        F.cross_entropy(model(x), y).backward()

    def vmap_ref():
        named = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
        g = layout.flatten(per_example(named, x, y), batch=True)
        return clipped_sum(g, clip)

    return {
        "nonprivate": nonprivate,
        "ghost": lambda: ghost.clipped_sum(x, y, clip),
        "vmap": vmap_ref,
    }


def bench(name: str, batch: int, reps: int, strategy: str, keep_bytes: int) -> dict[str, float]:
    """Median seconds of each method on one random batch of ``name``."""
    torch.manual_seed(0)
    shape = SHAPES[name]
    model = build_model(name, shape, 10)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    fns = methods(model, x, y, 1.0, strategy, keep_bytes)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(reps + 1):  # round 0 warms up
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mnist_cnn", "resnet20"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--strategy", default="auto", choices=["auto", "ghost", "materialize"])
    ap.add_argument("--keep-bytes", type=int, default=1 << 30, help="GhostClipper keep_bytes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
        f"median of {args.reps} interleaved reps, strategy {args.strategy}"
    )
    for name in args.models:
        t = bench(name, args.batch, args.reps, args.strategy, args.keep_bytes)
        base = t["nonprivate"]
        cells = ", ".join(f"{k} {v * 1e3:.0f} ms ({v / base:.2f}x)" for k, v in t.items())
        print(f"{name}: {cells}")


if __name__ == "__main__":
    main()
