"""scripts/bench.py --peers: other frameworks' private steps timed beside dpsub's rows.

Fast: a tiny batch, one round. Peers that are not installed here are skipped with their
reason (the GEP authors' code needs a checkout, given by DPSUB_GEP_AUTHORS, and BackPACK).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from dpsub.experiments.bench import peers as peer_lib
from dpsub.experiments.bench import scaling

from helpers.tables import load_script

AUTHORS = os.environ.get("DPSUB_GEP_AUTHORS", "/work/gep_authors")
HAVE_AUTHORS = (Path(AUTHORS) / peer_lib.GEP_AUTHORS_FILE).is_file()
HAVE_BACKPACK = importlib.util.find_spec("backpack") is not None


@pytest.fixture(scope="module")
def bench():
    return load_script("bench")


def _run(bench, tmp_path, *extra):
    out, md = tmp_path / "p.json", tmp_path / "p.md"
    argv = [
        "--peers", "--models", "mnist_cnn", "--mechanisms", "dpsgd", "gep",
        "--backends", "vmap", "ghost", "--batch-size", "8", "--aux-size", "8",
        "--set", "num_bases=4", "--set", "grouping=chunks", "--steps", "1", "--warmup", "0",
        "--memory-steps", "0", "--threads", "1", "--device", "cpu",
        "--out", str(out), "--markdown", str(md), *extra,
    ]  # fmt: skip
    assert bench.main(argv) == 0
    import json

    return json.loads(out.read_text()), md.read_text()


def test_opacus_modes_timed_beside_dpsub_and_missing_peers_say_why(bench, tmp_path):
    records, text = _run(bench, tmp_path, "--gep-authors", str(tmp_path / "nowhere"))
    rows = {(r["framework"], r["backend"]): r for r in records}
    for mode in peer_lib.OPACUS_MODES:
        r = rows[("opacus", mode)]
        assert r["status"] == "ok", r["error"]
        assert r["time_ms"] > 0 and r["vs_dpsub"] > 0 and r["time_ratio"] > 0
        assert r["vs_dpsub_row"].startswith("dpsgd [")  # dpsub's fastest DP-SGD row
    authors = rows[("gep-authors", "backpack")]
    assert authors["status"] == "skipped" and "not found" in authors["error"]
    assert rows[("fastdp", "book-keeping")]["status"] == "skipped"
    assert "package index" in rows[("fastdp", "book-keeping")]["error"]
    assert "| opacus | dpsgd | ghost |" in text and "not timed: GEP authors" in text
    assert "loadavg" in text and "interleaved" in text and "Targets" in text


def test_no_checkout_given_is_said_plainly(bench, tmp_path):
    records, _ = _run(bench, tmp_path, "--opacus-modes")
    authors = next(r for r in records if r["framework"] == "gep-authors")
    assert authors["status"] == "skipped" and "--gep-authors PATH" in authors["error"]
    assert not [r for r in records if r["framework"] == "opacus"]


@pytest.mark.skipif(not HAVE_BACKPACK, reason="BackPACK not installed (uv sync --extra peers)")
@pytest.mark.skipif(not HAVE_AUTHORS, reason=f"no GEP authors' checkout at {AUTHORS}")
def test_gep_authors_step_at_the_same_sizes(bench, tmp_path):
    records, text = _run(bench, tmp_path, "--opacus-modes", "--gep-authors", AUTHORS)
    authors = next(r for r in records if r["framework"] == "gep-authors")
    assert authors["status"] == "ok", authors["error"]
    assert authors["options"]["num_bases"] == 4 and authors["aux_size"] == 8
    assert authors["vs_dpsub_row"].startswith("gep [")
    assert "GEP: the authors' step" in text


def test_gep_authors_step_trains_the_model():
    if not (HAVE_BACKPACK and HAVE_AUTHORS):
        pytest.skip("needs BackPACK and the GEP authors' checkout (DPSUB_GEP_AUTHORS)")
    from dpsub.models import build_model

    torch.manual_seed(0)
    model = build_model("mnist_cnn", (1, 28, 28), 10)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    aux = peer_lib.gaussian_aux(8, (1, 28, 28), 10, 0, "cpu")
    run = peer_lib.gep_authors_peer(AUTHORS, model, x, y, *aux, 4, 3, 1, peer_lib.PeerSettings())
    before = [p.detach().clone() for p in run.model.parameters()]
    run.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, run.model.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_missing_checkout_raises_unavailable(tmp_path):
    with pytest.raises(peer_lib.PeerUnavailable, match="--gep-authors"):
        peer_lib.load_gep_authors(tmp_path)


def test_target_lines_say_met_or_by_how_much(bench):
    def row(fw, mech, backend, ms, ratio, **opts):
        return {"framework": fw, "mechanism": mech, "backend": backend, "time_ms": ms,
                "time_ratio": ratio, "status": "ok", "options": opts}  # fmt: skip

    rows = [
        row("dpsub", "dpsgd", "ghost", 120.0, 1.2), row("opacus", "dpsgd", "hooks", 100.0, 1.0),
        row("dpsub", "gep", "vmap", 100.0, 2.0, warm_start=True),
        row("gep-authors", "gep", "backpack", 300.0, 6.0),
    ]  # fmt: skip
    text = "\n".join(bench.target_lines(rows, "resnet20"))
    assert "1.20x non-private" in text and "missed by 4%" in text
    assert "slower by 20% (missed)" in text and "3.00x faster" in text and "of 5x" in text


def test_scaling_rows_csv_and_plot(tmp_path):
    s = scaling.Setting("batch", "resnet20", 64)
    recs = [
        {"mechanism": "nonprivate", "backend": "-", "status": "ok", "time_ms": 10.0,
         "time_ratio": 1.0, "params": 5, "min_ms": 9, "max_ms": 11, "peak_extra_mib": 1.0},
        {"mechanism": "dpsgd", "backend": "ghost", "status": "ok", "time_ms": 12.0,
         "time_ratio": 1.2, "params": 5, "min_ms": 11, "max_ms": 13, "peak_extra_mib": 2.0},
        {"mechanism": "dpsgd", "backend": "vmap", "status": "ok", "time_ms": 30.0,
         "time_ratio": 3.0},
    ]  # fmt: skip
    table = scaling.rows(s, recs) + scaling.rows(scaling.Setting("batch", "resnet20", 128), recs)
    assert [r["series"] for r in table[:2]] == ["non-private", "DP-SGD (ghost)"]
    assert len(table) == 4  # the vmap DP-SGD row is no series of the plot
    scaling.write_csv(tmp_path / "s.csv", table)
    back = scaling.read_csv(tmp_path / "s.csv")
    assert float(back[1]["time_ratio"]) == 1.2
    scaling.plot(back, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert scaling.model_sweep(64, [1, 2])[2].bench_args()[-1] == "model.width=2"


def test_gep_tracked_is_amortized_from_its_refit_and_steady_steps():
    s = scaling.Setting("batch", "resnet20", 64)
    recs = [
        {"mechanism": "nonprivate", "backend": "-", "status": "ok", "time_ms": 10.0,
         "time_ratio": 1.0, "min_ms": 10, "max_ms": 10},
        {"mechanism": "gep", "backend": "ghost", "status": "ok", "time_ms": 30.0,
         "time_ratio": 3.0, "min_ms": 20.0, "max_ms": 40.0},
    ]  # fmt: skip
    (gep,) = [r for r in scaling.amortize(scaling.rows(s, recs)) if r["mechanism"] == "gep"]
    want = (40.0 + (scaling.AMORTIZE - 1) * 20.0) / scaling.AMORTIZE
    assert gep["amortized_ms"] == want and gep["amortized_ratio"] == want / 10.0


def test_variant_rows_may_name_their_backend(bench):
    args = bench.build_parser().parse_args(
        ["--mechanisms", "dpsgd", "--backend", "vmap", "--variant", "gep@ghost:num_bases=4"]
    )
    assert bench.plan(args)[-1] == ("gep", "ghost", {"num_bases": 4})
    bad = bench.build_parser().parse_args(["--variant", "gep@nope:num_bases=4"])
    with pytest.raises(SystemExit, match="backend must be one of"):
        bench.plan(bad)
