"""Probe the teachers' SGD settings on the validation split (not the test set).

    uv run python scripts/pate_teacher_probe.py 0.05:10 0.01:10     # lr:epochs pairs

Trains the first 10 of the 250 MNIST teachers (seed 0, 5,000 training examples held out as
in results/pate/) with each lr and number of epochs, and prints their accuracy on the
held-out examples. A thin wrapper over dpsub.pate.teachers; results/pate/teacher_probe.txt.
"""

import sys

import torch

from dpsub.config import compose
from dpsub.data.validation import carve_validation
from dpsub.models import build_model
from dpsub.pate.teachers import TeacherOptions, predict_chunk, train_chunk
from dpsub.pate.votes import members, partition
from dpsub.training.build import load_data


def main(argv: list[str] | None = None) -> None:
    """Train the first 10 teachers with each ``lr:epochs`` pair and print their accuracy."""
    cfg = compose(["dataset=mnist", "device=cpu", "logger=disabled"], config_name="dpsub_pate")
    data = carve_validation(load_data(cfg), 5000, 0)
    parts = [torch.as_tensor(m) for m in members(partition(len(data.train_y), 250, 0), 250)][:10]

    def mk():
        return build_model("mnist_cnn", data.in_shape, 10)

    pairs = sys.argv[1:] if argv is None else argv
    for lr, ep in [(float(a), int(b)) for a, b in (s.split(":") for s in pairs)]:
        opts = TeacherOptions(epochs=ep, batch_size=32, lr=lr, momentum=0.9, chunk=10)
        base, p, b = train_chunk(mk, data.train_x, data.train_y, parts, 0, 0, opts)
        pred = predict_chunk(base, p, b, data.test_x, 200)
        acc = (pred == data.test_y.numpy()[None]).mean(1)
        print(
            f"lr {lr} epochs {ep}: validation accuracy of 10 teachers "
            f"mean {acc.mean():.3f} min {acc.min():.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
