"""Learning-rate tuning on a validation split carved from the private training set.

For each learning rate of a grid, one real run (the trainer's own
:func:`~dpsub.training.build.build_run` and :func:`~dpsub.training.build.train_step`) of the
experiment given by Hydra overrides, except that ``--val-size`` class-balanced examples
of the private training set are held out first and take the place of the test set:
the run trains on the rest and is scored on them, so the test set is never looked at.
The held-out examples are those ``dataset.validation_size`` would hold out
(:func:`dpsub.data.validation.carve_validation`, seeded by the run seed: the same split
for every learning rate and mechanism), taken before any auxiliary examples.

As in the papers, the privacy cost of the tuning runs is not counted. Their private
set is ``--val-size`` smaller than the real one (so q and the step count differ a little).

Usage::

    python scripts/tune_lr.py --out results/pdpsgd/tuning/mnist_pdpsgd --lrs 0.1 0.2 0.5 \\
        -- experiment=pdp_mnist_pdpsgd privacy.noise_multiplier=10

Writes ``<out>/lr_<lr>.json`` per run (validation accuracy and loss, epsilon, steps,
sizes, the resolved config) and ``<out>/tuning.json`` with every ``lr_*.json`` in
``<out>`` (so a grid may be split over several invocations) and the best learning rate;
prints one line per run. A bad override or data path: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from hydra.errors import HydraException
from omegaconf import OmegaConf

from dpsub.config import compose
from dpsub.data.validation import carve_validation  # dataset.validation_size's
from dpsub.errors import ConfigError, exit_code


def configs(overrides: list[str], lrs: list[float]) -> list:
    """The validated config of every run, before any of them starts."""
    from dpsub.config import validate
    from dpsub.paths import conf_dir

    for o in overrides:  # an unknown experiment would silently be skipped ("optional")
        name = o.removeprefix("experiment=")
        if name != o and not (conf_dir() / "experiment" / f"{name}.yaml").is_file():
            raise ValueError(f"experiment: no conf/experiment/{name}.yaml")
    cfgs = [compose([*overrides, f"optim.lr={lr}", "logger.mode=disabled"]) for lr in lrs]
    for cfg in cfgs:
        validate(cfg)
    return cfgs


def one_run(cfg, val_size: int) -> dict:
    """Train on the carved training set; score on the held-out part."""
    from dpsub.training.build import build_run, load_data, train_step
    from dpsub.training.loop import evaluate

    try:
        data = carve_validation(load_data(cfg), val_size, int(cfg.seed))
    except ConfigError as e:  # the size came from --val-size
        raise ValueError(f"--val-size: {str(e).split(': ', 1)[1]}") from None
    run = build_run(cfg, data=data)
    t0 = time.perf_counter()
    while run.step < run.total_steps:
        if train_step(run).stopped_by_budget:
            break
    acc, loss = evaluate(run.model, run.data.test_x, run.data.test_y, cfg.train.eval_batch_size)
    return {
        "lr": float(cfg.optim.lr),
        "val_accuracy": acc,
        "val_loss": loss,
        "steps": run.step,
        "noise_multiplier": run.z,
        "epsilon": run.ledger.epsilon() if run.ledger is not None else float("inf"),
        "n_train": int(len(run.data.train_y)),
        "n_val": int(len(run.data.test_y)),
        "seconds": time.perf_counter() - t0,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the per-run JSON files")
    ap.add_argument("--lrs", required=True, type=float, nargs="+", help="the learning-rate grid")
    ap.add_argument("--val-size", type=int, default=1000, help="held-out training examples")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    try:
        for lr, cfg in zip(args.lrs, configs(args.overrides, args.lrs), strict=True):
            r = one_run(cfg, args.val_size)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"lr_{lr:g}.json").write_text(json.dumps(r, indent=1))
            results.append(r)
            print(
                f"lr {lr:g}: val accuracy {r['val_accuracy']:.4f} | val loss {r['val_loss']:.4f}"
                f" | {r['steps']} steps | {r['seconds']:.0f} s",
                flush=True,
            )
    except Exception as e:  # noqa: BLE001 -- config and data errors become one line
        if exit_code(e) is None and not isinstance(e, ValueError | HydraException):
            raise
        print(f"tune_lr: {e}", file=sys.stderr)
        return 2
    # every run in the folder, also those of earlier invocations (one grid split over jobs)
    runs = [json.loads(f.read_text()) for f in sorted(args.out.glob("lr_*.json"))]
    runs = sorted(runs, key=lambda r: r["lr"])
    best = max(runs, key=lambda r: r["val_accuracy"])
    summary = {"overrides": args.overrides, "val_size": args.val_size, "best_lr": best["lr"]}
    summary["runs"] = [{k: v for k, v in r.items() if k != "config"} for r in runs]
    (args.out / "tuning.json").write_text(json.dumps(summary, indent=1))
    print(f"best lr {best['lr']:g} (val accuracy {best['val_accuracy']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
