"""Validation accuracy of finished runs on training images they did not train on.

For hyperparameter selection without touching the test set: a run trained on a
``dataset.train_size`` subset of the training split leaves the rest of that split
unused; this script evaluates each run's final model (``checkpoint.pt``) on a
class-balanced slice of those held-out images and writes ``validation.json`` into the
run dir. The subset is recomputed from the run's config, and the data fingerprint in
the checkpoint proves that it is the one the run trained on.

    python scripts/heldout_eval.py outputs/rgp_cpu/* --val-size 5000

The held-out images are not part of the private training set the run's epsilon
protects; choosing hyperparameters with them costs that set no privacy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dpsub.config import typed_group
from dpsub.data import load_dataset
from dpsub.data.datasets import _subset_indices  # the trainer's own subset
from dpsub.data.subsets import balanced_pick
from dpsub.models import build_model
from dpsub.rundir import CHECKPOINT, CONFIG, VALIDATION
from dpsub.training.checkpoint import fingerprint_matches, load_checkpoint
from dpsub.training.loop import evaluate


def fail(msg: str) -> None:
    print(f"heldout_eval: {msg}", file=sys.stderr)
    raise SystemExit(2)


from dpsub.training.ema import released_state  # noqa: E402


def heldout(cfg, val_size: int, val_seed: int, cache: dict):
    """(x, y, number of classes, the trained-on subset ``(x, y)``) for the run's config."""
    d = typed_group("dataset", cfg.dataset)  # a saved config's, with the schema's defaults
    if d.train_size is None:
        fail(f"dataset.train_size is not set in {cfg.out_dir}: no held-out training images")
    key = (d.name, str(cfg.data.root), d.image_size)
    if key not in cache:
        cache[key] = load_dataset(d.name, cfg.data.root, image_size=d.image_size)
    full = cache[key]
    idx = _subset_indices(full.train_y, int(d.train_size), full.num_classes, d.balanced, cfg.seed)
    mask = torch.ones(len(full.train_y), dtype=torch.bool)
    mask[idx] = False
    rest = mask.nonzero().flatten()
    g = torch.Generator().manual_seed(val_seed)
    val = rest[balanced_pick(full.train_y[rest], val_size, full.num_classes, g)]
    return (
        full.train_x[val],
        full.train_y[val],
        full.num_classes,
        (full.train_x[idx], full.train_y[idx]),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run dirs with config.yaml + checkpoint.pt")
    p.add_argument("--val-size", type=int, default=5000)
    p.add_argument("--val-seed", type=int, default=0, help="seed of the held-out slice")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cache: dict = {}
    for run in args.runs:
        if not (run / CONFIG).is_file() or not (run / CHECKPOINT).is_file():
            fail(f"{run}: needs {CONFIG} and {CHECKPOINT} (a finished run dir)")
        cfg = OmegaConf.load(run / CONFIG)
        ckpt = load_checkpoint(run)
        x, y, num_classes, trained = heldout(cfg, args.val_size, args.val_seed, cache)
        if not fingerprint_matches(ckpt, run, *trained):
            fail(f"{run}: the recomputed training subset is not the one the run trained on")
        mcfg = OmegaConf.to_container(cfg.model, resolve=True)
        model = build_model(mcfg.pop("name"), tuple(x.shape[1:]), num_classes, **mcfg)
        model.load_state_dict(released_state(ckpt["state"]))  # (the EMA weights if averaged)
        acc, loss = evaluate(model, x, y, int(cfg.train.eval_batch_size))
        out = {"val_accuracy": acc, "val_loss": loss, "val_size": len(y), "val_seed": args.val_seed}
        (run / VALIDATION).write_text(json.dumps(out, indent=2) + "\n")
        print(f"{run}\tval accuracy {100 * acc:.2f}%\tval loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
