"""PATE on MNIST as Papernot et al. (2018) ran it: row (b) of results/pate/ (issue 41).

    uv run python scripts/pate_paper_protocol.py budget    # queries per epsilon (tuning split)
    uv run python scripts/pate_paper_protocol.py final     # seeds x epsilons, semi-supervised
    uv run python scripts/pate_paper_protocol.py final --only seed0   # some run dirs only
    uv run python scripts/pate_paper_protocol.py ablation --only seed0  # row (a) -> (b), a step at a time
    uv run python scripts/pate_paper_protocol.py budget --setting mnist_paper_t20  # the
    uv run python scripts/pate_paper_protocol.py final --setting mnist_paper_t20   # teachers step

Needs the mnist_confident setting's tuning runs (``scripts/pate_study.py tune
mnist_confident``: its teachers' votes in ``outputs/pate_votes`` and its picks).

* ``budget``: for each epsilon, the aggregator picked for it by mnist_confident, run on the
  tuning split (seed 0, 5,000 training images held out; tuning is not charged, as in the
  papers) with the data-independent filter lifted and ``pate.max_queries`` = 500, 1000,
  ..., 9000; each count's data-dependent epsilon is released by smooth sensitivity (the
  noisy, covered value: the unnoised one is not looked at). The budget is the largest
  count whose released epsilon is within the target. Aggregation and release only (no
  student). Writes ``results/pate/runs/mnist_paper/budget.json``.
* ``final``: every seed at every epsilon with that pick and budget, the mnist_paper
  setting's overrides (release, FixMatch student), the teachers of the tuning runs
  (``pate.holdout``, ``pate.teacher_seed=0``), evaluated on the test split; small files
  copied to ``results/pate/runs/mnist_paper/final/``.
* ``ablation``: the steps between row (a) (GNMax, supervised student, data-independent
  budget) and row (b), one change at a time, with the same teachers as row (b):
  ``aggregator`` (Confident-GNMax's pick, supervised student, data-independent budget at
  the target) and ``student`` (the same with the FixMatch student); the last step,
  ``accounting`` (the budget by the released data-dependent epsilon), is row (b) itself.
  Run dirs ``ablation/<step>_seed<s>_eps<e>``.
* ``--setting mnist_paper_t20``: ``budget`` and ``final`` for the ablation's last step,
  row (b) with teachers trained 20 epochs (new teachers: ``budget`` trains them once
  into ``pate.votes_cache``: 22 minutes on one core here); the aggregator picks stay
  mnist_confident's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dpsub.experiments.pate_study import RESULTS, WORK, run_one, studies

NAME, FROM = "mnist_paper", "mnist_confident"
SETTINGS = ("mnist_paper", "mnist_paper_t20")  # row (b) and its teachers step
COUNTS = tuple(range(500, 9001, 500))
LIFTED = "privacy.epsilon=1000"  # the data-independent filter does not bind


def _picks() -> dict[int, str]:
    """mnist_confident's pick per epsilon: its local tuning runs, else the committed ones."""
    return studies.pate_picks(FROM, WORK) or studies.pate_picks(FROM, RESULTS)


def _overrides(e: int, picks: dict, name: str = NAME) -> list[str]:
    s = studies.PATE_SETTINGS[name]
    return [*s.overrides, *s.shared, *studies.PATE_SETTINGS[FROM].grid[picks[e]], LIFTED]


def _votes(cfg, pate, memo: dict):
    """The teachers' votes from ``pate.votes_cache`` (read once per process: ``memo``);
    teachers trained once if absent."""
    from dpsub.pate.pool import make_pools
    from dpsub.pate.run import load_or_compute_votes, teacher_seed, votes_key
    from dpsub.training.build import load_data, pick_device

    key = votes_key(cfg, pate)
    if key not in memo:
        data = load_data(cfg)
        pools = make_pools(
            data, pate.public_size, cfg.dataset.validation_size, True, teacher_seed(cfg, pate)
        )
        with tempfile.TemporaryDirectory() as tmp:
            memo[key] = load_or_compute_votes(
                cfg, pate, pools, pick_device(str(cfg.device)), Path(tmp)
            )
    return memo[key]


