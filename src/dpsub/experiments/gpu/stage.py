"""What travels to a GPU machine, and how the data is staged into the git-ignored ``.gpu/``.

The GPU machines (docs/gpu.md) receive a copy of the checkout: tracked files, untracked
files git does not ignore, and the ignored paths named in ``carry`` (here ``.gpu/``), 64 MiB
in all. They have torch but not hydra-core, omegaconf or opacus, and no network.
:func:`stage` fills ``.gpu/`` from a ``shared`` folder (a developer's ``../shared``; never
needed on a user's machine, where the real datasets sit under ``data.root``):

* ``wheels/``: the pure-Python wheels the machine lacks (from ``shared/device/wheels``);
* ``data/aux_packed.npz``: GEP's auxiliary images, the same 10,000 images the CPU runs read
  (so a GPU cell draws the same anchors as a CPU cell of the same config), each stored as a
  *lossless* WebP: 27 MiB become about 18 MiB; :func:`unpack_aux` rebuilds the very same
  array (checked against its SHA-256) at ``<data root>/aux/tinyimagenet_val_32x32.npz``;
* ``data/cifar10_jpeg_packed.npz``: the JPEG copy of CIFAR-10, repacked *losslessly*: every
  one of its 60,000 files starts with the same 585 header bytes, which are stored once.
  53 MiB become about 20 MiB; :func:`unpack_cifar10` rebuilds the very same bytes (checked
  against their SHA-256) and the shared decoder writes ``cifar-10-batches-py/`` from them;
* ``cells/``: table cells in progress (their checkpoints), put there by ``--harvest``, which
  also *parks* them in the tracked ``results/gpu/cells_in_progress.tar`` (:func:`park_cells`)
  because ``.gpu/`` is lost with the machine it was harvested on; :func:`stage` brings them
  back on a fresh checkout (:func:`unpark_cells`).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MiB = 2**20
#: what one device call may carry (tracked + untracked-not-ignored + carried paths)
CARRY_LIMIT = 64 * MiB
TAR_BLOCK = 512
SLIM_KEEP = ("tables",)  # the results/ folders a GPU command reads
#: one command's wall-clock limit on the device machine
COMMAND_LIMIT_S = 600
#: files that come back from $OUT: count, size of each, folder depth
OUT_MAX_FILES, OUT_MAX_FILE, OUT_MAX_DEPTH = 8, 16 * MiB, 2

GPU_DIR = ".gpu"
#: the cells in progress, committed (``.gpu/`` is ignored and does not outlive its machine)
PARKED = Path("results") / "gpu" / "cells_in_progress.tar"
WHEELS = ("hydra_core", "omegaconf", "antlr4_python3_runtime", "opacus")
AUX_FILE = Path("aux") / "tinyimagenet_val_32x32.npz"
PACKED_CIFAR = "cifar10_jpeg_packed.npz"
PACKED_AUX = "aux_packed.npz"
DECODER = "make_cifar10_batches.py"
SPLITS = ("train", "test")


class StageError(Exception):
    """Something the staging or the set-up needs is missing (one line: what and where)."""


# ------------------------------------------------------------------ carry list
def git_files(root: Path) -> list[Path]:
    """Tracked files and untracked files git does not ignore (what always travels)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout  # fmt: skip
    return [root / p for p in dict.fromkeys(out.decode().split("\0")) if p]


