"""The GPU kit in one command (docs/gpu.md): check, smoke suite, bench, table cells.

Here (the development machine)::

    python scripts/gpu_run.py --stage              # fill .gpu/ (wheels, CIFAR-10, anchors) from ../shared
    python scripts/gpu_run.py --carry              # what would travel, and its size (<= 64 MiB)
    python scripts/gpu_run.py --slim               # set aside results/ folders a GPU call never reads
    python scripts/gpu_run.py --tiny --out /tmp/o  # every step on the CPU at toy sizes
    python scripts/gpu_run.py --harvest DIR        # unpack a GPU command's $OUT into results/ (and unslim)
    python scripts/gpu_run.py --harvest DIR --slim # the same, then slim again for the next command

On the GPU machine (the checkout sent with ``.gpu`` carried)::

    python3 scripts/gpu_run.py --out $OUT                   # check, smoke, bench, cells
    python3 scripts/gpu_run.py --out $OUT --steps check cells   # later commands: more cells
    python3 scripts/gpu_run.py --out $OUT --steps check cells --campaigns gep1-cifar10-cpu-long
    python3 scripts/gpu_run.py --out $OUT --steps check cells --parallel 4   # 4 cells at once

A missing set-up is one line on stderr and exit code 2; 1 when a step reported errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dpsub.experiments.gpu import cells, kit, stage
from dpsub.paths import project_root

ROOT = project_root()  # the repository (an install: the working directory)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT)")
    p.add_argument("--steps", nargs="+", default=list(kit.STEPS), choices=kit.STEPS)
    p.add_argument("--budget", type=float, default=kit.BUDGET_S, help="seconds for the command")
    p.add_argument("--tiny", "--dry-run", action="store_true", help="CPU, toy sizes (tests)")
    p.add_argument("--data-root", type=Path, default=None, help="holds cifar-10-batches-py/")
    p.add_argument("--work", type=Path, default=None, help="scratch folder outside the checkout")
    p.add_argument(
        "--gep-authors", type=Path, default=None, help="checkout of the GEP authors' code"
    )
    p.add_argument("--max-cells", type=int, default=None, help="cells of the queue to consider")
    p.add_argument("--campaigns", nargs="+", default=None, choices=list(cells.CAMPAIGNS),
                   help="the campaigns of the cells step, in this order (default: all, "
                        f"{' '.join(cells.DEFAULT_ORDER)})")  # fmt: skip
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help=f"cells trained at once on the GPU (default {kit.PARALLEL}; --tiny: 1)")  # fmt: skip
    p.add_argument("--cell-overrides", nargs="*", default=None, metavar="KEY=VALUE",
                   help="for the cells started here, beside their table's (default: "
                        f"{' '.join(kit.Options.cell_overrides)}; keys: "
                        f"{', '.join(cells.CELL_OVERRIDE_KEYS)})")  # fmt: skip
    p.add_argument("--interrupt-cells", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--stage", action="store_true", help="fill .gpu/ from the shared folder")
    p.add_argument("--shared", type=Path, default=None, help="shared folder (default ../shared)")
    p.add_argument("--carry", action="store_true", help="print what would travel and its size")
    p.add_argument(
        "--slim",
        action="store_true",
        help="delete the committed results/ folders a GPU call never reads (all but tables)",
    )
    p.add_argument("--unslim", action="store_true", help="bring them back (git checkout)")
    p.add_argument("--harvest", type=Path, default=None, metavar="DIR", help="unpack $OUT's files")
    return p.parse_args(argv)


def kit_root(a: argparse.Namespace) -> Path:
    """Where results/ and .gpu/ are: the repository, except that ``--tiny`` (toy cells on the
    CPU) works in a scratch folder unless ``--root`` names one, so its toy runs can never land
    beside the committed tables (they once did, through a test run under a mutant)."""
    if a.root is not None:
        return a.root
    if a.tiny and not (a.stage or a.carry or a.slim or a.unslim or a.harvest):
        return Path(a.work or Path(os.environ.get("TMPDIR", "/tmp")) / "dpsub-gpu") / "tiny-root"
    return ROOT


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    a.root = kit_root(a)
    try:
        if a.stage:
            for s in stage.stage(a.root, a.shared):
                print(f"staged {s.path.relative_to(a.root)} ({s.bytes / stage.MiB:.1f} MiB)")
        if a.harvest:
            from dpsub.experiments.gpu.harvest import harvest

            back = stage.unslim(a.root)
            if back:
                print(f"brought back: {', '.join(back)}")
            for line in harvest(a.harvest, a.root):
                print(line)
            if not a.slim:
                return 0
        if a.slim or a.unslim:
            moved = stage.slim(a.root) if a.slim else stage.unslim(a.root)
            print(("set aside: " if a.slim else "brought back: ") + (", ".join(moved) or "nothing"))
        if a.stage or a.carry or a.slim:
            total = stage.carry_bytes(a.root)
            print(f"would travel: {total / stage.MiB:.1f} MiB of {stage.CARRY_LIMIT // stage.MiB}"
                  " (as a tar: 512 bytes a file beside its content)")  # fmt: skip
            if total > stage.CARRY_LIMIT and not a.slim:
                lean = stage.carry_bytes(a.root, slimmed=True) / stage.MiB
                print(f"too much: python scripts/gpu_run.py --slim first ({lean:.1f} MiB then; "
                      "--harvest brings the folders back)")  # fmt: skip
            return 0 if total <= stage.CARRY_LIMIT else 1
        if a.unslim:
            return 0
        out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
        if out is None:
            raise stage.StageError("--out: no output folder (pass --out DIR or set $OUT)")
        parallel = kit.parallel_of(a.parallel, a.tiny)
        opts = kit.Options(
            out=out, steps=tuple(a.steps), budget_s=a.budget, tiny=a.tiny, root=a.root,
            data_root=a.data_root, work=a.work, gep_authors=a.gep_authors,
            max_cells=a.max_cells, interrupt_cells=a.interrupt_cells,
            campaigns=tuple(a.campaigns) if a.campaigns else None, parallel=parallel,
        )  # fmt: skip
        if parallel < 1:
            raise stage.StageError(f"--parallel: must be >= 1, got {parallel}")
        if a.cell_overrides is not None:
            try:
                opts.cell_overrides = tuple(cells.check_cell_overrides(a.cell_overrides))
            except ValueError as e:
                raise stage.StageError(f"--cell-overrides: {e}") from None
        return kit.run_kit(opts)
    except stage.StageError as e:
        print(f"gpu_run: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
