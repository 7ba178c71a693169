"""scripts/bench.py: a tiny CPU run end to end, option overrides and error rows."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("dpsub_bench_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(120)
def test_cpu_run_subprocess(tmp_path):
    out, md = tmp_path / "tmp" / "x.json", tmp_path / "tmp" / "x.md"
    cmd = [
        sys.executable, str(SCRIPT), "--models", "mnist_cnn", "--batch-size", "32",
        "--steps", "2", "--warmup", "1", "--device", "cpu", "--out", str(out),
        "--markdown", str(md),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    by_mech = {r["mechanism"]: r for r in records}
    base = by_mech["nonprivate"]
    assert base["status"] == "ok"
    assert base["time_ratio"] == 1.0
    assert base["median_ms"] > 0 and len(base["step_ms"]) == 2
    dpsgd = by_mech["dpsgd"]
    assert dpsgd["status"] == "ok", dpsgd["error"]
    assert dpsgd["time_ratio"] > 0
    assert dpsgd["options"] == {"clip": 1.0}
    assert dpsgd["backend"] == "vmap"
    for r in records:
        assert r["env"]["torch"] and "bench.py" in r["env"]["command"]
        assert r["peak_extra_mib"] >= 0
    assert md.exists()
    text = md.read_text()
    assert "| nonprivate |" in text and "| dpsgd |" in text
    assert "| nonprivate |" in proc.stdout  # the Markdown is printed too


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
    assert "unknown mechanism" in recs[1]["error"]
    assert recs[1]["time_ratio"] is None
    assert all(r["options"] == {"clip": 0.5} for r in recs if r["mechanism"] == "dpsgd")
    assert "| nosuch | vmap | 8 | error:" in capsys.readouterr().out

    # a scoped override with an option the mechanism lacks: an error row, not a crash;
    # --append extends the JSON list
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "dpsgd", "--batch-size", "8", "--steps", "1",
        "--warmup", "0", "--device", "cpu", "--set", "dpsgd.bogus=1", "--out", str(out),
        "--append",
    ]  # fmt: skip
    assert bench.main(argv) == 0
    recs = json.loads(out.read_text())
    assert len(recs) == 6
    assert recs[-1]["mechanism"] == "dpsgd" and recs[-1]["status"] == "error"
    assert "bogus" in recs[-1]["error"]


def test_parse_overrides(bench):
    got = bench.parse_overrides(["num_bases=1000", "gep.lr=1e-3", "x=[1,2]", "flag=true"])
    assert got == [(None, "num_bases", 1000), ("gep", "lr", 1e-3), (None, "x", [1, 2]),
                   (None, "flag", True)]  # fmt: skip
    used: set[int] = set()
    opts, note = bench.mechanism_options("dpsgd", bench.parse_overrides(["clip=3", "k=2"]), used)
    assert opts == {"clip": 3} and note is None and used == {0}
    assert bench.in_shape_of("lenet") == (1, 28, 28)
    assert bench.in_shape_of("wrn") == (3, 32, 32)


def test_needs_aux_mechanism_gets_random_aux(bench, tmp_path, monkeypatch):
    """A registered mechanism with needs_aux (and no yaml) is picked up and given AuxData."""
    from dpsub.mechanisms import MECHANISMS
    from dpsub.mechanisms.nonprivate import NonPrivate

    seen = {}

    class AuxProbe(NonPrivate):
        name = "auxprobe"
        needs_aux = True

        def setup(self, engine, aux=None):
            super().setup(engine, aux)
            seen["x"], seen["labels"] = aux.x.shape, aux.batch_labels(None).shape

    monkeypatch.setitem(MECHANISMS, "auxprobe", AuxProbe)
    out = tmp_path / "a.json"
    argv = [
        "--models", "lenet", "--batch-size", "4", "--steps", "1", "--warmup", "0",
        "--device", "cpu", "--aux-size", "5", "--out", str(out),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    recs = {r["mechanism"]: r for r in json.loads(out.read_text())}
    assert set(recs) >= {"nonprivate", "dpsgd", "auxprobe"}
    assert recs["auxprobe"]["status"] == "ok" and recs["auxprobe"]["aux_size"] == 5
    assert seen == {"x": (5, 1, 28, 28), "labels": (5,)}
