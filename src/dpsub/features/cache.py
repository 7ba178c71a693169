"""The on-disk feature cache: ``<cache_dir>/features/<key>.pt`` (and, while an extraction
runs, its finished batches in ``<key>.parts/``, from which a killed extraction resumes).

The key hashes the extractor's identity (name, options, weights hash, library version)
and a fingerprint of the exact input images (shape and bytes), so a different extractor,
different weights or different data (another split, a train_size subset, another copy of
the files) never reuses stale features. The fingerprint is keyed by the cache folder's own
random key (``features/.key``, owner-only): an unkeyed hash of the private images, in a
file name or a log line, let anyone holding a candidate dataset test it (a membership
test). The cached features of the private images are private data, like the images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from dpsub.rundir import owner_only_tmp, private_file, private_folder

log = logging.getLogger("dpsub.features")


def fingerprint(x: torch.Tensor, key: bytes = b"") -> str:
    """A hash of ``x``'s shape and bytes, keyed by ``key`` (the cache's secret: without it
    nobody can test a candidate dataset against a file name)."""
    h = hashlib.blake2b(digest_size=16, key=key)
    h.update(str((tuple(x.shape), str(x.dtype))).encode())
    h.update(x.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def cache_key(ident: dict, x: torch.Tensor, image_size=None, key: bytes = b"") -> str:
    spec = json.dumps({"extractor": ident, "image_size": image_size}, sort_keys=True)
    return hashlib.sha256((spec + fingerprint(x, key)).encode()).hexdigest()[:24]


def secret_key(folder: Path) -> bytes:
    """The cache folder's own random key (``.key``, readable by its owner only), made once."""
    path = folder / ".key"
    private_folder(folder, ours=True)
    if not path.is_file():
        tmp = owner_only_tmp(path, os.urandom(32))
        try:
            os.link(tmp, path)  # the first writer wins; the others read its key
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes()


@torch.no_grad()
def run_extractor(
    extractor, x: torch.Tensor, batch: int, image_size=None, counter=None
) -> torch.Tensor:
    """The extractor over ``x`` in batches; ``counter`` (``advance(n)``) told of each."""
    out = []
    for i in range(0, len(x), batch):
        xb = x[i : i + batch]
        if image_size:
            xb = F.interpolate(
                xb, size=(image_size, image_size), mode="bilinear", align_corners=False
            )
        out.append(extractor(xb).float())
        if counter is not None:
            counter.advance(len(xb))
    return torch.cat(out)


#: seconds of extraction between two writes of finished batches (a killed extraction
#: resumes from the last write and loses at most this much)
SAVE_EVERY_S = 60.0


def cached_features(
    extractor, ident, x, cache_dir: Path, batch: int, image_size, what: str, counter=None
):
    """The extractor's features of ``x`` (from the cache, or computed once and stored).
    Resumable: finished batches are written to ``<key>.parts/`` every :data:`SAVE_EVERY_S`
    seconds, a later call with the same key starts after them, and the parts become one
    file at the end. ``counter(total, what)``: progress while extracting (the trainer's
    :class:`~dpsub.training.progress.Counter`: a bar, or a line at each tenth)."""
    folder = Path(cache_dir) / "features"
    path = folder / f"{cache_key(ident, x, image_size, secret_key(folder))}.pt"
    if path.is_file():  # (its name is not logged: a hash of the private images)
        log.info("features of %s (%d examples): cached", what, len(x))
        return torch.load(path, map_location="cpu", weights_only=True)
    parts = path.with_suffix(".parts")
    done = finished_parts(parts)
    start = sum(len(t) for t in done)
    log.info("features of %s (%d examples): extracting with %s", what, len(x), ident["name"])
    if start:
        log.info("features of %s: resuming after %d examples", what, start)
    progress = counter(len(x), f"features of {what}") if counter is not None else None
    try:
        if progress is not None and start:
            progress.advance(start)
        done += _extract_parts(extractor, x, batch, image_size, progress, parts, start)
    finally:
        if progress is not None:
            progress.close()
    feats = torch.cat(done) if done else torch.empty(0)
    _save(feats, path)  # atomic: a concurrent run never reads half a file
    shutil.rmtree(parts, ignore_errors=True)
    return feats


def _extract_parts(extractor, x, batch, image_size, progress, parts: Path, start: int):
    """Features of ``x[start:]``, batch by batch, written to ``parts`` every SAVE_EVERY_S s."""
    out, pending, first, last = [], [], start, time.monotonic()
    for i in range(start, len(x), batch):
        pending.append(run_extractor(extractor, x[i : i + batch], batch, image_size, progress))
        stop = min(i + batch, len(x))
        if time.monotonic() - last >= SAVE_EVERY_S or stop == len(x):
            chunk = torch.cat(pending)
            _save(chunk, parts / f"{first:09d}-{stop:09d}.pt")
            out.append(chunk)
            pending, first, last = [], stop, time.monotonic()
    return out


def finished_parts(parts: Path) -> list[torch.Tensor]:
    """The written parts that continue each other from example 0 (``start-stop.pt``)."""
    found = {}
    for f in parts.glob("*.pt") if parts.is_dir() else ():
        a, _, b = f.stem.partition("-")
        if a.isdigit() and b.isdigit():
            found[int(a)] = (int(b), f)
    out, pos = [], 0
    while pos in found:
        stop, f = found[pos]
        t = torch.load(f, map_location="cpu", weights_only=True)
        if len(t) != stop - pos:
            break
        out.append(t)
        pos = stop
    return out


def _save(t: torch.Tensor, path: Path) -> None:
    """``t`` to ``path`` atomically, owner-only (features of the private images, unnoised)."""
    private_folder(path.parent)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with private_file(tmp) as f:
        torch.save(t, f)
    tmp.replace(path)
