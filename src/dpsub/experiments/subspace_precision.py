"""Accuracy of the GEP anchor subspace when the power method runs in lower precision.

Computes anchor gradients of m auxiliary images (random labels) and the per-example
gradients of a private batch for a model, fits the grouped basis (t power iterations)
with fp32 / bf16 / fp16 matmuls from the same random start, and reports the relative
projection error ||(1/n) sum r_i|| / ||g|| of the private batch (GEP Figure 4) and the
mean per-example error, plus the fit time. TF32 needs an NVIDIA GPU (Ampere or newer).

    uv run python scripts/subspace_precision.py --dataset mnist --model mnist_cnn --k 500 --m 2000
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from dpsub.data import load_dataset
from dpsub.data.aux import build_aux
from dpsub.grads import GradEngine
from dpsub.models import build_model
from dpsub.subspace import (
    fit_grouped_basis,
    group_parameters,
    relative_error_of_mean,
    row_relative_errors,
)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--model", default="mnist_cnn")
    ap.add_argument("--root", default=os.environ.get("DPSUB_DATA", "./data"))
    ap.add_argument("--k", type=int, default=500)
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--n", type=int, default=1000, help="private batch size")
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--grouping", default="stages")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None, help="append the Markdown table here")
    args = ap.parse_args()

    torch.manual_seed(0)
    data = load_dataset(args.dataset, root=args.root)
    aux, data = build_aux(
        {"name": "natural", "num_samples": args.m, "labels": "random_once"}, data, args.root, 0
    )
    data, aux = data.to(args.device), aux.to(args.device)
    model = build_model(args.model, data.in_shape, data.num_classes).to(args.device)
    engine = GradEngine(model, microbatch=500)
    Ga = torch.cat([c.grads for c in engine.per_example(aux.x, aux.fixed_labels)])
    idx = torch.randperm(data.train_y.shape[0])[: args.n].to(args.device)
    G = torch.cat([c.grads for c in engine.per_example(data.train_x[idx], data.train_y[idx])])
    groups = group_parameters(engine.layout, args.grouping)
    dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
    rows = []
    for name, dt in dtypes:
        gen = torch.Generator(device=args.device).manual_seed(1)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        basis = fit_grouped_basis(
            Ga, groups, args.k, iters=args.iters, generator=gen, compute_dtype=dt
        )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt_ms = 1000 * (time.perf_counter() - t0)
        rows.append(
            (
                name,
                relative_error_of_mean(G, basis),
                row_relative_errors(G, basis).mean().item(),
                dt_ms,
            )
        )
    head = (
        f"{args.model} on {args.dataset}, m={args.m} natural aux images, k={args.k}, t={args.iters}, "
        f"grouping={args.grouping}, private batch n={args.n}, device={args.device}, untrained model"
    )
    lines = [
        f"**{head}**",
        "",
        "| precision | rel. projection error of the batch mean | mean per-example rel. error | fit ms |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {n} | {a:.4f} | {b:.4f} | {t:.0f} |" for n, a, b, t in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
