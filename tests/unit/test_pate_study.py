"""The PATE study (dpsub.studies, PATE_SETTINGS): tuning picks on validation accuracy only, final runs
reuse the tuning teachers, the table shows both epsilons beside the paper."""

from __future__ import annotations

import json

from dpsub import studies


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
    _run(tmp_path / "mnist" / "tune" / "s40_eps2", validation_accuracy=0.9, answered=170)
    for seed, acc in enumerate((0.91, 0.92, 0.93)):
        _run(tmp_path / "mnist" / "final" / f"seed{seed}_eps2", test_accuracy=acc, epsilon=1.99,
             epsilon_data_dependent=0.5, answered=170, answered_label_accuracy=0.99)  # fmt: skip
    text = studies.pate(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "92.00 ± 1.00" in row and "(3)" in row and "98.5" in row
    assert "1.990" in row and "0.500" in row  # data-independent and data-dependent side by side
    assert "**90.00** (170)" in text  # the tuning grid with its pick
