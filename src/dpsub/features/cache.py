"""The on-disk feature cache: ``<cache_dir>/features/<key>.pt``.

The key hashes the extractor's identity (name, options, weights hash, library version)
and a fingerprint of the exact input images (shape and bytes), so a different extractor,
different weights or different data (another split, a train_size subset, another copy of
the files) never reuses stale features.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from torch.nn import functional as F

log = logging.getLogger("dpsub.features")


def fingerprint(x: torch.Tensor) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(str((tuple(x.shape), str(x.dtype))).encode())
    h.update(x.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def cache_key(ident: dict, x: torch.Tensor, image_size=None) -> str:
    spec = json.dumps({"extractor": ident, "image_size": image_size}, sort_keys=True)
    return hashlib.sha256((spec + fingerprint(x)).encode()).hexdigest()[:24]


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


def cached_features(
    extractor, ident, x, cache_dir: Path, batch: int, image_size, what: str, counter=None
):
    """The extractor's features of ``x`` (from the cache, or computed once and stored).
    ``counter(total, what)``: progress while extracting (the trainer's
    :class:`~dpsub.training.progress.Counter`: a bar, or a line at each tenth)."""
    path = Path(cache_dir) / "features" / f"{cache_key(ident, x, image_size)}.pt"
    if path.is_file():
        log.info("features of %s (%d examples): cached %s", what, len(x), path)
        return torch.load(path, map_location="cpu", weights_only=True)
    log.info("features of %s (%d examples): extracting with %s", what, len(x), ident["name"])
    progress = counter(len(x), f"features of {what}") if counter is not None else None
    try:
        feats = run_extractor(extractor, x, batch, image_size, progress)
    finally:
        if progress is not None:
            progress.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(feats, tmp)
    tmp.replace(path)  # atomic: a concurrent run never reads half a file
    return feats