def budget(name: str = NAME) -> dict:
    from dpsub.cli.pate import JsonlMetrics
    from dpsub.config import compose
    from dpsub.pate.run import answer_queries, check_release, split

    picks, s, out, memo, votes = _picks(), studies.PATE_SETTINGS[name], {}, {}, {}
    for e in s.epsilons:
        base = [*_overrides(e, picks, name), f"seed={s.tune_seed}",
                f"dataset.validation_size={s.validation_size}"]  # fmt: skip
        released = {}
        for n in COUNTS:
            if (picks[e], n) in memo:
                released[n] = memo[(picks[e], n)]
                continue
            cfg, pate = split(compose([*base, f"pate.max_queries={n}"], config_name="dpsub_pate"))
            check_release(pate, 10)
            with tempfile.TemporaryDirectory() as tmp:
                st = answer_queries(cfg, pate, _votes(cfg, pate, votes), 10, Path(tmp),
                                    JsonlMetrics(Path(tmp) / "m"))  # fmt: skip
            released[n] = {"released_epsilon": st["release"]["epsilon"],
                           "answered": len(st["labels"]), "epsilon": st["ledger"].epsilon()}  # fmt: skip
            memo[(picks[e], n)] = released[n]
            print(f"eps {e} {picks[e]} max_queries {n}: {released[n]}", flush=True)
        within = [n for n in COUNTS if released[n]["released_epsilon"] <= e]
        out[e] = {"pick": picks[e], "max_queries": max(within) if within else None,
                  "counts": released}  # fmt: skip
    dest = RESULTS / name / "budget.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1) + "\n")
    return out


def final(only: str | None, name: str = NAME) -> None:
    s = studies.PATE_SETTINGS[name]
    plan = json.loads((RESULTS / name / "budget.json").read_text())
    picks = {int(e): v["pick"] for e, v in plan.items()}
    for seed in s.seeds:
        for e in s.epsilons:
            n = plan[str(e)]["max_queries"]
            run_dir = WORK / name / "final" / f"seed{seed}_eps{e}"
            if n is None or (only and only not in run_dir.name):
                continue
            run_one(run_dir, [*_overrides(e, picks, name), f"pate.max_queries={n}",
                              f"pate.holdout={s.validation_size}",
                              f"pate.teacher_seed={s.tune_seed}", f"seed={seed}"])  # fmt: skip


def ablation(only: str | None) -> None:
    s, picks = studies.PATE_SETTINGS[FROM], _picks()
    semi = [o for o in studies.PATE_SETTINGS[NAME].overrides if o.startswith("pate.student.")]
    steps = {"aggregator": [], "student": semi}
    for seed in studies.PATE_SETTINGS[NAME].seeds:
        for step, extra in steps.items():
            for e in s.epsilons:
                run_dir = WORK / NAME / "ablation" / f"{step}_seed{seed}_eps{e}"
                if only and only not in run_dir.name:
                    continue
                run_one(run_dir, [*s.overrides, *s.shared, *s.grid[picks[e]], *extra,
                                  f"pate.holdout={s.validation_size}",
                                  f"pate.teacher_seed={s.tune_seed}", f"seed={seed}",
                                  f"privacy.epsilon={e}"])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("stage", choices=("budget", "final", "ablation"))
    p.add_argument("--only", default=None, help="run only the dirs whose name contains this")
    p.add_argument("--setting", default=NAME, choices=SETTINGS, help="budget/final: which row")
    args = p.parse_args()
    if args.stage == "ablation" and args.setting != NAME:
        p.error("ablation: runs the steps up to row (b) only (--setting mnist_paper)")
    if args.stage == "budget":
        budget(args.setting)
    elif args.stage == "final":
        final(args.only, args.setting)
    else:
        ablation(args.only)


if __name__ == "__main__":
    main()
