"""The tables of the results studies that are not paper tables (``results/<study>/``).

``render(study, runs)`` returns the Markdown table of ``results/<study>/README.md`` from the
run folders under ``runs`` (default ``results/<study>/runs``); ``collect(study, src)``
first copies the small files of the finished runs under ``src`` there (never checkpoints).
``python scripts/make_table.py --study <name> [--collect DIR]`` is the command line.

* ``speed``: GEP's test accuracy against the subspace cadence s, mean ± std [95% interval]
  over seeds, each row compared with the paper's procedure (s = 1, random starts) on the same
  dataset by a Welch test;
* ``rgp``: one row per run (mechanism x lr), held-out and test accuracy;
* ``dphero``: DP-Hero's scales and the membership-inference runs;
* ``pdpsgd``: Welch tests of the historical PDP-SGD study from its ``runs.csv``;
* ``pate``: the PATE rows of GEP's Table 1 beside the paper, both epsilons, the tuning
  grid (``PATE_SETTINGS``; runs made by ``scripts/pate_study.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dpsub.data.registry import published_train_size
from dpsub.experiments import stats
from dpsub.paths import project_root
from dpsub.rundir import MIA, VALIDATION, RunDir, find_runs

__all__ = ["STUDIES", "collect", "render", "study_dir"]


def study_dir(study: str) -> Path:
    return project_root() / "results" / study / "runs"


# ----------------------------------------------------------------- speed
def _speed_cell(run: RunDir) -> tuple[str, int, bool, int, dict]:
    cfg = run.config_dict()
    m = cfg["mechanism"]
    return cfg["dataset"]["name"], m["subspace_every"], m["warm_start"], cfg["seed"], run.summary()


def _speed_dest(run: RunDir) -> str:
    ds, s, warm, seed, _ = _speed_cell(run)
    return f"{ds}/seed{seed}/s{s}_{'warm' if warm else 'cold'}"


def speed(runs: Path) -> str:
    groups: dict[tuple, dict[int, float]] = defaultdict(dict)
    eps = []
    for run in find_runs(runs):
        ds, s, warm, seed, summary = _speed_cell(run)
        groups[(ds, s, warm)][seed] = 100 * summary["test_accuracy"]
        eps.append(summary["epsilon"])
    lines = [
        "| dataset | s | start of each refit | test accuracy (%) | per seed | vs s = 1, random |",
        "|---|---:|---|---:|---|---:|",
    ]
    for (ds, s, warm), accs in sorted(groups.items()):
        vals = [accs[k] for k in sorted(accs)]
        base = groups.get((ds, 1, False))
        vs = (
            "–"
            if (s, warm) == (1, False) or not base
            else stats.compare(list(base.values()), vals).text()
        )
        start = "previous basis" if warm else "random (the paper)"
        each = ", ".join(f"{a:.2f}" for a in vals)
        lines.append(f"| {ds} | {s} | {start} | {stats.summarize(vals).text()} | {each} | {vs} |")
    return "\n".join(lines) + f"\n\nEpsilon at most {max(eps):.4f} in every run.\n"


# ------------------------------------------------------------------- rgp
RGP_NAMES = {
    "dpsgd": "DP-SGD",
    "dppowersgd": "DP-PowerSGD",
    "rgp_random": "RGP-random",
    "rgp": "RGP",
}
#: Yu et al. (ICML 2021) Table 2: CIFAR-10 validation accuracy (%), WRN28-4, epsilon 8.
RGP_PAPER = {"dpsgd": 55.9, "dppowersgd": 57.1, "rgp_random": 51.0, "rgp": 63.4}


def _rgp_row(run: RunDir) -> tuple:
    cfg, s = run.config_dict(), run.summary()
    v = (run.json(VALIDATION) or {}).get("val_accuracy")
    return cfg["mechanism"], cfg["optim"]["lr"], s, v


def rgp(runs: Path) -> str:
    """One row per run; in each mechanism's lr grid, the best held-out accuracy is bold."""
    lines = [
        "| mechanism | rank | lr | held-out acc | test acc | epsilon | z | paper (Table 2) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [_rgp_row(r) for r in find_runs(runs)]
    for mech in RGP_NAMES:
        for ef in (False, True):
            grid = [
                r for r in rows if r[0]["name"] == mech and bool(r[0].get("error_feedback")) == ef
            ]
            best = max((r[3] for r in grid if r[3] is not None), default=None)
            for m, lr, s, v in sorted(grid, key=lambda r: r[1]):
                b = "**" if v is not None and v == best and len(grid) > 1 else ""
                val = "-" if v is None else f"{b}{100 * v:.2f}%{b}"
                label = RGP_NAMES[mech] + (" + error feedback" if ef else "")
                lines.append(
                    f"| {label} | {m.get('rank', '-')} | {lr} | {val} | "
                    f"{b}{100 * s['test_accuracy']:.2f}%{b} | {s['epsilon']:.3f} | "
                    f"{s['noise_multiplier']:.4f} | {RGP_PAPER[mech]}% |"
                )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- dphero
HERO_NAMES = {"dphero": "DP-Hero", "dphero_floor": "DP-Hero floor", "dpsgd": "DP-SGD"}


def _scales(metrics: list[dict]) -> str:
    """Smallest v_i / sigma over all layers (first -> last logged step); the largest, last."""
    lo = [m["mech/min_scale"] for m in metrics if "mech/min_scale" in m]
    hi = [m["mech/max_scale"] for m in metrics if "mech/max_scale" in m]
    return f"{lo[0]:.3g} -> {lo[-1]:.3g} | {hi[-1]:.3g}" if lo else "1 | 1"


def _mia_cell(mia: dict | None) -> str:
    if mia is None:
        return "-"
    return f"{100 * mia['success']:.2f}% [{100 * mia['ci_low']:.2f}, {100 * mia['ci_high']:.2f}]"


def dphero(runs: Path) -> str:
    lines = [
        "| sigma | mechanism | test acc | nominal epsilon | honest epsilon | "
        "min v_i/sigma (step 30 -> 3000) | max v_i/sigma | MIA success [95% CI] |",
        "|---:|---|---:|---:|---:|---|---:|---|",
    ]
    for sigma in (1, 3, 5):
        for mech in HERO_NAMES:
            run = RunDir(Path(runs) / f"lenet_{mech}_sigma{sigma}")
            if not run.finished:
                continue
            s = run.summary()
            nominal = s.get("epsilon_nominal", s["epsilon"])
            lines.append(
                f"| {sigma} | {HERO_NAMES[mech]} | {100 * s['test_accuracy']:.2f}% | {nominal:.3f} | "
                f"{s['epsilon']:.4g} | {_scales(run.metrics())} | {_mia_cell(run.json(MIA))} |"
            )
    lines += [
        "",
        "| run | mechanism | private set | epochs | epsilon | test acc | MIA success [95% CI] | "
        "n (eval half) |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for run in find_runs(runs):
        if not run.path.name.startswith("mia_"):
            continue
        s, cfg, mia = run.summary(), run.config_dict(), run.json(MIA)
        eps = float(s["epsilon"])  # "inf" for the non-private run
        eps = "inf" if eps == float("inf") else f"{eps:.3f}"
        size = cfg["dataset"].get("train_size") or published_train_size(cfg["dataset"], cfg["aux"])
        lines.append(
            f"| {run.path.name} | {cfg['mechanism']['name']} | {size:,} | {cfg['train']['epochs']} "
            f"| {eps} | {100 * s['test_accuracy']:.2f}% | {_mia_cell(mia)} | "
            f"{mia['examples'] if mia else '-'} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- pdpsgd
def pdpsgd(runs: Path) -> str:
    """Welch tests of the historical PDP-SGD study (``results/pdpsgd/runs.csv``: one row per
    run; the run folders were not kept): each mechanism against DP-SGD per dataset and sigma."""
    import csv

    cells: dict[tuple, list[float]] = defaultdict(list)
    with open(Path(runs).parent / "runs.csv") as f:
        for r in csv.DictReader(f):
            cells[(r["dataset"], r["mechanism"], float(r["sigma"]))].append(100 * float(r["final"]))
    lines = ["| dataset | sigma | PDP-SGD - DP-SGD | RPDP-SGD - DP-SGD |", "|---|---:|---|---|"]
    names = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}
    for ds in names:
        for sigma in sorted({k[2] for k in cells if k[0] == ds}, reverse=True):
            base = cells[(ds, "dpsgd", sigma)]
            vs = [stats.compare(base, cells[(ds, m, sigma)]).text() for m in ("pdpsgd", "rpdpsgd")]
            lines.append(f"| {names[ds]} | {sigma:g} | {vs[0]} | {vs[1]} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ pate
# The PATE rows of GEP's Table 1 (results/pate/), run by scripts/pate_study.py.
#
# A setting (PATE_SETTINGS) is a dataset, the shared overrides, the epsilons, the seeds
# and a small grid of aggregator options. Two stages:
#
# * ``tune``: seed ``tune_seed`` only, ``dataset.validation_size`` examples held out of the
#   private training set; every grid point at every epsilon. The teachers' votes depend
#   on neither the aggregator nor the budget, so the grid shares one set of teachers
#   (``pate.votes_cache``). The pick per epsilon is the grid point with the highest
#   ``validation_accuracy`` (the test set is not evaluated in this stage).
# * ``final``: every seed at every epsilon with that epsilon's pick, the same examples held
#   out of the teachers' data (``pate.holdout``: the teachers of seed ``tune_seed`` are those
#   of the tuning runs), evaluated on the test split; the epsilons of a seed share teachers.
#
# Run folders: ``<root>/<setting>/tune/<point>_eps<e>`` and ``<root>/<setting>/final/
# seed<s>_eps<e>``. :func:`pate` is the table of ``results/pate/README.md``
# (``python scripts/make_table.py --study pate``); ``scripts/pate_study.py`` runs the stages.

#: GEP (Yu et al., ICLR 2021) Table 1, PATE rows: test accuracy (%) at epsilon 2, 5, 8
PATE_PAPER = {"mnist": {2: 98.5, 5: 98.5, 8: 98.6}, "cifar10": {2: 34.2, 5: 41.9, 8: 43.6}}


@dataclass(frozen=True)
class PateSetting:
    dataset: str
    overrides: tuple[str, ...]
    grid: dict[str, tuple[str, ...]]
    note: str
    epsilons: tuple[int, ...] = (2, 5, 8)
    seeds: tuple[int, ...] = (0, 1, 2)
    tune_seed: int = 0
    validation_size: int = 5000
    one_ensemble: bool = False  # every seed with the teachers of tune_seed (pate.teacher_seed)
    compare_to: str | None = None  # a setting whose test accuracies a Welch test compares with
    shared: tuple[str, ...] = field(
        default=("pate.data_dependent=true", "pate.votes_cache=outputs/pate_votes",
                 "logger=disabled", "device=cpu")
    )  # fmt: skip


_MNIST_CONFIDENT = ("dataset=mnist", "model=mnist_cnn", "pate=confident", "pate.teachers=250",
                    "pate.teacher.lr=0.01")  # fmt: skip

PATE_SETTINGS = {
    "mnist": PateSetting(
        "mnist",
        (
            "dataset=mnist",
            "model=mnist_cnn",
            "pate=gnmax",
            "pate.teachers=250",
            "pate.teacher.lr=0.01",
        ),
        {f"s{s}": (f"pate.sigma2={s}",) for s in (40, 100, 200)},
        "250 teachers (the papers') on 55,000 training images (220 each: 5,000 are held out "
        "for tuning, in every run), mnist_cnn teachers and student (10 and 20 epochs of "
        "SGD; the teachers' lr 0.01, chosen on the held-out examples: "
        "results/pate/teacher_probe.txt), GNMax, public pool = the first 9,000 test images, "
        "evaluation = the last 1,000; supervised student (no semi-supervised training, "
        "unlike the papers). Each seed trains its own teachers.",
    ),
    "cifar10": PateSetting(
        "cifar10",
        (
            "dataset=cifar10",
            "model=cifar_cnn",
            "model.channels=16",
            "model.hidden=64",
            "pate=gnmax",
            "pate.teachers=50",
            "pate.public_size=2000",
            "pate.teacher.chunk=50",
            "pate.teacher.epochs=5",
            "pate.teacher.lr=0.02",
            "pate.student.lr=0.02",
            "pate.student.epochs=15",
            "train.eval_batch_size=1000",
        ),
        {"s20": ("pate.sigma2=20",)},
        "Reduced for a saturated 2-core CPU and untuned: 50 teachers of 1,000 images, 5 "
        "epochs each (the papers' CIFAR-10 PATE uses 250 teachers and a deeper network), a "
        "small Abadi-style CNN (cifar_cnn with 16 channels and 64 hidden units) for teachers "
        "and student, GNMax sigma2 = 20 fixed before any run (one grid point: no tuning "
        "stage, and the test set chose nothing), public pool = the first 2,000 test images, "
        "evaluation = the last 8,000; one seed; CIFAR-10 (JPEG copy).",
        seeds=(0,),
    ),  # fmt: skip
    # Confident-GNMax on MNIST (the 2018 paper's MNIST row: T 200, sigma1 150, sigma2 40):
    # (T, sigma1, sigma2) tuned on the validation split; the teachers are the "mnist"
    # setting's (same digest: pate.votes_cache shares them)
    "mnist_confident": PateSetting(
        "mnist",
        _MNIST_CONFIDENT,
        {
            f"T{t}_s1{s1}_s2{s2}": (f"pate.threshold={t}", f"pate.sigma1={s1}", f"pate.sigma2={s2}")
            for t in (150, 200)
            for s1 in (100, 150)
            for s2 in (20, 40)
        },
        "The mnist setting's teachers (250, mnist_cnn, lr 0.01, 5,000 training images held "
        "out) with Confident-GNMax: a query is answered only when its largest vote count "
        "plus N(0, sigma1^2) reaches T, then with GNMax(sigma2); (T, sigma1, sigma2) picked "
        "per epsilon on the validation split; supervised student on the answered queries.",
    ),
    # The 2018 paper's protocol on MNIST (issue 41, row (b)); scripts/pate_paper_protocol.py:
    # mnist_confident's teachers and its (T, sigma1, sigma2) pick per epsilon; the queries
    # capped (pate.max_queries) at the largest count whose data-dependent epsilon, released
    # by smooth sensitivity on the tuning split, is within the target; the data-independent
    # filter lifted (privacy.epsilon=1000: the run's epsilon is still its guarantee);
    # FixMatch student. Its final runs are made by that script, not by pate_final_runs.
    "mnist_paper": PateSetting(
        "mnist",
        (
            *_MNIST_CONFIDENT,
            "pate.release=smooth_sensitivity",
            "pate.student.semi_supervised=true",
            "pate.student.epochs=10",
        ),
        {"paper": ()},
        "The 2018 paper's protocol: the mnist_confident setting's teachers (one ensemble, "
        "seed 0, for every seed) and its (T, sigma1, sigma2) pick per epsilon; queries asked "
        "up to the largest count (a grid of 500) whose data-dependent epsilon, released by "
        "smooth sensitivity (order 10, beta 0.02, sigma 8) on the tuning split, is within the "
        "target (budget.json); the data-independent budget lifted, so the *guarantee* column "
        "is above the target; semi-supervised student (FixMatch, 10 passes over the "
        "unanswered images). Welch test against the mnist row (a).",
        one_ensemble=True,
        compare_to="mnist",
    ),
    # The ablation's last step (issue 41): row (b) with teachers trained 20 epochs instead
    # of 10 (results/pate/teachers/: 88.0% against 76.6% mean validation accuracy), nothing
    # else changed: the same aggregator picks (mnist_confident's, not re-tuned), the budget
    # re-derived by the released data-dependent epsilon on the new teachers' votes.
    "mnist_paper_t20": PateSetting(
        "mnist",
        (
            *_MNIST_CONFIDENT,
            "pate.teacher.epochs=20",
            "pate.release=smooth_sensitivity",
            "pate.student.semi_supervised=true",
            "pate.student.epochs=10",
        ),
        {"paper": ()},
        "Row (b) with its teachers trained 20 epochs instead of 10 (the teachers' study's "
        "pick per unit of CPU: results/pate/teachers/), everything else as mnist_paper: "
        "mnist_confident's (T, sigma1, sigma2) picks (not re-tuned for the new teachers), "
        "the queries budgeted by the released data-dependent epsilon on the new teachers' "
        "votes (budget.json), FixMatch student. Welch test against row (b).",
        one_ensemble=True,
        compare_to="mnist_paper",
    ),
}


def pate_tune_runs(name: str, root: Path) -> list[tuple[Path, list[str]]]:
    s = PATE_SETTINGS[name]
    base = [*s.overrides, *s.shared, f"seed={s.tune_seed}",
            f"dataset.validation_size={s.validation_size}"]  # fmt: skip
    return [
        (root / name / "tune" / f"{point}_eps{e}", [*base, *ov, f"privacy.epsilon={e}"])
        for e in s.epsilons
        for point, ov in s.grid.items()
    ]


def pate_picks(name: str, root: Path) -> dict[int, str]:
    """epsilon -> the grid point with the best validation accuracy (finished runs only);
    a one-point grid is its own pick (no tuning stage)."""
    s, best = PATE_SETTINGS[name], {}
    if len(s.grid) == 1:
        return dict.fromkeys(s.epsilons, next(iter(s.grid)))
    for e in s.epsilons:
        scores = {}
        for point in s.grid:
            run = RunDir(root / name / "tune" / f"{point}_eps{e}")
            if run.finished:
                scores[point] = run.summary()["validation_accuracy"]
        if scores:
            best[e] = max(scores, key=scores.get)
    return best


def pate_final_runs(name: str, root: Path, chosen: dict[int, str]) -> list[tuple[Path, list[str]]]:
    s = PATE_SETTINGS[name]
    # tuned: the final runs' teachers skip the validation examples too (pate.holdout), so
    # seed tune_seed's final runs reuse its tuning teachers
    hold = [f"pate.holdout={s.validation_size}"] if len(s.grid) > 1 else []
    if s.one_ensemble:  # the seeds vary the aggregator's noise and the student only
        hold.append(f"pate.teacher_seed={s.tune_seed}")
    return [
        (root / name / "final" / f"seed{seed}_eps{e}",
         [*s.overrides, *s.shared, *s.grid[chosen[e]], *hold, f"seed={seed}",
          f"privacy.epsilon={e}"])
        for seed in s.seeds
        for e in s.epsilons
        if e in chosen
    ]  # fmt: skip


def _pate_cell(runs: list[RunDir], key: str, scale: float = 1.0, digits: int = 2) -> str:
    vals = [scale * r.summary()[key] for r in runs if key in r.summary()]
    return stats.summarize(vals).text(digits)


def _pate_tune_table(name: str, root: Path) -> list[str]:
    s, chosen = PATE_SETTINGS[name], pate_picks(name, root)
    lines = [
        "| grid point | "
        + " | ".join(f"eps={e}: val acc (answered, % correct)" for e in s.epsilons)
        + " |",
        "|---|" + "---:|" * len(s.epsilons),
    ]
    for point, ov in s.grid.items():
        cells = []
        for e in s.epsilons:
            run = RunDir(root / name / "tune" / f"{point}_eps{e}")
            if not run.finished:
                cells.append("–")
                continue
            sm = run.summary()
            b = "**" if chosen.get(e) == point else ""
            correct = 100 * sm["answered_label_accuracy"]
            cells.append(
                f"{b}{100 * sm['validation_accuracy']:.2f}{b} ({sm['answered']}, {correct:.1f})"
            )
        lines.append(f"| {point} (`{' '.join(ov)}`) | " + " | ".join(cells) + " |")
    return lines


def _pate_final(name: str, root: Path, e: int) -> list[RunDir]:
    runs = [
        RunDir(root / name / "final" / f"seed{seed}_eps{e}") for seed in PATE_SETTINGS[name].seeds
    ]
    return [r for r in runs if r.finished]


def _pate_setting(name: str, root: Path) -> str:
    s, chosen = PATE_SETTINGS[name], pate_picks(name, root)
    row_name = {"mnist": "row (a)", "mnist_paper": "row (b)"}.get(s.compare_to, s.compare_to)
    extra = f" released data-dependent epsilon (smooth sensitivity) | Welch vs {row_name} |"
    extra = extra if s.compare_to else ""
    lines = [
        f"### {name}", "", s.note, "",
        "| epsilon | pick | test accuracy (%) | paper (data-dependent, semi-supervised) | "
        "data-independent epsilon (the guarantee) | data-dependent epsilon (NOT a guarantee) | "
        f"answered queries | answered labels correct (%) |{extra}",
        "|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|---|" if extra else ""),
    ]  # fmt: skip
    for e in s.epsilons:
        runs = _pate_final(name, root, e)
        row = (
            f"| {e} | {chosen.get(e, '–')} | {_pate_cell(runs, 'test_accuracy', 100)} | "
            f"{PATE_PAPER[s.dataset][e]} | {_pate_cell(runs, 'epsilon', digits=3)} | "
            f"{_pate_cell(runs, 'epsilon_data_dependent', digits=3)} | {_pate_cell(runs, 'answered', digits=0)} | "
            f"{_pate_cell(runs, 'answered_label_accuracy', 100)} |"
        )  # fmt: skip
        if s.compare_to:
            base = [100 * r.summary()["test_accuracy"] for r in _pate_final(s.compare_to, root, e)]
            mine = [100 * r.summary()["test_accuracy"] for r in runs]
            row += f" {_pate_cell(runs, 'epsilon_data_dependent_released', digits=3)} | "
            row += f"{stats.compare(base, mine).text() if base and mine else '–'} |"
        lines.append(row)
    lines += ["", CORRECT_NOTE]
    if len(s.grid) > 1:
        lines += ["", f"Tuning ({name}, seed {s.tune_seed}, {s.validation_size} training "
                  "examples held out; bold: the pick per epsilon):", "", *_pate_tune_table(name, root)]  # fmt: skip
    return "\n".join(lines) + "\n"


#: what the "correct" columns of the PATE tables are computed from
CORRECT_NOTE = (
    "*Answered labels correct*: the fraction of the answered queries whose noisy label equals "
    "the public pool's own label. The pool is the first test images, whose labels are public "
    "data in PATE's setting (no privacy cost), but they are test labels: the fraction is a "
    "diagnostic and chooses nothing (the picks use the validation accuracy only)."
)


#: the ablation from row (a) to row (b), one change at a time (scripts/pate_paper_protocol.py)
PATE_ABLATION = (
    ("row (a): GNMax, supervised student, data-independent budget", "mnist", "final/seed{s}_eps{e}"),
    ("+ Confident-GNMax (its pick; row (b)'s teachers: hash partition, one ensemble)", "mnist_paper", "ablation/aggregator_seed{s}_eps{e}"),
    ("+ semi-supervised student (FixMatch)", "mnist_paper", "ablation/student_seed{s}_eps{e}"),
    ("+ budget by the released data-dependent epsilon = row (b)", "mnist_paper", "final/seed{s}_eps{e}"),
    ("+ teachers trained 20 epochs, not 10 (budget re-derived)", "mnist_paper_t20", "final/seed{s}_eps{e}"),
)  # fmt: skip


def _pate_ablation(root: Path) -> str:
    """Test accuracy per ablation step and epsilon, each step Welch-tested against the last."""
    eps = PATE_SETTINGS["mnist_paper"].epsilons
    lines = ["| step | " + " | ".join(f"eps={e}: test acc (%), vs the step above" for e in eps) + " |",
             "|---|" + "---|" * len(eps)]  # fmt: skip
    last: dict[int, list[float]] = {}
    for label, name, pattern in PATE_ABLATION:
        cells = []
        for e in eps:
            runs = [RunDir(root / name / pattern.format(s=s, e=e)) for s in (0, 1, 2)]
            accs = [100 * r.summary()["test_accuracy"] for r in runs if r.finished]
            vs = stats.compare(last[e], accs).text() if last.get(e) and accs else "–"
            cells.append(f"{stats.summarize(accs).text()}, {vs}")
            last[e] = accs or last.get(e, [])  # a step without runs: compare with the one above
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return (
        "\n".join(["Ablation (mnist, row (a) to row (b), then better teachers):", "", *lines])
        + "\n"
    )


def pate(root: Path) -> str:
    """Every PATE setting with runs under ``root`` (``results/pate/runs``)."""
    out = [_pate_setting(n, root) for n in PATE_SETTINGS if (Path(root) / n).is_dir()]
    if (Path(root) / "mnist_paper" / "ablation").is_dir():
        out.append(_pate_ablation(Path(root)))
    return "\n".join(out) if out else "No PATE runs yet.\n"


# ------------------------------------------------------------------ API
#: study -> (table renderer, where a collected run goes under runs/ (None: its dir name),
#: which collected runs belong to it)
STUDIES = {
    "speed": (speed, _speed_dest, lambda r: True),
    "rgp": (rgp, None, lambda r: True),
    "dphero": (dphero, None, lambda r: r.path.name.startswith(("lenet_", "mia_"))),
    "pdpsgd": (pdpsgd, None, lambda r: False),  # the historical study: runs.csv only
    "pate": (pate, None, lambda r: False),  # scripts/pate_study.py copies its own runs
}


def render(study: str, runs: Path | None = None) -> str:
    return STUDIES[study][0](Path(runs) if runs else study_dir(study))


def collect(study: str, src: Path, runs: Path | None = None) -> int:
    """Copy the small files of every finished run under ``src``; returns how many."""
    _, dest_of, keep = STUDIES[study]
    base = Path(runs) if runs else study_dir(study)
    found = [r for r in find_runs(src) if keep(r)]
    for run in found:
        run.copy_small_files(base / (dest_of(run) if dest_of else run.path.name))
    return len(found)
