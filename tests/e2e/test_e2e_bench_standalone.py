"""bench --standalone with real child processes (slow: each child imports torch)."""

from __future__ import annotations

import json

from dpsub.experiments import benchmark as bench


def test_each_row_alone_in_a_real_child_process(tmp_path):
    out, md = tmp_path / "a.json", tmp_path / "a.md"
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "dpsgd", "--backends", "ghost",
        "--batch-size", "4", "--steps", "3", "--warmup", "0", "--memory-steps", "0",
        "--device", "cpu", "--threads", "1", "--standalone", "--out", str(out), "--markdown", str(md),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    base, dpsgd = json.loads(out.read_text())
    assert dpsgd["backend"] == "ghost" and dpsgd["standalone_error"] is None
    for r in (base, dpsgd):
        assert r["standalone_rounds"] == 3 and r["standalone_median_ms"] > 0
    assert base["standalone_ratio"] == 1.0 and dpsgd["standalone_ratio"] > 0
    assert "alone vs nonprivate alone" in md.read_text()
