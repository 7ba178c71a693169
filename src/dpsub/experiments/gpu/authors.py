"""Optional side by side: one GEP step of the GEP authors' code, timed at our bench's sizes.

``--gep-authors PATH`` names a checkout of the authors' repository (fetched separately,
never copied into dpsub). This module imports its ``models`` package (``resnet20``,
``GEP``) from PATH and times the per-step sequence of their training loop (anchor
subspace from the auxiliary gradients, per-example gradients by BackPACK, embedding and
residual clipping, noise, reconstruction) on random CIFAR-shaped data, batch 1000, 2000
anchors, 1000 bases. Their code needs ``backpack-for-pytorch`` (and ``einops``): stage
their wheels into ``.gpu/wheels``. Their ``np.int`` (removed in NumPy 1.24) is aliased to
``int`` in this process only.

    python -m dpsub.experiments.gpu.authors PATH --out FILE.json [--tiny]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

MARKER = Path("models") / "basis_matching.py"


def run(kit, d: Path, end: float) -> str:
    """Called by the bench step: a note, and ``gep_authors.json`` in ``d`` when timed."""
    path = kit.opts.gep_authors
    if path is None:
        return "not run: no --gep-authors PATH given (the authors' code is never in dpsub)"
    path = Path(path)
    if not (path / MARKER).is_file():
        return f"not run: {path} is not a checkout of the GEP authors' code ({MARKER} missing)"
    if importlib.util.find_spec("backpack") is None:
        return "not run: backpack-for-pytorch is not installed (stage its and einops' wheels)"
    argv = [sys.executable, "-m", "dpsub.experiments.gpu.authors", str(path), "--out",
            str(d / "gep_authors.json")] + (["--tiny"] if kit.opts.tiny else [])  # fmt: skip
    rc = kit.child(argv, d / "gep_authors.log", end - time.time())
    return "timed: gep_authors.json" if rc == 0 else f"failed (exit {rc}): gep_authors.log"


def time_step(path: Path, batch: int, aux: int, bases: int, steps: int, device: str) -> dict:
    import numpy as np
    import torch
    from torch import nn

    if not hasattr(np, "int"):
        np.int = int  # their code's alias, removed from NumPy
    sys.path.insert(0, str(path))
    from backpack import backpack, extend
    from backpack.extensions import BatchGrad
    from models import GEP, resnet20

    torch.manual_seed(0)
    net = extend(resnet20().to(device))
    loss_func = extend(nn.CrossEntropyLoss(reduction="sum"))
    gep = GEP(bases, batch, 5.0, 2.0, 1).to(device)
    gep.public_inputs = torch.randn(aux, 3, 32, 32, device=device)
    gep.public_targets = torch.randint(10, (aux,), device=device)
    n = sum(p.numel() for p in net.parameters())
    gep.num_param_list = [n // 3, n // 3, n - 2 * (n // 3)]  # their 3 groups
    net.gep = gep
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(10, (batch,), device=device)

    def step() -> None:
        net.zero_grad()
        gep.get_anchor_space(net, loss_func=loss_func)
        net.zero_grad()
        with backpack(BatchGrad()):
            loss_func(net(x), y).backward()
        rows = [p.grad_batch.reshape(batch, -1) for p in net.parameters()]
        for p in net.parameters():
            del p.grad_batch
        theta, residual, _ = gep(torch.cat(rows, dim=1))
        theta = theta + torch.randn_like(theta)
        _ = gep.get_approx_grad(theta) + residual + torch.randn_like(residual)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    step()
    ms = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"code": "GEP authors (dayu11/Gradient-Embedding-Perturbation)", "path": str(path),
            "batch_size": batch, "aux_size": aux, "num_bases": bases, "device": device,
            "median_ms": statistics.median(ms), "step_ms": ms, "params": n}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    sizes = (8, 16, 4) if a.tiny else (1000, 2000, 1000)
    rec = time_step(a.path, *sizes, a.steps, device)
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"GEP authors' step: {rec['median_ms']:.1f} ms (median of {a.steps}) on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
