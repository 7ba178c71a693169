"""The PATE rows of GEP's Table 1 (``results/pate/``): plan, pick on validation, render.

A setting (:data:`SETTINGS`) is a dataset, the shared overrides, the epsilons, the seeds
and a small grid of aggregator options. Two stages:

* ``tune``: seed ``tune_seed`` only, ``dataset.validation_size`` examples held out of the
  private training set; every grid point at every epsilon. The teachers' votes depend
  on neither the aggregator nor the budget, so the grid shares one set of teachers
  (``pate.votes_cache``). The pick per epsilon is the grid point with the highest
  ``validation_accuracy`` (the test set is not evaluated in this stage).
* ``final``: every seed at every epsilon with that epsilon's pick, the same examples held
  out of the teachers' data (``pate.holdout``: the teachers of seed ``tune_seed`` are those
  of the tuning runs), evaluated on the test split; the epsilons of a seed share teachers.

Run folders: ``<root>/<setting>/tune/<point>_eps<e>`` and ``<root>/<setting>/final/
seed<s>_eps<e>``. :func:`render` is the table of ``results/pate/README.md``
(``python scripts/make_table.py --study pate``); ``scripts/pate_study.py`` runs the stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dpsub import stats
from dpsub.runs import RunDir

#: GEP (Yu et al., ICLR 2021) Table 1, PATE rows: test accuracy (%) at epsilon 2, 5, 8
PAPER = {"mnist": {2: 98.5, 5: 98.5, 8: 98.6}, "cifar10": {2: 34.2, 5: 41.9, 8: 43.6}}


@dataclass(frozen=True)
class Setting:
    dataset: str
    overrides: tuple[str, ...]
    grid: dict[str, tuple[str, ...]]
    note: str
    epsilons: tuple[int, ...] = (2, 5, 8)
    seeds: tuple[int, ...] = (0, 1, 2)
    tune_seed: int = 0
    validation_size: int = 5000
    shared: tuple[str, ...] = field(
        default=("pate.data_dependent=true", "pate.votes_cache=outputs/pate_votes",
                 "logger=disabled", "device=cpu")
    )  # fmt: skip


SETTINGS = {
    "mnist": Setting(
        "mnist",
        ("dataset=mnist", "model=mnist_cnn", "pate=gnmax", "pate.teachers=250"),
        {f"s{s}": (f"pate.sigma2={s}",) for s in (40, 100, 200)},
        "250 teachers (the papers') on 55,000 training images (220 each: 5,000 are held out "
        "for tuning, in every run), mnist_cnn teachers and student (10 and 20 epochs of "
        "SGD), GNMax, public pool = the first 9,000 test images, evaluation = the last "
        "1,000; supervised student (no semi-supervised training, unlike the papers).",
    ),
    "cifar10": Setting(
        "cifar10",
        (
            "dataset=cifar10",
            "model=cifar_cnn",
            "model.channels=16",
            "model.hidden=64",
            "pate=gnmax",
            "pate.teachers=100",
            "pate.public_size=5000",
            "pate.teacher.chunk=50",
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
}


def tune_runs(name: str, root: Path) -> list[tuple[Path, list[str]]]:
    s = SETTINGS[name]
    base = [*s.overrides, *s.shared, f"seed={s.tune_seed}",
            f"dataset.validation_size={s.validation_size}"]  # fmt: skip
    return [
        (root / name / "tune" / f"{point}_eps{e}", [*base, *ov, f"privacy.epsilon={e}"])
        for e in s.epsilons
        for point, ov in s.grid.items()
    ]


def picks(name: str, root: Path) -> dict[int, str]:
    """epsilon -> the grid point with the best validation accuracy (finished runs only);
    a one-point grid is its own pick (no tuning stage)."""
    s, best = SETTINGS[name], {}
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


def final_runs(name: str, root: Path, chosen: dict[int, str]) -> list[tuple[Path, list[str]]]:
    s = SETTINGS[name]
    # tuned: the final runs' teachers skip the validation examples too (pate.holdout), so
    # seed tune_seed's final runs reuse its tuning teachers
    hold = [f"pate.holdout={s.validation_size}"] if len(s.grid) > 1 else []
    return [
        (root / name / "final" / f"seed{seed}_eps{e}",
         [*s.overrides, *s.shared, *s.grid[chosen[e]], *hold, f"seed={seed}",
          f"privacy.epsilon={e}"])
        for seed in s.seeds
        for e in s.epsilons
        if e in chosen
    ]  # fmt: skip


def _cell(runs: list[RunDir], key: str, scale: float = 1.0, digits: int = 2) -> str:
    vals = [scale * r.summary()[key] for r in runs if key in r.summary()]
    return stats.summarize(vals).text(digits)


def _tune_table(name: str, root: Path) -> list[str]:
    s, chosen = SETTINGS[name], picks(name, root)
    lines = [
        "| grid point | " + " | ".join(f"eps={e}: val acc (answered)" for e in s.epsilons) + " |",
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
            cells.append(f"{b}{100 * sm['validation_accuracy']:.2f}{b} ({sm['answered']})")
        lines.append(f"| {point} (`{' '.join(ov)}`) | " + " | ".join(cells) + " |")
    return lines


def render_setting(name: str, root: Path) -> str:
    s, chosen = SETTINGS[name], picks(name, root)
    lines = [
        f"### {name}", "", s.note, "",
        "| epsilon | pick | test accuracy (%) | paper (PATE) | data-independent epsilon "
        "(the guarantee) | data-dependent epsilon (NOT a guarantee) | answered queries | "
        "answered labels correct (%) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for e in s.epsilons:
        runs = [RunDir(root / name / "final" / f"seed{seed}_eps{e}") for seed in s.seeds]
        runs = [r for r in runs if r.finished]
        lines.append(
            f"| {e} | {chosen.get(e, '–')} | {_cell(runs, 'test_accuracy', 100)} | "
            f"{PAPER[name][e]} | {_cell(runs, 'epsilon', digits=3)} | "
            f"{_cell(runs, 'epsilon_data_dependent', digits=3)} | {_cell(runs, 'answered', digits=0)} | "
            f"{_cell(runs, 'answered_label_accuracy', 100)} |"
        )  # fmt: skip
    if len(s.grid) > 1:
        lines += ["", f"Tuning ({name}, seed {s.tune_seed}, {s.validation_size} training "
                  "examples held out; bold: the pick per epsilon):", "", *_tune_table(name, root)]  # fmt: skip
    return "\n".join(lines) + "\n"


def render(root: Path) -> str:
    """Every setting with runs under ``root`` (``results/pate/runs``)."""
    out = [render_setting(n, root) for n in SETTINGS if (Path(root) / n).is_dir()]
    return "\n".join(out) if out else "No PATE runs yet.\n"