def travel_bytes(n: int) -> int:
    """What one file of ``n`` bytes costs in the device's 64 MiB, measured as a tar archive:
    a 512-byte header and the content padded to 512. The first GPU session (2026-11-26) was
    refused a tree of 8,500 files whose plain sizes summed to 59.6 MiB: as a tar it was 68."""
    return TAR_BLOCK + -(-n // TAR_BLOCK) * TAR_BLOCK


def carry_list(
    root: Path, carried: tuple[str, ...] = (GPU_DIR,), slimmed: bool = False
) -> list[tuple[Path, int]]:
    """(file, travel bytes) of everything one device call would send: the tree plus ``carried``
    (``slimmed``: without the folders :func:`slim` sets aside)."""
    aside = {d.relative_to(root).parts for d in set_aside(root)} if slimmed else set()
    files = [p for p in git_files(root) if p.is_file() and not _under(root, p, aside)]
    for c in carried:
        base = root / c
        if base.is_dir():
            files += sorted(p for p in base.rglob("*") if p.is_file())
    return [(p, travel_bytes(p.stat().st_size)) for p in dict.fromkeys(files)]


def _under(root: Path, p: Path, aside: set[tuple[str, ...]]) -> bool:
    parts = p.relative_to(root).parts
    return any(parts[: len(a)] == a for a in aside)


def set_aside(root: Path) -> list[Path]:
    """The folders of ``results/`` a GPU command never reads: all but ``results/tables``, and
    in it the tables no GPU campaign runs (``cells.CAMPAIGNS``; e.g. the frozen-feature
    tables, CPU-only): their runs cannot equal a cell's, so nothing would reuse them."""
    from dpsub.experiments.gpu.cells import CAMPAIGNS

    results, kit = root / "results", {c.table for c in CAMPAIGNS.values()}
    out = [d for d in sorted(results.iterdir()) if d.is_dir() and d.name not in SLIM_KEEP]
    tables = results / "tables"
    if tables.is_dir():
        out += [d for d in sorted(tables.iterdir()) if d.is_dir() and d.name not in kit]
    return out


def slim(root: Path) -> list[str]:
    """Set aside (delete from the working tree) the tracked folders of ``results/`` that a GPU
    command never reads (:func:`set_aside`; the campaigns' tables stay: their finished cells
    are skipped). They are committed, so :func:`unslim` (``git checkout``) brings them back.
    Untracked files in them stay (a harvested command's record, not yet committed, so a next
    command can follow at once); a changed tracked file is refused, but for the parked cells
    (:data:`PARKED`: every harvest writes it again from ``.gpu/cells``). Returns the folders."""
    removed = []
    for d in set_aside(root):
        rel = str(d.relative_to(root))
        status = [
            line
            for line in _git(root, "status", "--porcelain", "--", rel).splitlines()
            if not line.endswith(PARKED.as_posix())
        ]  # re-parked by every harvest
        if any(not line.startswith("??") for line in status):
            raise StageError(f"--slim: {rel} has uncommitted changes; commit them first")
        tracked = _git(root, "ls-files", "--", rel).splitlines()
        if not tracked:
            continue
        if not status:
            shutil.rmtree(d)
        else:  # keep the untracked files: delete the tracked ones, then the emptied folders
            for f in tracked:
                (root / f).unlink(missing_ok=True)
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), reverse=True):
                if not any(sub.iterdir()):
                    sub.rmdir()
        removed.append(rel)
    return removed


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def unslim(root: Path) -> list[str]:
    """Bring back the committed ``results/`` folders that :func:`slim` set aside."""
    gone = _git(root, "ls-files", "--deleted", "--", "results").split()
    if gone:
        subprocess.run(["git", "checkout", "--", *gone], cwd=root, check=True)
    return sorted({"/".join(g.split("/")[: 3 if g.startswith("results/tables/") else 2])
                   for g in gone})  # fmt: skip


def carry_bytes(root: Path, carried: tuple[str, ...] = (GPU_DIR,), slimmed: bool = False) -> int:
    return sum(n for _, n in carry_list(root, carried, slimmed))


