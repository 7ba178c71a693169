"""How stale may GEP's anchor subspace be on ResNet20 / CIFAR-10? (issue 37, docs/methods.md)

Library: :mod:`dpsub.experiments.bench.staleness` (the trajectory, the fits, the decision rule).

    python scripts/gep_staleness.py --out results/gep-staleness/resnet20-cifar10 data.root=DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dpsub.experiments.bench import staleness
from dpsub.rundir import METRICS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=2500, help="the last sample step")
    p.add_argument("--every", type=int, default=250, help="steps between samples")
    p.add_argument("--examples", type=int, default=128, help="private examples per sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--render", action="store_true", help="only print the table of --out")
    p.add_argument(
        "overrides",
        nargs="*",
        help="for both runs (data.root=...); gep:KEY=VALUE for the GEP run only",
    )
    a = p.parse_args(argv)
    if a.render:
        records = [json.loads(x) for x in (a.out / METRICS).read_text().splitlines()]
        summary = staleness.decide(records, (5, 20)) if records else {}
        print("\n".join(staleness.render(records, summary)))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "command.txt").write_text(" ".join(["python", *sys.argv]) + "\n")
    t0 = time.time()

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with (a.out / "staleness.log").open("a") as f:
            f.write(line + "\n")

    samples = tuple(range(a.every, a.steps + 1, a.every))
    summary = staleness.study(a.out, a.overrides, samples, a.examples, a.seed, log)
    log(f"done in {time.time() - t0:.0f} s: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
