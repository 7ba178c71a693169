"""Run the PATE rows of GEP's Table 1 and copy their small files to results/pate/runs.

    uv run python scripts/pate_study.py tune mnist          # the grid, validation split, seed 0
    uv run python scripts/pate_study.py final mnist         # every seed x epsilon with the picks
    uv run python scripts/pate_study.py tune mnist --only eps2   # run dirs whose name has "eps2"
    uv run python scripts/make_table.py --study pate        # the table (results/pate/README.md)

A thin wrapper over dpsub.experiments.studies (PATE_SETTINGS, the picks) and dpsub.cli.pate.run_pate.
Runs go to outputs/pate_study/ (their private/votes.npy stays there); a finished run's
config.yaml, summary.json, metrics.jsonl and train.log are copied under results/pate/runs/.
A finished run is not run again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpsub.experiments import studies
from dpsub.paths import project_root
from dpsub.rundir import RunDir

ROOT = project_root()  # the repository (an install: the working directory)

WORK = ROOT / "outputs" / "pate_study"
RESULTS = ROOT / "results" / "pate" / "runs"


def run_one(run_dir: Path, overrides: list[str]) -> None:
    from dpsub.cli.common import configure_logging
    from dpsub.cli.pate import run_pate
    from dpsub.config import compose

    dest = RESULTS / run_dir.relative_to(WORK)
    if not RunDir(run_dir).finished:
        configure_logging()
        cfg = compose(overrides, config_name="dpsub_pate")
        resume = RunDir(run_dir).config_path.is_file()  # a killed run continues
        run_pate(cfg, run_dir, resume=resume)
    RunDir(run_dir).copy_small_files(dest)
    print(f"pate_study: {dest.relative_to(ROOT)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("stage", choices=("tune", "final"))
    p.add_argument("setting", choices=sorted(studies.PATE_SETTINGS))
    p.add_argument("--only", default=None, help="run only the dirs whose name contains this")
    args = p.parse_args()
    if args.stage == "tune":
        runs = studies.pate_tune_runs(args.setting, WORK)
    else:
        chosen = studies.pate_picks(args.setting, WORK)
        if not chosen:
            print(f"pate_study: no finished tuning runs of {args.setting}", file=sys.stderr)
            sys.exit(2)
        runs = studies.pate_final_runs(args.setting, WORK, chosen)
    for run_dir, overrides in runs:
        if args.only is None or args.only in run_dir.name:
            run_one(run_dir, overrides)


if __name__ == "__main__":
    main()
