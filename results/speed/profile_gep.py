"""Where the time of one GEP step goes on this machine: phase by phase, median of reps.

The run is composed exactly as ``scripts/bench.py`` composes it (synthetic data shaped
like the model's input, batch B, m Gaussian anchors, k basis vectors); each phase of
:meth:`dpsub.mechanisms.gep.GEP.step` is then timed on its own, with the alternatives
this issue compares beside it (bf16 anchors and power step; the book-keeping residual
against the materialized one), and a non-private step as the yardstick.

    OMP_NUM_THREADS=1 python results/speed/profile_gep.py resnet20 256 512 256 --reps 3
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from dpsub.config import validate
from dpsub.grads import ClippedResidualSum, clipped_sum, finite_norms
from dpsub.subspace import GroupedPowerStep, grouped_quota, random_starts
from dpsub.training.build import build_run

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fit_phases(mech, rng, anchor: str, power: str, T: dict):
    """Anchor gradients, power step and QR of one subspace fit, timed separately."""
    mech.opts.anchor_precision = anchor
    quota = grouped_quota(mech.groups, mech.opts.num_bases, len(mech.aux))
    step = GroupedPowerStep(
        mech.groups, random_starts(mech.groups, quota, rng, "cpu"), mech.engine.dim, power
    )
    chunks = mech.anchor_chunks(rng)
    while True:
        t = time.perf_counter()
        G = next(chunks, None)
        T[f"anchor gradients ({anchor})"] += time.perf_counter() - t
        if G is None:
            break
        t = time.perf_counter()
        step.add(G)
        T[f"power step matmuls ({power})"] += time.perf_counter() - t
    t = time.perf_counter()
    basis = step.finish()
    T[f"QR ({power} fit)"] += time.perf_counter() - t
    return basis


def step_phases(run, basis, T: dict) -> None:
    """Private phases of a step with a given basis (book-keeping and materialized)."""
    B = run.cfg.train.batch_size
    x, y = run.data.train_x[:B], run.data.train_y[:B]
    t = time.perf_counter()
    chunks = [c.grads for c in run.engine.per_example(x, y)]
    T["private per-example gradients"] += time.perf_counter() - t
    for G in chunks:
        t = time.perf_counter()
        G, norms, _ = finite_norms(G)
        W = basis.embed(G)
        clipped_sum(W, 1.0)
        T["embed + clip embedding"] += time.perf_counter() - t
        t = time.perf_counter()
        acc = ClippedResidualSum(1.0)
        acc.add(G, W, basis.residual_norms(norms, W))
        acc.sum(basis.reconstruct, basis.dim, "cpu")
        T["residual, book-keeping"] += time.perf_counter() - t
        t = time.perf_counter()
        clipped_sum(basis.residual(G, W), 1.0)
        T["residual, materialized (replaced)"] += time.perf_counter() - t
    t = time.perf_counter()
    run.engine.mean_gradient(x, y)
    T["non-private gradient (yardstick)"] += time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("batch", type=int)
    p.add_argument("m", type=int)
    p.add_argument("k", type=int)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    bench = load_bench()
    args = argparse.Namespace(
        batch_size=a.batch, microbatch=a.batch, device="cpu", seed=0, aux_size=a.m, override=[]
    )
    cfg = bench.compose_cfg(bench.run_overrides(a.model, "gep", "vmap", {"num_bases": a.k}, args))
    validate(cfg)
    run = build_run(cfg)
    reps: list[dict] = []
    for _ in range(a.reps):
        T: dict = defaultdict(float)
        basis = fit_phases(run.mechanism, run.rng, "fp32", "fp32", T)
        t = time.perf_counter()
        basis.grams()
        T["B B^T per fit (book-keeping)"] += time.perf_counter() - t
        fit_phases(run.mechanism, run.rng, "bf16", "bf16", T)
        step_phases(run, basis, T)
        reps.append(T)
    head = f"phase ({a.model}, B={a.batch}, m={a.m}, k={a.k}, 1 thread)"
    print(f"| {head} | ms (median of {a.reps}) |")
    print("|---|---:|")
    for key in reps[0]:
        print(f"| {key} | {statistics.median(r[key] for r in reps) * 1e3:.0f} |")


if __name__ == "__main__":
    main()