# --------------------------------------------------------------- CIFAR-10 pack
def _files(blob: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    raw = blob.tobytes()
    return [raw[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def common_prefix(files: list[bytes], limit: int = 4096) -> bytes:
    """The longest prefix (at most ``limit`` bytes) shared by every file."""
    prefix = files[0][:limit] if files else b""
    for f in files:
        while not f.startswith(prefix):
            prefix = prefix[: len(prefix) - 1 - (len(prefix) - 1) // 16]  # shrink fast
    return prefix


def pack_cifar10(src: Path, dest: Path) -> dict:
    """Write ``dest``: ``src`` (the JPEG copy's npz) with the shared header stored once."""
    z = np.load(src)
    files = {s: _files(z[f"{s}_jpeg"], z[f"{s}_offsets"]) for s in SPLITS}
    prefix = common_prefix(files["train"] + files["test"])
    out = {"prefix": np.frombuffer(prefix, np.uint8), "classes": z["classes"]}
    for s in SPLITS:
        tails = [f[len(prefix) :] for f in files[s]]
        out[f"{s}_tail"] = np.frombuffer(b"".join(tails), np.uint8)
        out[f"{s}_tail_offsets"] = np.cumsum([0] + [len(t) for t in tails]).astype(np.int64)
        out[f"{s}_labels"] = z[f"{s}_labels"]
        out[f"{s}_sha256"] = np.array(hashlib.sha256(z[f"{s}_jpeg"].tobytes()).hexdigest())
        out[f"{s}_dtypes"] = np.array([str(z[f"{s}_jpeg"].dtype), str(z[f"{s}_offsets"].dtype)])
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dest, **out)
    return {"prefix_bytes": len(prefix), "bytes": dest.stat().st_size}


def unpack_cifar10(packed: Path, dest: Path) -> Path:
    """Rebuild the JPEG copy's npz at ``dest`` from ``packed``, byte for byte (SHA-256 checked)."""
    z = np.load(packed)
    prefix = z["prefix"].tobytes()
    out = {"classes": z["classes"]}
    for s in SPLITS:
        tail, off = z[f"{s}_tail"].tobytes(), z[f"{s}_tail_offsets"]
        blob_dtype, off_dtype = (str(t) for t in z[f"{s}_dtypes"])
        files = [prefix + tail[off[i] : off[i + 1]] for i in range(len(off) - 1)]
        blob = b"".join(files)
        if hashlib.sha256(blob).hexdigest() != str(z[f"{s}_sha256"]):
            raise StageError(f"{packed}: the rebuilt {s} JPEG bytes do not match their SHA-256")
        out[f"{s}_jpeg"] = np.frombuffer(blob, np.uint8).astype(blob_dtype)
        out[f"{s}_offsets"] = np.cumsum([0] + [len(f) for f in files]).astype(off_dtype)
        out[f"{s}_labels"] = z[f"{s}_labels"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dest, **out)
    return dest


# -------------------------------------------------------------- auxiliary pack
def pack_aux(src: Path, dest: Path) -> dict:
    """Write ``dest``: the (n, H, W, 3) uint8 ``images`` of ``src``, each a lossless WebP."""
    from PIL import Image

    images = np.load(src)["images"]
    blobs = []
    for im in images:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, "WEBP", lossless=True, quality=0, method=4)  # 5 s, smallest
        blobs.append(buf.getvalue())
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        dest, webp=np.frombuffer(b"".join(blobs), np.uint8),
        offsets=np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64),
        shape=np.array(images.shape), sha256=np.array(_sha(images)),
    )  # fmt: skip
    return {"images": len(images), "bytes": dest.stat().st_size}


def unpack_aux(packed: Path, dest: Path) -> Path:
    """Rebuild the auxiliary images' npz at ``dest`` from ``packed`` (SHA-256 checked)."""
    from PIL import Image

    z = np.load(packed)
    raw, off = z["webp"].tobytes(), z["offsets"]
    try:
        images = np.stack([
            np.asarray(Image.open(io.BytesIO(raw[off[i] : off[i + 1]])).convert("RGB"))
            for i in range(len(off) - 1)
        ]).reshape(tuple(z["shape"]))  # fmt: skip
    except OSError as e:  # a Pillow without WebP
        raise StageError(f"{packed}: cannot decode its WebP images ({e})") from e
    if _sha(images) != str(z["sha256"]):
        raise StageError(f"{packed}: the rebuilt auxiliary images do not match their SHA-256")
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dest, images=images)
    return dest


def _sha(images: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images, np.uint8).tobytes()).hexdigest()


# ---------------------------------------------------------------------- stage
@dataclass
class Staged:
    path: Path
    bytes: int


def find_shared(root: Path, shared: Path | None = None) -> Path:
    """The ``shared`` folder (``--shared``, else ``../shared``), or a clear StageError."""
    cand = Path(shared) if shared else root.parent / "shared"
    if not (cand / "device" / "wheels").is_dir():
        raise StageError(
            f"staging needs the shared folder with device/wheels and data/ ({cand} not found); "
            "pass --shared PATH, or stage .gpu/ by hand (docs/gpu.md)"
        )
    return cand


