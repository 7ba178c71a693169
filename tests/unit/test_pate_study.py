"""The PATE study (dpsub.experiments.studies, PATE_SETTINGS): tuning picks on validation accuracy only, final runs
reuse the tuning teachers, the table shows both epsilons beside the paper."""

from __future__ import annotations

import json

from dpsub.experiments import studies


def _run(path, **summary):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("seed: 0\n")
    (path / "summary.json").write_text(json.dumps(summary))


def test_picks_use_validation_accuracy_and_final_runs_hold_out_the_same_examples(tmp_path):
    for point, acc in (("s40", 0.90), ("s100", 0.95), ("s200", 0.93)):
        _run(tmp_path / "mnist" / "tune" / f"{point}_eps2", validation_accuracy=acc, answered=1)
    chosen = studies.pate_picks("mnist", tmp_path)
    assert chosen == {2: "s100"}  # eps 5 and 8 have no finished tuning runs yet
    runs = studies.pate_final_runs("mnist", tmp_path, chosen)
    assert [r[0].name for r in runs] == ["seed0_eps2", "seed1_eps2", "seed2_eps2"]
    for _, ov in runs:
        assert "pate.sigma2=100" in ov and "pate.holdout=5000" in ov
        assert not any(o.startswith("dataset.validation_size") for o in ov)  # test evaluated
    for _, ov in studies.pate_tune_runs("mnist", tmp_path):
        assert "dataset.validation_size=5000" in ov and "seed=0" in ov


def test_render_shows_test_accuracy_both_epsilons_and_the_paper(tmp_path):
    _run(tmp_path / "mnist" / "tune" / "s40_eps2", validation_accuracy=0.9, answered=170,
         answered_label_accuracy=0.95)  # fmt: skip
    for seed, acc in enumerate((0.91, 0.92, 0.93)):
        _run(tmp_path / "mnist" / "final" / f"seed{seed}_eps2", test_accuracy=acc, epsilon=1.99,
             epsilon_data_dependent=0.5, answered=170, answered_label_accuracy=0.99)  # fmt: skip
    text = studies.pate(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "92.00 ± 1.00" in row and "(3)" in row and "98.5" in row
    assert "1.990" in row and "0.500" in row  # data-independent and data-dependent side by side
    assert "**90.00** (170, 95.0)" in text  # the tuning grid with its pick


def test_confident_gnmax_is_tuned_on_validation_over_threshold_and_both_sigmas(tmp_path):
    """mnist_confident: every (T, sigma1, sigma2) grid point is a valid Confident-GNMax run
    on the validation split; the pick per epsilon is by validation accuracy alone (not by
    the answered labels' agreement with the public pool's test labels)."""
    from dpsub.config import compose
    from dpsub.pate.run import split

    runs = studies.pate_tune_runs("mnist_confident", tmp_path)
    assert len(runs) == 8 * 3
    for _, ov in runs:
        assert "pate=confident" in ov and "dataset.validation_size=5000" in ov
        assert {o.split("=")[0] for o in ov} >= {"pate.threshold", "pate.sigma1", "pate.sigma2"}
    _, pate = split(compose(runs[0][1], config_name="dpsub_pate"))
    assert pate.aggregator == "confident" and (pate.threshold, pate.sigma1) == (150, 100)
    base = tmp_path / "mnist_confident" / "tune"
    _run(base / "T150_s1100_s220_eps2", validation_accuracy=0.80, answered=90,
         answered_label_accuracy=0.99)  # fmt: skip
    _run(base / "T200_s1150_s240_eps2", validation_accuracy=0.85, answered=60,
         answered_label_accuracy=0.90)  # fmt: skip
    assert studies.pate_picks("mnist_confident", tmp_path) == {2: "T200_s1150_s240"}
    text = "\n".join(studies._pate_tune_table("mnist_confident", tmp_path))
    assert "**85.00** (60, 90.0)" in text and "80.00 (90, 99.0)" in text
    assert "test labels" in studies.pate(tmp_path)


def test_the_paper_protocol_row_shows_the_released_epsilon_and_a_welch_test(tmp_path):
    """mnist_paper (row (b)): the released data-dependent epsilon beside the guarantee, and
    a Welch test of its test accuracy against the mnist row (a) at the same epsilon."""
    for seed, (a, b) in enumerate(((0.70, 0.95), (0.72, 0.96), (0.74, 0.97))):
        _run(tmp_path / "mnist" / "final" / f"seed{seed}_eps2", test_accuracy=a, epsilon=1.99,
             answered=170, answered_label_accuracy=0.9)  # fmt: skip
        _run(tmp_path / "mnist_paper" / "final" / f"seed{seed}_eps2", test_accuracy=b,
             epsilon=6.1, epsilon_data_dependent_released=1.93, answered=300,
             answered_label_accuracy=0.99)  # fmt: skip
    text = studies.pate(tmp_path)
    assert "released data-dependent epsilon" in text and "paper (data-dependent" in text
    row = next(
        line for line in text.split("### mnist_paper")[1].splitlines() if line.startswith("| 2 |")
    )
    assert "96.00 ± 1.00" in row and "6.100" in row and "1.930" in row
    assert "+24.00" in row  # the Welch test against row (a): 96 - 72


def test_the_ablation_compares_each_step_with_the_one_above(tmp_path):
    for seed, (a, b) in enumerate(((0.70, 0.80), (0.72, 0.81), (0.74, 0.82))):
        _run(tmp_path / "mnist" / "final" / f"seed{seed}_eps2", test_accuracy=a)
        _run(tmp_path / "mnist_paper" / "ablation" / f"aggregator_seed{seed}_eps2", test_accuracy=b)
    _run(tmp_path / "mnist_paper" / "final" / "seed0_eps2", test_accuracy=0.9)
    text = studies._pate_ablation(tmp_path)
    lines = text.splitlines()
    assert "72.00 ± 2.00" in lines[4] and "+9.00" in lines[5]  # Welch: 81 - 72
    assert "90.00 (1), +9.00 (n/a: < 2 seeds)" in lines[7]  # the student step has no runs


def test_the_teachers_step_changes_only_the_teachers_epochs():
    """The ablation's last step is row (b) with one change: the teachers' epochs (so a
    new votes digest); the aggregator picks come from the same tuning setting."""
    b = studies.PATE_SETTINGS["mnist_paper"]
    t20 = studies.PATE_SETTINGS["mnist_paper_t20"]
    assert set(t20.overrides) - set(b.overrides) == {"pate.teacher.epochs=20"}
    assert set(b.overrides) <= set(t20.overrides)
    assert (t20.grid, t20.one_ensemble, t20.compare_to) == (b.grid, True, "mnist_paper")
    steps = [row[1] for row in studies.PATE_ABLATION]
    assert steps[-2:] == ["mnist_paper", "mnist_paper_t20"]
