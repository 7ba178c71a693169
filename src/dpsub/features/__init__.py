"""Frozen features: a dataset served as the output of a fixed extractor (issue 24).

``featurize(data, opts, root)`` maps a loaded :class:`~dpsub.data.DatasetBundle` (train
and test) through a frozen extractor (``features/extractors.py``) once, caches the result
on disk (``features/cache.py``: keyed by the extractor's identity, its weights' hash and a
fingerprint of the images), normalizes it with constants that never come from the private
data, and returns a bundle of feature tensors ``(n, C', H', W')``. Everything downstream
(validation split, aux=heldout_test anchors, Poisson sampling, every mechanism) sees an
ordinary dataset.

Normalization (``features.norm``):

* ``public`` (default): per feature channel, mean and std of the extractor's output on
  ``features.norm_samples`` *public* images (``features.norm_path``; default the first
  CIFAR-100 training images under ``data.root``: ``features/public.py``), converted to the
  private images' shape (grayscale, resize).
* ``example``: each example standardized on its own, per group of channels
  (``features.groups``): Tramer and Boneh's data-independent group normalization.
* ``none``: raw features.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from dpsub.choices import MODEL_FILES
from dpsub.errors import DataError
from dpsub.features.cache import cached_features, run_extractor

__all__ = ["featurize", "public_stats", "normalize_examples"]

log = logging.getLogger("dpsub.features")


def _to_unit(x: torch.Tensor, mean, std) -> torch.Tensor:
    """Undo the dataset's fixed normalization: images back to [0, 1]."""
    shape = (1, len(mean), 1, 1)
    return x * torch.tensor(std).view(shape) + torch.tensor(mean).view(shape)


def public_images(opts: dict, in_shape, root: Path, download: bool = False) -> torch.Tensor:
    """The public images the ``public`` normalization is computed on, in [0, 1], private shape."""
    from dpsub.data.aux import convert_images
    from dpsub.features.public import public_file, read_public

    file = public_file(opts, "norm_path", root, download)
    images, _ = read_public(file, root, int(opts.get("norm_samples", 2000)))
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
    c = in_shape[0]
    return convert_images(x, in_shape, (0.0,) * c, (1.0,) * c)


def public_stats(feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (over examples and positions) of PUBLIC features."""
    f = feats.double().transpose(0, 1).flatten(1)
    return f.mean(1).float(), f.std(1).clamp_min(1e-6).float()


def normalize_examples(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Each example standardized per group of channels (no statistic across examples)."""
    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"features.groups={groups} must divide the {c} feature channels")
    g = x.reshape(n, groups, -1)
    g = (g - g.mean(2, keepdim=True)) / g.std(2, keepdim=True).clamp_min(1e-6)
    return g.reshape(x.shape)


def _channel_affine(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (x - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def require_per_example(extractor, in_shape, image_size, opts: dict) -> None:
    """DataError unless the extractor maps each image alone: a feature that depends on the
    other images of its batch (a model saved with BatchNorm in training mode) makes one
    private example change the others' inputs, which the per-example clipping and its
    epsilon do not cover. Probed on 4 random images (no private data), batched and one by
    one."""
    x = torch.rand(4, *in_shape, generator=torch.Generator().manual_seed(0))
    key = "features.path" if opts["name"] in MODEL_FILES else "features.name"
    try:
        with torch.no_grad():
            together = run_extractor(extractor, x, 4, image_size)
            alone = torch.cat([run_extractor(extractor, xi[None], 1, image_size) for xi in x])
    except Exception as e:  # noqa: BLE001 -- e.g. BatchNorm in training mode on one image
        raise DataError(f"{key}: {opts.get('path') or opts['name']} fails on a batch of one "
                        f"image ({str(e).strip().splitlines()[0]})") from None  # fmt: skip
    tol = 1e-4 * float(together.abs().max().clamp_min(1e-12))
    if not torch.allclose(together, alone, rtol=1e-3, atol=tol):
        raise DataError(
            f"{key}: {opts.get('path') or opts['name']} gives an image other features in a "
            "batch than alone (BatchNorm in training mode?): each example's features must be "
            "its own for the clipping's bound to hold; save the model in eval mode"
        )


def featurize(data, opts: dict, root: str | Path, download: bool = False, counter=None):
    """The bundle ``data`` with its images replaced by normalized frozen features. The global
    random state is left as it was: building (or pretraining) an extractor draws from it,
    which would make a run's initialization depend on whether its process had already
    extracted these features (the second job of a sweep differed from the same job alone).
    ``download``: fetch the public CIFAR-100 images when missing; ``counter(total, what)``:
    progress while extracting (the trainer's bar, or plain lines without a terminal)."""
    with torch.random.fork_rng():
        return _featurize(data, opts, Path(root).expanduser(), download, counter)


def _featurize(data, opts: dict, root: Path, download: bool, counter):
    from dpsub.features.extractors import build_extractor

    extractor, ident = build_extractor(opts, data.in_shape, root, download)
    cache_dir = Path(str(opts["cache_dir"])).expanduser()
    batch, size = int(opts.get("batch_size", 500)), opts.get("image_size")
    require_per_example(extractor, data.in_shape, size, opts)

    def extract(x: torch.Tensor, what: str) -> torch.Tensor:
        return cached_features(extractor, ident, x, cache_dir, batch, size, what, counter)

    train = extract(_to_unit(data.train_x, data.mean, data.std), f"{data.name} train")
    test = extract(_to_unit(data.test_x, data.mean, data.std), f"{data.name} test")
    norm = opts.get("norm", "public")
    if norm == "public":
        public = public_images(opts, data.in_shape, root, download)
        mean, std = public_stats(extract(public, "public"))
        train, test = _channel_affine(train, mean, std), _channel_affine(test, mean, std)
    elif norm == "example":
        groups = int(opts.get("groups", 1))
        train, test = normalize_examples(train, groups), normalize_examples(test, groups)
    elif norm != "none":
        raise ValueError(f"features.norm must be public, example or none, got {norm!r}")
    c = train.shape[1]
    log.info(
        "features %s: %s -> %s per example", ident["name"], data.in_shape, tuple(train.shape[1:])
    )
    return dataclasses.replace(
        data, name=f"{data.name}+{ident['name']}",
        train_x=train.contiguous(), test_x=test.contiguous(),
        mean=(0.0,) * c, std=(1.0,) * c, features=ident["name"],
    )  # fmt: skip
