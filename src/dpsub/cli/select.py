"""``dpsub-select``: choose hyper-parameters privately, from the command line.

::

    dpsub-select --grid optim.lr=0.05,0.1,0.2 --mean 5 --score-sigma 10 --out runs/pick \\
        experiment=demo dataset.validation_size=500

Papernot and Steinke's procedure (ICLR 2022; :func:`dpsub.select_privately`, docs/api.md)
over dpsub runs: a secret number K ~ ``Repetitions(mean, shape)`` of runs, each on a
candidate drawn uniformly from the grid (the product of the ``--grid`` axes, Hydra's sweep
syntax, times each ``--candidate 'KEY=V KEY=V'`` when given), each trained on the private
set less ``dataset.validation_size`` held-out examples and scored by its count of correct
held-out examples plus Gaussian noise of std ``--score-sigma``. Only the best run is kept:
``<out>/`` holds its ``config.yaml``, ``checkpoint.pt`` and ``ledger.json``, and
``selection.json`` its candidate, its noisy score, its test accuracy (the released model on
the public test set) and the epsilon of the whole search. Everything else (the other runs, every un-noised score, K itself) is deleted
and never printed: the search's epsilon holds because K stays secret.

The conditions the bound needs, checked before anything trains (a mistake is one line on
stderr, exit code 2, nothing written): every candidate's plan charges a fixed curve (a
private mechanism with planned accounting, no simulated noise level), and the search bounds
every run by the largest of them; each example's part is fixed by a keyed hash of its own
bytes (``dataset.validation_pick=hash``, set here), so one added or removed example moves no
other between the parts (a permutation of the positions would move many); the grid leaves the
data (``dataset``, ``data``, ``aux``, ``features``, ``experiment``) and ``seed`` alone (each
run's seed is drawn from ``--seed``'s stream, or the OS's with ``--secure``). A search stopped
part-way is not resumed, it starts over: with the same ``--seed`` it replays the same K and
draws; with ``--secure`` it draws anew, and whatever the stopped one showed counts too.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import shutil
import sys
import warnings
from pathlib import Path

from dpsub.cli.common import check_args, configure_logging, fail, interruptible
from dpsub.errors import ConfigError, exit_code
from dpsub.rundir import CHECKPOINT, CONFIG, LEDGER, SELECTION

#: Overrides every run of a search gets: each example's part fixed by its own hash, no console
#: output that could count the runs, nothing sent to W&B.
FORCED = ("dataset.validation_pick=hash", "train.progress=false", "logger.mode=disabled")
#: What a grid may not vary: the private data, its split and the runs' seeds.
FIXED = ("dataset", "data", "aux", "features", "experiment", "seed", "out_dir", "resume", "hydra")
#: What the kept run's folder holds (the run's own summary, metrics and log hold un-noised
#: validation scores, and are deleted with the other runs).
KEPT = (CONFIG, CHECKPOINT, LEDGER)
_FORCED_KEYS = {f.split("=", 1)[0] for f in FORCED}
log = logging.getLogger("dpsub")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every dpsub mistake
        fail(ConfigError(f"dpsub-select: {message} (dpsub-select --help)"))


def parse(argv: list[str]) -> argparse.Namespace:
    ap = _Parser(prog="dpsub-select", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="one axis of the candidate grid (repeat for a product)",
    )
    ap.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="'KEY=V KEY=V'",
        help="one candidate's overrides, space-separated (repeat; with --grid: each grid point "
        "times each candidate)",
    )
    ap.add_argument("--mean", type=float, required=True, help="the mean number of runs")
    ap.add_argument(
        "--shape",
        type=float,
        default=1.0,
        help="the law of K: inf Poisson, 1 geometric (default), 0 logarithmic",
    )
    ap.add_argument(
        "--score-sigma",
        type=float,
        required=True,
        help="std of the Gaussian noise on each run's count of correct examples",
    )
    ap.add_argument("--seed", type=int, default=0, help="K, the draws and the score noise")
    ap.add_argument(
        "--secure",
        action="store_true",
        help="K, the draws and the score noise from the OS (--seed ignored)",
    )
    ap.add_argument("--out", type=Path, required=True, help="where the kept run goes")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of every run")
    return ap.parse_intermixed_args(argv)  # fmt: skip


def split_candidate(text: str) -> list[str]:
    """A ``--candidate``'s overrides, split as a shell splits (``'k=[1, 2]'`` stays one)."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"--candidate {text}: {e}") from None


def every_override(args: argparse.Namespace) -> list[str]:
    """The overrides of every run, the grid's axes and each candidate's, in one list."""
    return [*args.overrides, *args.grid, *(o for c in args.candidate for o in split_candidate(c))]


