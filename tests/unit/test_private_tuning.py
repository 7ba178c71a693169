"""scripts/private_tuning.py renders its results from the search folders alone."""

from __future__ import annotations

import json

from dpsub.experiments import private_tuning as study


def test_results_come_from_the_files_and_a_search_without_runs_is_shown(tmp_path, monkeypatch):
    root = tmp_path / "private-tuning"
    monkeypatch.setattr(study, "ROOT", root)
    for s, acc in zip(study.SEEDS, (0.962, 0.963, 0.961), strict=True):
        p = tmp_path / study.UNCOUNTED.format(s)
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps({"test_accuracy": acc}))
    kept = {"candidate": ["optim.lr=1.0"], "validation_accuracy_noisy": 0.95, "epsilon": 2.9}
    for arm in study.ARMS:
        for s, acc in zip(study.SEEDS, (0.95, None, 0.96), strict=True):
            d = study.search_dir(arm, s)
            d.mkdir(parents=True)
            rec = {**kept, "test_accuracy": acc} if acc else {"candidate": None, "epsilon": 2.9}
            (d / "selection.json").write_text(json.dumps(rec))
    text = study.render()
    assert "(none: K = 0)" in text and "95.50 ± 0.71" in text  # two kept runs, one K = 0
    assert text.count("against the uncounted picks") == len(study.ARMS)
    assert "96.20 ± 0.10" in text
