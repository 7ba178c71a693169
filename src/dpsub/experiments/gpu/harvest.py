"""``--harvest DIR``: unpack what a GPU command left in ``$OUT`` into the repository.

``DIR`` is the folder the device tool copied ``$OUT`` into. Each step's outputs come as
one tar (``check.tar``, ``smoke.tar``, ``bench.tar``, ``cells.tar``) beside the kit's own
``gpu_run.log`` and ``gpu_run.json``; a step killed before its tar was written leaves its
folder instead, which is read the same way. Destinations:

* ``results/gpu/<started>-<device>/`` (one folder per GPU command, so an earlier command's
  record is never overwritten): the set-up check, the smoke suite's log and JUnit XML, the
  kit's log and record, the cells step's log and each cell's output (``cell-NN.log``);
* ``results/bench/gpu_*.md`` and ``.json``: the bench;
* ``results/tables/...``: finished cells (no checkpoint); ``.gpu/cells/...``: cells in
  progress with their checkpoint, to travel with the next GPU command, parked in the tracked
  ``results/gpu/cells_in_progress.tar`` for a later machine (``stage.park_cells``).
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from dpsub.experiments.gpu.cells import CKPT_TAR, harvest_cells
from dpsub.experiments.gpu.stage import StageError, park_cells

#: step -> where its files go (relative to the repository root; "{record}": record_dir)
DEST = {"check": "{record}", "smoke": "{record}", "bench": "results/bench"}
KIT_FILES = ("gpu_run.log", "gpu_run.json")


def safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Regular files with relative paths that stay inside the destination (no links, no ..)."""
    out = []
    for m in tar.getmembers():
        p = PurePosixPath(m.name)
        if not m.isfile() or p.is_absolute() or ".." in p.parts:
            continue
        out.append(m)
    return out


def _is_cell_log(name: str) -> bool:
    """The cells step's own log and its children's outputs (the tar's top level)."""
    return "/" not in name and name.endswith(".log")


def _flat(tar_path: Path, dest: Path, keep=lambda name: True) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tarfile.open(tar_path) as tar:
        for m in safe_members(tar):
            if not keep(m.name):
                continue
            target = dest / PurePosixPath(m.name).name
            with tar.extractfile(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            written.append(str(target))
    return written


def _pack_dir(folder: Path) -> Path:
    """A step folder left by a killed step, as a tar beside it (read like a finished step's)."""
    tar_path = folder.with_suffix(".partial.tar")
    with tarfile.open(tar_path, "w") as tar:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                tar.add(p, arcname=str(p.relative_to(folder)))
    return tar_path


def harvest(src: Path, root: Path) -> list[str]:
    """Unpack every step's outputs found in ``src`` into ``root``; the files written."""
    src, root = Path(src), Path(root)
    if not src.is_dir():
        raise StageError(f"--harvest: {src} is not a folder")
    written: list[str] = []
    record = record_dir(src)
    for step, dest in DEST.items():
        for tar_path in _step_tars(src, step):
            written += _flat(tar_path, root / dest.format(record=record))
    for tar_path in _step_tars(src, "cells"):
        written += harvest_cells(tar_path, root, ckpt_tar=src / CKPT_TAR)
        written += _flat(tar_path, root / record, keep=_is_cell_log)
    for name in KIT_FILES:
        if (src / name).is_file():
            (root / record).mkdir(parents=True, exist_ok=True)
            written.append(str(shutil.copy2(src / name, root / record / name)))
    if not written:
        raise StageError(f"--harvest: {src} holds no GPU kit outputs (*.tar, gpu_run.log)")
    return [*written, park_cells(root)]


def record_dir(src: Path) -> str:
    """``results/gpu/<UTC start, minutes>-<device>``, from the command's ``gpu_run.json``."""
    try:
        rec = json.loads((Path(src) / "gpu_run.json").read_text())
    except (OSError, ValueError):
        rec = {}
    started = str(rec.get("started") or "unknown-start").replace(":", "")[:15]
    check = rec.get("steps", {}).get("check", {})
    device = str(rec.get("device") or check.get("device") or "gpu")
    return f"results/gpu/{started}-{re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-')}"


def _step_tars(src: Path, step: str) -> list[Path]:
    out = [src / f"{step}.tar"] if (src / f"{step}.tar").is_file() else []
    if (src / step).is_dir():
        tmp = Path(shutil.mkdtemp()) / step
        shutil.copytree(src / step, tmp)
        out.append(_pack_dir(tmp))
    return out
