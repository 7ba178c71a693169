"""Membership-inference success of a finished run's model (loss-threshold attack, RGP §5.3).

    uv run python scripts/mia.py RUN_DIR [--examples 10000] [--seed S] [--data-root DIR]

Rebuilds the run's data exactly as it trained (its config.yaml: dataset, subset, aux
source and seed; the private training set is checked against the checkpoint's
fingerprint), loads the model from checkpoint.pt, and attacks it with ``examples``
private training examples (members) and as many held-out test examples (non-members;
those an aux source took are excluded). Prints one line and writes RUN_DIR/mia.json.

The success rate is computed from private data without noise: it is for the data
holder's audit, not covered by the run's epsilon (mia.json says so, and so does the run's
summary.json from then on, also after a resume). A missing run dir, config or checkpoint,
or a changed dataset, is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dpsub import rundir as runs
from dpsub.rundir import CHECKPOINT, CONFIG, MIA, SUMMARY, RunDir


class RunError(Exception):
    """A run dir that cannot be attacked; the message names it."""


def load(run_dir: Path, data_root: str | None):
    """The run restored from its checkpoint, and its step (RunError if anything is missing)."""
    try:
        RunDir(run_dir).require(CONFIG, CHECKPOINT)  # before torch is imported
    except runs.RunError as e:
        raise RunError(str(e)) from None
    from dpsub.errors import exit_code
    from dpsub.training.build import load_finished_run

    try:
        run = load_finished_run(run_dir, data_root)
    except runs.RunError as e:
        raise RunError(str(e)) from None
    except Exception as e:  # noqa: BLE001 -- dpsub's config/data errors become one line
        if exit_code(e) is None:
            raise
        raise RunError(f"{run_dir / CONFIG}: {e}") from None
    return run, run.step


def uncover_summary(run_dir: Path) -> None:
    """The run dir now holds an un-noised result: its summary says so (a resume keeps it so,
    as the trainer treats a run dir with mia.json as uncovered)."""
    path = run_dir / SUMMARY
    if not path.is_file():
        return
    summary = json.loads(path.read_text())
    reasons = summary.get("not_covered", [])
    summary["not_covered"] = reasons + [r for r in ["membership_inference"] if r not in reasons]
    summary["covered_by_epsilon"] = False
    path.write_text(json.dumps(summary, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--examples", type=int, default=None, help="members (= non-members) asked")
    ap.add_argument("--seed", type=int, default=None, help="selection seed (default: run seed)")
    ap.add_argument("--data-root", default=None, help="override the run's data.root")
    args = ap.parse_args(argv)
    if args.examples is not None and args.examples < 2:
        print(f"mia.py: --examples must be >= 2, got {args.examples}", file=sys.stderr)
        return 2
    try:
        run, step = load(args.run_dir, args.data_root)
    except RunError as e:
        print(f"mia.py: {e}", file=sys.stderr)
        return 2
    import torch

    from dpsub.eval.mia import evaluate_run

    torch.set_num_threads(1)
    result = evaluate_run(run, args.examples, args.seed)
    out = {
        "run_dir": str(args.run_dir),
        "step": step,
        "mechanism": run.mechanism.name,
        **{k.removeprefix("private/mia/"): v for k, v in result.items()},
        "covered_by_epsilon": False,  # computed from private data without noise
    }
    (args.run_dir / MIA).write_text(json.dumps(out, indent=2) + "\n")
    uncover_summary(args.run_dir)
    print(
        f"{args.run_dir}: membership-inference success {100 * out['success']:.2f}% "
        f"(95% CI {100 * out['ci_low']:.2f}-{100 * out['ci_high']:.2f}, "
        f"{out['examples']} examples) -> {args.run_dir / MIA}"
    )
    return 0


def cli() -> None:
    """The console command (pyproject.toml's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
