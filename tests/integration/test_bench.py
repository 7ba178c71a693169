"""scripts/bench.py: real runs composed by Hydra, timed around the trainer's own step."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("dpsub.experiments.benchmark")


def test_the_timed_step_is_the_trainers_and_configs_come_from_hydra(bench):
    import dpsub.training.build as run_module

    assert bench.train_step is run_module.train_step
    assert bench.build_run is run_module.build_run
    source = SCRIPT.read_text()
    for reader in ("OmegaConf.load", "import yaml", "safe_load", '.yaml").read'):
        assert reader not in source, reader  # no YAML reader of its own


def test_cpu_run(bench, tmp_path, capsys):
    """bench.main as ``python scripts/bench.py ARGS`` calls it (in this process: a subprocess
    spent its seconds importing torch)."""
    out, md = tmp_path / "tmp" / "x.json", tmp_path / "tmp" / "x.md"
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "dpsgd",
        "--batch-size", "32", "--steps", "2", "--warmup", "1", "--device", "cpu",
        "--out", str(out), "--markdown", str(md),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    stdout = capsys.readouterr().out
    by_mech = {r["mechanism"]: r for r in json.loads(out.read_text())}
    base, dpsgd = by_mech["nonprivate"], by_mech["dpsgd"]
    assert base["status"] == "ok" and base["time_ratio"] == 1.0
    assert base["median_ms"] > 0 and len(base["step_ms"]) == 2
    assert dpsgd["status"] == "ok", dpsgd["error"]
    assert dpsgd["time_ratio"] > 0 and dpsgd["backend"] == "vmap" and dpsgd["params"] == 26010
    for r in by_mech.values():
        assert r["env"]["torch"] and "bench.py" in r["env"]["command"]
        assert r["peak_extra_mib"] >= 0
    text = md.read_text()
    assert "| nonprivate |" in text and "| dpsgd |" in text and "| dpsgd |" in stdout


def test_overrides_and_error_rows(bench, tmp_path, capsys):
    out = tmp_path / "deep" / "dir" / "r.json"
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "nosuch", "dpsgd", "--batch-size", "8",
        "--steps", "1", "--warmup", "0", "--device", "cpu", "--backends", "vmap", "opacus",
        "--set", "clip=0.5", "--out", str(out),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    recs = json.loads(out.read_text())
    rows = [(r["mechanism"], r["backend"], r["status"]) for r in recs]
    assert rows == [
        ("nonprivate", "-", "ok"),
        ("nosuch", "vmap", "error"),
        ("dpsgd", "vmap", "ok"),
        ("dpsgd", "opacus", "ok"),
    ]
    assert "unknown mechanism" in recs[1]["error"] and recs[1]["time_ratio"] is None
    assert all(r["options"] == {"clip": 0.5} for r in recs if r["mechanism"] == "dpsgd")
    assert "| nosuch | vmap | - | error:" in capsys.readouterr().out
    # an option the mechanism lacks: an error row (the validator names it), not a crash
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "dpsgd", "--batch-size", "8", "--steps", "1",
        "--warmup", "0", "--device", "cpu", "--set", "dpsgd.bogus=1", "--out", str(out),
        "--append",
    ]  # fmt: skip
    assert bench.main(argv) == 0
    recs = json.loads(out.read_text())
    assert len(recs) == 6 and recs[-1]["status"] == "error" and "bogus" in recs[-1]["error"]


def test_parse_overrides(bench):
    got = bench.parse_overrides(["num_bases=1000", "gep.lr=1e-3", "x=[1,2]", "flag=true"])
    assert got == [(None, "num_bases", 1000), ("gep", "lr", 1e-3), (None, "x", [1, 2]),
                   (None, "flag", True)]  # fmt: skip
    used: set[int] = set()
    opts = bench.mechanism_options("dpsgd", bench.parse_overrides(["clip=3", "k=2"]), used)
    assert opts == {"clip": 3} and used == {0}
    assert bench.in_shape_of("lenet") == (1, 28, 28) and bench.in_shape_of("wrn28_4") == (3, 32, 32)


def test_needs_aux_mechanism_gets_aux_data(bench, tmp_path):
    """A declared mechanism without a yaml is composed by name and given auxiliary data."""
    from dpsub.mechanisms import MECHANISMS, register
    from dpsub.mechanisms.nonprivate import NonPrivate
    from dpsub.mechanisms.options import SPECS, declare

    seen = {}

    @declare("auxprobe", private=False, needs_aux=True)
    @dataclass
    class AuxProbeOptions:
        pass

    @register("auxprobe")
    class AuxProbe(NonPrivate):
        def setup(self, engine, aux=None):
            super().setup(engine, aux)
            seen["x"], seen["labels"] = aux.x.shape, aux.batch_labels(None).shape

    try:
        out = tmp_path / "a.json"
        argv = [
            "--models", "lenet", "--mechanisms", "auxprobe", "--batch-size", "4", "--steps", "1",
            "--warmup", "0", "--device", "cpu", "--aux-size", "5", "--out", str(out),
        ]  # fmt: skip
        assert bench.main(argv) == 0
        recs = {r["mechanism"]: r for r in json.loads(out.read_text())}
        assert recs["auxprobe"]["status"] == "ok", recs["auxprobe"]["error"]
        assert recs["auxprobe"]["aux_size"] == 5
        assert seen == {"x": (5, 1, 28, 28), "labels": (5,)}
    finally:
        SPECS.pop("auxprobe")
        MECHANISMS.pop("auxprobe")


def test_no_timed_step_follows_a_heap_trim_and_means_are_amortized(bench, tmp_path, monkeypatch):
    """Trimming the heap (for CPU memory) makes the next step page-fault: memory is measured
    on separate first steps, and an untimed step follows; --statistic mean gives the ratios."""
    events = []
    monkeypatch.setattr(bench, "trim_heap", lambda: events.append("trim"))
    real = bench.train_step
    monkeypatch.setattr(
        bench, "train_step", lambda run, idx: events.append("step") or real(run, idx=idx)
    )
    out = tmp_path / "m.json"
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "dpsgd", "--batch-size", "8", "--steps", "3",
        "--warmup", "0", "--memory-steps", "1", "--statistic", "mean", "--device", "cpu",
        "--out", str(out),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    # per run: trim, memory step; then 2 runs x (1 settling step + 3 timed steps)
    assert events == ["trim", "step"] * 2 + ["step"] * 8
    for r in json.loads(out.read_text()):
        assert r["time_ms"] == r["mean_ms"] and len(r["step_ms"]) == 3
        assert r["peak_extra_mib"] >= 0 and r["statistic"] == "mean"


def test_variants_add_rows_with_their_own_options(bench, tmp_path):
    out = tmp_path / "v.json"
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "dpsgd", "--batch-size", "8", "--steps", "1",
        "--warmup", "0", "--device", "cpu", "--set", "clip=0.5", "--variant", "dpsgd:clip=2",
        "--out", str(out),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    recs = json.loads(out.read_text())
    assert [(r["mechanism"], r["options"]) for r in recs] == [
        ("nonprivate", {}),
        ("dpsgd", {"clip": 0.5}),
        ("dpsgd", {"clip": 2}),
    ]
    assert all(r["status"] == "ok" for r in recs)
    with pytest.raises(SystemExit, match="variant"):
        bench.parse_variant("dpsgd")
