"""Cost growth: step time against batch size and model size, as a PNG with its data.

Each setting of the two sweeps is one interleaved ``scripts/bench.py`` run of the same rows:
non-private, DP-SGD (ghost), GEP tracked (per-example rows from the ghost backend: ``num_bases``, ``aux_size`` anchors, a
warm-started refit every ``subspace_every`` steps, timed over a multiple of it, mean =
amortized) and RGP (ghost). Library: :mod:`dpsub.experiments.bench.scaling`.

Usage::

    python scripts/bench_scaling.py --threads 1 \\
        --out results/bench/scaling_cpu          # -> .csv, .json (bench records), .png
    python scripts/bench_scaling.py --plot-only --out results/bench/scaling_cpu
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from dpsub.experiments import benchmark as bench  # the timing code (scripts/bench.py)
from dpsub.experiments.bench import scaling  # noqa: E402


def bench_argv(s: scaling.Setting, args, out: Path) -> list[str]:
    k = args.subspace_every
    return [
        *s.bench_args(), "--mechanisms", "dpsgd", "gep", "rgp", "--backend", "ghost", "--aux-size", str(args.aux_size),
        "--set", f"gep.num_bases={args.num_bases}", "--set", f"gep.subspace_every={k}",
        "--set", "gep.warm_start=true", "--statistic", "mean", "--steps", str(k),
        "--warmup", "0", "--threads", str(args.threads), "--device", "cpu",
        "--microbatch", str(min(args.microbatch, s.batch_size)), "--out", str(out),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("results/bench/scaling_cpu"))
    p.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--batch-model", default="resnet20")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--model-batch", type=int, default=64, help="batch of the model-size sweep")
    p.add_argument("--num-bases", type=int, default=256)
    p.add_argument("--aux-size", type=int, default=512)
    p.add_argument("--subspace-every", type=int, default=4, help="GEP tracked refit cadence")
    p.add_argument("--microbatch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot-only", action="store_true", help="re-plot the committed CSV")
    p.add_argument("--resume", action="store_true", help="keep the CSV's settings, run the rest")
    args = p.parse_args(argv)
    csv_path, png = args.out.with_suffix(".csv"), args.out.with_suffix(".png")
    title = f"CPU, {args.threads} thread(s); GEP tracked: k={args.num_bases}, m={args.aux_size}, "
    title += f"refit every {scaling.AMORTIZE} steps (amortized from a refit and a steady step)"
    if args.plot_only:
        scaling.plot(scaling.amortize(scaling.read_csv(csv_path)), png, title)
        return 0
    settings = scaling.batch_sweep(args.batch_model, args.batches)
    settings += scaling.model_sweep(args.model_batch, args.widths)
    table, records = [], []
    if args.resume and csv_path.exists():
        table = scaling.read_csv(csv_path)
        records = json.loads(args.out.with_suffix(".json").read_text())
        done = {scaling.key_of(r) for r in table}
        settings = [s for s in settings if scaling.key_of(s.__dict__) not in done]
    for s in settings:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bench.json"
            argv_s = bench_argv(s, args, out)
            bench.log(f"== {s}: bench.py {shlex.join(argv_s)}")
            bench.main(argv_s)
            recs = json.loads(out.read_text())
        table = scaling.amortize(table + scaling.rows(s, recs))
        records += [{**r, "setting": s.__dict__} for r in recs]
        scaling.write_csv(csv_path, table)  # after every setting: a partial sweep survives
        args.out.with_suffix(".json").write_text(json.dumps(records, indent=1, default=str))
        scaling.plot(table, png, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
