"""scripts/bench.py: real runs composed by Hydra, timed around the trainer's own step."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpsub.experiments.bench import standalone as alone_lib

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
    # too few rounds, no standalone timing: the page says plainly these are not README figures
    assert "**not met** (--steps 2 < 20 rounds; no standalone timing" in text
    assert "alone ms/step" not in text


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


def test_a_dotted_variant_key_overrides_the_config_not_the_mechanism(bench):
    """``dpsgd@ghost:train.augmult=4`` times K = 4 views; the mechanism's options stay."""
    args = bench.build_parser().parse_args(["--batch-size", "8"])
    mech, options = bench.parse_variant("dpsgd:train.augmult=4,clip=2")
    ov = bench.run_overrides("mnist_cnn", mech, "ghost", options, args)
    assert "train.augmult=4" in ov and "mechanism.clip=2" in ov
    assert ov.index("train.augmult=4") > ov.index("train.batch_size=8")


#: a 1-minute load just above 1 per core (refused; exactly 1 per core passes)
OVER = os.cpu_count() + 0.5


@pytest.fixture()
def load(monkeypatch):
    """``load(start, end)``: the 1-minute load os.getloadavg gives first, then ever after."""

    def set_load(start: float, end: float) -> None:
        seen = []

        def getloadavg():
            seen.append(1)
            return (start if len(seen) == 1 else end, 0.5, 0.5)

        monkeypatch.setattr(os, "getloadavg", getloadavg)

    return set_load


def test_standalone_times_every_ok_row_alone_and_meets_the_readme_rule(
    bench, tmp_path, monkeypatch, load
):
    """--standalone: each ok row (non-private too) once more in a child of its own, with the
    parent's options and only that row; the page shows both timings side by side. The
    children run in this process here (a subprocess spends seconds importing torch)."""
    children = []
    monkeypatch.setattr(
        alone_lib, "run_child", lambda argv: children.append(argv) or bench.main(argv)
    )
    load(os.cpu_count(), os.cpu_count())  # 1 per core: allowed
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    argv = [
        "--models", "mnist_cnn", "--mechanisms", "nosuch", "dpsgd", "--batch-size", "4",
        "--steps", "20", "--warmup", "0", "--memory-steps", "0", "--device", "cpu",
        "--threads", "1", "--set", "clip=0.5", "--standalone", "--for-readme",
        "--out", str(out), "--markdown", str(md),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    recs = json.loads(out.read_text())
    assert [r["status"] for r in recs] == ["ok", "error", "ok"]
    assert [c[c.index("--only-row") + 1] for c in children] == ["0", "2"]  # not the error row
    for c in children:
        assert {"--batch-size", "--steps", "--warmup", "--threads", "--set"} <= set(c)
        assert c[c.index("--steps") + 1] == "20" and c[c.index("--set") + 1] == "clip=0.5"
        assert not {"--standalone", "--for-readme", "--markdown"} & set(c)
    base, err, dpsgd = recs
    for r in (base, dpsgd):
        assert r["standalone_rounds"] == 20 and r["standalone_error"] is None
        assert r["standalone_q1_ms"] <= r["standalone_median_ms"] <= r["standalone_q3_ms"]
        assert r["standalone_ratio"] == pytest.approx(r["standalone_ms"] / base["standalone_ms"])
    assert base["standalone_ratio"] == 1.0 and err["standalone_ms"] is None
    text = md.read_text()
    assert "| alone ms/step | alone IQR ms | alone rounds | alone vs nonprivate alone |" in text
    assert f"| {dpsgd['standalone_ratio']:.2f}x |" in text and "(the figure that counts)" in text
    assert "README rule: " in text and text.split("README rule: ")[1].split("\n")[0].endswith(
        ": met"
    )


@pytest.mark.parametrize(
    "steps, standalone, start, end, why",
    [
        (3, True, 0.0, 0.0, "--steps 3 < 20 rounds"),
        (20, False, 0.0, 0.0, "no standalone timing (--standalone)"),
        (20, True, OVER, 0.0, "load {over:g} at start on {cores} cores (> 1 per core); stop other work"),
        (20, True, 0.0, OVER, "load {over:g} at end on {cores} cores (> 1 per core); stop other work"),
    ],
)  # fmt: skip
def test_for_readme_refuses_and_writes_nothing(
    bench, tmp_path, monkeypatch, capsys, load, steps, standalone, start, end, why
):
    """Too few rounds, no standalone timing, a load above 1 per core at start (checked before
    any benchmarking) or at end: one line naming the reason, exit 2, no file."""
    ran = []
    monkeypatch.setattr(bench, "run_models", lambda parser, args: ran.append(1) or [])
    load(start, end)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["--models", "mnist_cnn", "--steps", str(steps), "--device", "cpu", "--for-readme",
            *(["--standalone"] if standalone else []), "--out", str(out), "--markdown", str(md)]  # fmt: skip
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bench: --for-readme refused: {why.format(over=OVER, cores=os.cpu_count())}" + (
        " and run again" if "load" in why else "")]  # fmt: skip
    assert ran == ([1] if end else [])  # nothing benchmarked when the start already fails
    assert not out.exists() and not md.exists()