def stage(root: Path, shared: Path | None = None, datasets: tuple[str, ...] = ("cifar10", "aux"))\
        -> list[Staged]:  # fmt: skip
    """Fill ``root/.gpu`` (keeping ``cells/``, and bringing back the parked ones) with wheels and
    ``datasets``; say what is missing."""
    sh = find_shared(root, shared)
    gpu = root / GPU_DIR
    done: list[Path] = [Path(f) for f in unpark_cells(root)]
    for sub in ("wheels", "data"):
        shutil.rmtree(gpu / sub, ignore_errors=True)
    for whl in sorted((sh / "device" / "wheels").glob("*.whl")):
        done.append(Path(shutil.copy2(whl, _mk(gpu / "wheels"))))
    data = sh / "data"
    for name in datasets:
        if name == "aux":
            _need(data / AUX_FILE)
            pack_aux(data / AUX_FILE, gpu / "data" / PACKED_AUX)
            done.append(gpu / "data" / PACKED_AUX)
        elif name == "cifar10":
            src = data / "cifar10_jpeg" / "cifar10_jpeg.npz"
            _need(src)
            _need(data / "cifar10_jpeg" / DECODER)
            pack_cifar10(src, gpu / "data" / PACKED_CIFAR)
            done.append(gpu / "data" / PACKED_CIFAR)
            done.append(Path(shutil.copy2(data / "cifar10_jpeg" / DECODER, gpu / "data")))
        else:
            raise StageError(f"stage: unknown dataset {name!r} (cifar10, aux)")
    return [Staged(p, p.stat().st_size) for p in done]


def park_cells(root: Path) -> str:
    """Write ``.gpu/cells`` (the cells in progress) into the tracked :data:`PARKED` tar, or
    delete the tar when none is in progress; what it did, in one line.

    This project's machines do not outlive a work period and ``.gpu/`` is git-ignored, so a
    GEP cell longer than one period's device time (2,500 steps at k = 1,000) restarted from
    step 0 on every lent machine: three sim-eps2 cells at 1,160-1,600 steps were lost that way
    (2026-11-28). Committing the tar (light checkpoints, about 2 MB a cell) keeps them. A
    file over the returned-file limit (a full checkpoint, never a light one) is refused.
    A checkpoint holds its noise generator's state: committed, it undoes the run's privacy,
    acceptable only for the kit's public-data campaigns (docs/gpu.md).
    """
    cells_dir, dest = Path(root) / GPU_DIR / "cells", Path(root) / PARKED
    files = sorted(p for p in cells_dir.rglob("*") if p.is_file()) if cells_dir.is_dir() else []
    if not files:
        existed = dest.is_file()
        dest.unlink(missing_ok=True)
        return f"no cell in progress{f': removed {PARKED}' if existed else ''}"
    big = next((p for p in files if p.stat().st_size > OUT_MAX_FILE), None)
    if big is not None:
        raise StageError(f"park: {big} is over {OUT_MAX_FILE // MiB} MiB (not a light "
                         "checkpoint); nothing parked")  # fmt: skip
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for f in files:  # reproducible: no owner, no time
            info = tar.gettarinfo(f, arcname=f.relative_to(cells_dir).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with f.open("rb") as fh:
                tar.addfile(info, fh)
    os.replace(tmp, dest)
    runs = {f.parent for f in files}
    return (f"parked {len(runs)} cell(s) in progress in {PARKED} "
            f"({dest.stat().st_size / MiB:.1f} MiB): commit it")  # fmt: skip


def unpark_cells(root: Path) -> list[str]:
    """Bring the parked cells (:func:`park_cells`) back into ``.gpu/cells``, each file not
    already there (a newer harvest wins); the files written."""
    from dpsub.experiments.gpu.harvest import safe_members

    src, cells_dir = Path(root) / PARKED, Path(root) / GPU_DIR / "cells"
    if not src.is_file():
        return []
    written = []
    with tarfile.open(src) as tar:
        for m in safe_members(tar):
            target = cells_dir / m.name
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as fh, target.open("wb") as out:
                shutil.copyfileobj(fh, out)
            written.append(str(target))
    return written


def _need(path: Path) -> None:
    if not path.is_file():
        raise StageError(f"stage: {path} not found")


def _mk(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return d