def candidates(grid: list[str], listed: list[str] = ()) -> list[list[str]]:
    """The product of the ``--grid`` axes, times each ``--candidate`` (its overrides split at
    spaces, quotes as a shell's), as override lists (ConfigError naming a bad one)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not grid and not listed:
        raise ConfigError("--grid: give at least one axis (e.g. --grid optim.lr=0.05,0.1) or "
                          "--candidate")  # fmt: skip
    explicit = [split_candidate(c) for c in listed]
    for flag, item in [*(("--grid", a) for a in grid), *(("--candidate", o) for c in explicit
                                                         for o in c)]:  # fmt: skip
        key = item.split("=", 1)[0].lstrip("+~")
        if "=" not in item or key.split(".")[0] in FIXED:
            raise ConfigError(
                f"{flag} {item}: expected KEY=VALUE(S) over a key other than "
                f"{', '.join(FIXED)} (the data, its split and the seeds stay fixed)"
            )
    if any(not c for c in explicit):
        raise ConfigError("--candidate: empty; give its overrides, e.g. 'optim.lr=0.1'")
    points = [[]]
    if grid:
        try:
            parsed = OverridesParser.create().parse_overrides(grid)
        except Exception as e:  # noqa: BLE001 -- Hydra's grammar error, as one line
            raise ConfigError(f"--grid: {e}".splitlines()[0]) from None
        points = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    return [[*p, *c] for p in points for c in (explicit or [[]])]


def check_search(args: argparse.Namespace) -> tuple[list, object, object]:
    """Everything the search needs, checked before anything is written: ``(settings of
    each candidate, the bound on every run's RDP curve, the Repetitions)``."""
    import numpy as np

    from dpsub.config import check_environment, validate
    from dpsub.overrides import compose, config_context
    from dpsub.privacy.selection import Repetitions
    from dpsub.training.build import planned_run_rdp, private_data

    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out: {args.out} exists and is not empty")
    if args.score_sigma <= 0:
        raise ConfigError(f"--score-sigma: must be > 0, got {args.score_sigma}")
    try:
        repetitions = Repetitions(mean=args.mean, shape=args.shape)
    except ValueError as e:
        raise ConfigError(f"--mean/--shape: {e}") from None
    for o in every_override(args):
        if o.split("=", 1)[0].lstrip("+~") in _FORCED_KEYS:
            raise ConfigError(f"{o}: dpsub-select sets {' '.join(FORCED)} itself")
    settings = []
    with config_context():
        for cand in candidates(args.grid, args.candidate):
            s = validate(compose([*args.overrides, *FORCED, *cand]))
            check_environment(s.cfg)
            settings.append((cand, s))
    first = settings[0][1]
    if not first.dataset.validation_size:
        raise ConfigError("dataset.validation_size: set it: each run is scored on held-out data")
    n = int(private_data(first)[1].train_y.shape[0])  # the same for every candidate
    curves = []
    for _, s in settings:
        _check_covered(s)
        curve = planned_run_rdp(s, n)
        if curve is None:
            raise ConfigError(f"mechanism: {s.mechanism_name} is not private; nothing bounds it")
        curves.append(curve)
    return settings, np.max(curves, axis=0), repetitions


def _check_covered(s) -> None:
    """A run whose epsilon would not cover it cannot be part of a search that claims one."""
    from dpsub.data.aux_options import aux_options

    p, aux = s.privacy, aux_options(s.aux)
    for key, bad in (
        ("privacy.sampling", p.sampling != "poisson"),
        ("privacy.private_diagnostics", p.private_diagnostics),
        ("eval.mia", s.eval.mia),
        ("aux.pick", aux.get("name") == "public_train" and aux.get("pick") == "balanced"),
    ):
        if bad:
            raise ConfigError(f"{key}: its runs would not be covered by their epsilon")
    if s.dataset.train_size is not None:  # drawn with each run's own seed, by the labels
        raise ConfigError(
            "dataset.train_size: its subset is drawn with each run's seed, so the runs of a "
            "search would train (and be scored) on different examples than the bound counts; "
            "give the subset as its own dataset (dataset=npz) instead"
        )


def search(args: argparse.Namespace, settings: list, bound, repetitions) -> dict:
    """Train the secret number of runs in a scratch folder under ``--out``, keep the best
    one's files, delete the rest; return the selection record."""
    from dpsub.api.selection import select_privately
    from dpsub.privacy.accountants import rdp_to_epsilon
    from dpsub.training.build import private_data
    from dpsub.training.checkpoint import journal_ledger
    from dpsub.training.loop import train

    by_key = {tuple(cand): s for cand, s in settings}
    n_val = len(private_data(settings[0][1])[1].test_y)  # the held-out part as the hash drew it
    scratch = args.out / ".search"
    numbers = itertools.count()
    seeds = _seeds(args)

    def one_run(cand: tuple[str, ...]):
        run_dir = scratch / str(next(numbers))
        s = _with(by_key[cand], seed=next(seeds), out_dir=str(args.out))
        with _silent():
            result = train(s, run_dir)
        return run_dir, round(result.test_accuracy * n_val), journal_ledger(run_dir)

    made = not args.out.exists()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        chosen = select_privately(
            list(by_key), one_run, repetitions=repetitions, run_rdp=bound,
            score_sigma=args.score_sigma, delta=settings[0][1].privacy.delta,
            seed=args.seed, secure=args.secure,
        )  # fmt: skip
        if chosen.result is not None:
            for name in KEPT:
                shutil.move(str(chosen.result / name), str(args.out / name))
    except BaseException:  # a failed or interrupted search leaves nothing behind
        shutil.rmtree(scratch, ignore_errors=True)
        if made and not any(args.out.iterdir()):
            args.out.rmdir()
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    record = {
        "candidate": None if chosen.candidate is None else list(chosen.candidate),
        "validation_score": chosen.score,  # noisy count of correct held-out examples
        "validation_accuracy_noisy": None if chosen.score is None else chosen.score / n_val,
        "validation_size": n_val,  # held out (dataset.validation_size: their expected number)
        "validation_pick": settings[0][1].dataset.validation_pick,
        "epsilon": chosen.epsilon,
        "delta": chosen.delta,
        "epsilon_of_each_run": rdp_to_epsilon(bound, chosen.delta),
        "repetitions": {"mean": repetitions.mean, "shape": repetitions.shape},
        "score_sigma": args.score_sigma,
        "grid": args.grid,
        "candidates": args.candidate,
        "overrides": args.overrides,
        "randomness": "secure" if args.secure else f"seeded ({args.seed})",
        "covered_by_epsilon": True,
    }
    if chosen.candidate is not None:
        record["test_accuracy"] = _test_accuracy(args.out)
    (args.out / SELECTION).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _seeds(args: argparse.Namespace):
    """Each run's seed: random, so that the kept run's config does not count the runs
    before it (from ``--seed``, or the OS with ``--secure``)."""
    import secrets

    import numpy as np

    rng = np.random.default_rng([args.seed, 2**31 - 1])
    while True:
        yield secrets.randbelow(2**31) if args.secure else int(rng.integers(2**31))


def _with(s, **values):
    """``s`` with top-level config keys replaced (validated again)."""
    from dpsub.config import validate

    cfg = s.cfg.copy()
    for key, value in values.items():
        cfg[key] = value
    return validate(cfg)


@contextlib.contextmanager
def _silent():
    """No line of a run reaches the console: its scores are un-noised, and the number of
    its lines would count the runs. (Its own train.log goes to the scratch folder.)"""
    null = logging.NullHandler()
    log.addHandler(null)
    propagate, log.propagate = log.propagate, False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.removeHandler(null)
        log.propagate = propagate


def _test_accuracy(run_dir: Path) -> float:
    """The kept run's released model on the public test set."""
    from dpsub.training.build import load_data, load_finished_run
    from dpsub.training.loop import evaluate

    with _silent():
        run = load_finished_run(run_dir)
        data = load_data(run.settings)
        x, y = data.test_x.to(run.device), data.test_y.to(run.device)
        return evaluate(run.model, x, y, 1024)[0]


@interruptible
def cli() -> None:
    """``dpsub-select --grid KEY=V1,V2 --mean M --score-sigma S --out DIR [overrides]``."""
    args = parse(sys.argv[1:])
    check_args(every_override(args))
    configure_logging()
    try:
        settings, bound, repetitions = check_search(args)
    except Exception as e:  # noqa: BLE001 -- dpsub's own errors (config, data) as one line
        if exit_code(e) is None:
            raise
        fail(e)
    from dpsub.privacy.selection import selection_epsilon

    delta = settings[0][1].privacy.delta
    eps = selection_epsilon(bound, repetitions, delta, args.score_sigma)
    log.info(
        "select: %d candidates, K ~ Repetitions(mean %g, shape %g) runs, score noise %g; "
        "epsilon %.4f at delta %g for the whole search -> %s",
        len(settings), repetitions.mean, repetitions.shape, args.score_sigma, eps, delta,
        args.out,
    )  # fmt: skip
    record = search(args, settings, bound, repetitions)
    if record["candidate"] is None:
        log.info("select: no run was drawn (K = 0): nothing is released; %s", args.out / SELECTION)
        return
    log.info(
        "select: kept %s | noisy validation accuracy %.2f%% | test accuracy %.2f%% | "
        "epsilon %.4f (delta %g) | %s",
        " ".join(record["candidate"]), 100 * record["validation_accuracy_noisy"],
        100 * record["test_accuracy"], record["epsilon"], delta, args.out,
    )  # fmt: skip


if __name__ == "__main__":
    cli()
