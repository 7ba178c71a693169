"""PATE's teachers on MNIST: validation accuracy against epochs, width and augmentation.

    uv run python scripts/pate_teacher_study.py --teachers 10 --out results/pate/teachers

The first ``--teachers`` of the 250 MNIST teachers (the hash partition of seed 0, the
5,000 training examples of the tuning split held out, as in results/pate/) are trained
alone with each grid point's model and augmentation for up to ``--epochs`` epochs (SGD,
lr 0.01, momentum 0.9, batch 32, dpsub-pate's teacher settings), and evaluated on the
first ``--val`` held-out examples after epochs 5, 10, 20, 40 (never the test set). One
line per (point, epoch) goes to ``<out>/teachers.jsonl``; a finished point is skipped
when the script runs again. Width: mnist_cnn (16 / 32 channels, 26k parameters), and
cifar_cnn's two 5x5 conv layers (the 2017 paper's MNIST teacher is two conv layers and
a fully connected one) with 16 and 32 channels. Augmentation: the semi-supervised
student's weak view (a random shift of up to 2 pixels, dpsub.pate.student.augment).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dpsub.config import compose
from dpsub.data.validation import carve_validation
from dpsub.models import build_model
from dpsub.pate.student import augment
from dpsub.pate.teachers import _teacher_seed
from dpsub.pate.votes import hash_partition, members
from dpsub.training.build import load_data

MODELS = {
    "mnist_cnn": ("mnist_cnn", {}),
    "cnn16": ("cifar_cnn", {"channels": 16, "hidden": 64}),
    "cnn32": ("cifar_cnn", {"channels": 32, "hidden": 128}),
}
CHECKPOINTS = (5, 10, 20, 40)


def train_and_eval(model_key, aug, part, t, data, val, epochs, log):
    """One teacher on its partition; its validation accuracy at each checkpoint."""
    name, kw = MODELS[model_key]
    torch.manual_seed(_teacher_seed(0, t))
    model = build_model(name, data.in_shape, 10, **kw)
    gen = torch.Generator().manual_seed(_teacher_seed(0, t) + 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = data.train_x[part], data.train_y[part]
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(part), generator=gen)
        for i in range(0, len(part), 32):
            idx = order[i : i + 32]
            xb = augment(x[idx], gen, strong=False) if aug else x[idx]
            optim.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), y[idx]).backward()
            optim.step()
        if epoch in CHECKPOINTS:
            model.eval()
            with torch.no_grad():
                acc = float((model(val[0]).argmax(-1) == val[1]).float().mean())
            log(epoch, acc)


def table(path: Path) -> str:
    """Mean (min) validation accuracy of the teachers per grid point and epoch."""
    rows = [json.loads(line) for line in path.open()]
    points = list(dict.fromkeys(r["point"] for r in rows))
    cell = {
        (r["point"], r["epochs"]): f"{100 * r['mean']:.1f} ({100 * r['min']:.1f})" for r in rows
    }
    lines = ["| point | " + " | ".join(f"{e} epochs" for e in CHECKPOINTS) + " | seconds |",
             "|---|" + "---:|" * (len(CHECKPOINTS) + 1)]  # fmt: skip
    for pt in points:
        secs = next(r["seconds"] for r in rows if r["point"] == pt)
        cells = [cell.get((pt, e), "–") for e in CHECKPOINTS]
        lines.append(f"| {pt} | " + " | ".join(cells) + f" | {secs} |")
    return "\n".join(lines)


def plot(path: Path, dest: Path) -> None:
    """Mean validation accuracy against epochs, one line per grid point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in path.open()]
    fig, ax = plt.subplots(figsize=(6, 4))
    for pt in dict.fromkeys(r["point"] for r in rows):
        mine = [r for r in rows if r["point"] == pt]
        ax.plot([r["epochs"] for r in mine], [100 * r["mean"] for r in mine], marker="o", label=pt)
    ax.set(xscale="log", xlabel="epochs", ylabel="mean validation accuracy (%)",
           title="MNIST, 250 teachers (first 10), lr 0.01")  # fmt: skip
    ax.minorticks_off()
    ax.set_xticks(CHECKPOINTS, [str(c) for c in CHECKPOINTS])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dest, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--teachers", type=int, default=10)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--val", type=int, default=2000)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--table", action="store_true", help="print the table of <out>, plot it, exit")
    args = p.parse_args()
    if args.table:
        print(table(args.out / "teachers.jsonl"))
        plot(args.out / "teachers.jsonl", args.out / "teachers.png")
        return
    cfg = compose(["dataset=mnist", "device=cpu", "logger=disabled"], config_name="dpsub_pate")
    data = carve_validation(load_data(cfg), 5000, 0)
    val = (data.test_x[: args.val], data.test_y[: args.val])
    teacher_of = hash_partition(data.train_x.numpy(), data.train_y.numpy(), 250, 0)
    parts = [torch.as_tensor(m) for m in members(teacher_of, 250)][: args.teachers]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "teachers.jsonl"
    done = {json.loads(line)["point"] for line in path.open()} if path.is_file() else set()
    for model_key in args.models.split(","):
        for aug in (False, True):
            point = f"{model_key}_{'shift' if aug else 'noaug'}"
            if point in done:
                continue
            start, rows = time.time(), []
            for t, part in enumerate(parts):
                train_and_eval(model_key, aug, part, t, data, val, args.epochs,
                               lambda e, a, t=t, rows=rows: rows.append((t, e, a)))  # fmt: skip
            with path.open("a") as f:
                for epoch in sorted({e for _, e, _ in rows}):
                    accs = [a for _, e, a in rows if e == epoch]
                    line = {"point": point, "model": model_key, "augment": aug, "epochs": epoch,
                            "teachers": len(parts), "mean": sum(accs) / len(accs),
                            "min": min(accs), "max": max(accs), "accs": accs,
                            "seconds": round(time.time() - start, 1)}  # fmt: skip
                    f.write(json.dumps(line) + "\n")
                    print(json.dumps({k: v for k, v in line.items() if k != "accs"}), flush=True)


if __name__ == "__main__":
    main()
