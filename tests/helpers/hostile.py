"""Hostile examples against a release: the batch, the check and the axes of the tests.

A private batch holds ordinary examples and five hostile ones: finite pixels whose
gradient entries stay finite while its norm overflows float32 (pixels up to 1e37),
pixels x 1e38, a NaN pixel, an inf pixel and a huge but finite example (x 1e4). For
every release of the step (what the privatizer receives before noise), removing any one
hostile example changes it by at most its sensitivity, and every released value is
finite: an example whose norm is not finite contributes exactly zero, so its presence
cannot show as NaN (docs/privacy.md, "Hostile examples"). Then the trainer's own step
with the batch leaves the model finite.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dpsub.errors import ConfigError
from dpsub.mechanisms import StepContext
from dpsub.privacy import Privatizer, SeededNoise
from dpsub.training.build import build_run, train_step

from conftest import SYNTH, compose_cfg

HOSTILE = {  # name -> how an ordinary example becomes hostile
    "overflow": lambda x: x * (1e37 / x.abs().max()),  # finite logits and gradient, norm inf
    "x1e38": lambda x: x * 1e38,
    "nan": lambda x: torch.where(torch.arange(x.numel()).view_as(x) == 3, torch.nan, x),
    "inf": lambda x: torch.where(torch.arange(x.numel()).view_as(x) == 5, torch.inf, x),
    "huge": lambda x: x * 1e4,
}
MECHANISMS = {
    "dpsgd": [],
    "gep": ["aux=gaussian", "aux.num_samples=24", "mechanism.num_bases=6"],
    "bgep": ["aux=gaussian", "aux.num_samples=24", "mechanism.num_bases=6"],
    "pdpsgd": ["aux=gaussian", "aux.num_samples=24", "mechanism.num_bases=6"],
    "rpdpsgd": ["mechanism.num_bases=6"],
    "rgp": ["mechanism.rank=2"],
    "rgp_random": ["mechanism.rank=2"],
    "dppowersgd": ["mechanism.rank=2"],
    "dphero": [],
    "dphero_floor": [],
}
MODELS = {
    "linear": ["model=linear"],
    "cnn": ["model=mnist_cnn"],
    "features": [  # a linear model on frozen ScatterNet features (the hostile row is a feature row)
        "model=linear",
        "features=scatternet",
        "features.norm=none",
        "features.cache_dir=${oc.env:DPSUB_TEST_CACHE,outputs/cache}",
    ],
}
SMALL = (*SYNTH, "dataset.synthetic.n_train=96", "train.batch_size=32", "grads.microbatch=16")
#: GEP's own axes: how the residual is clipped (GEP only) and the precision of the subspace
GEP_MODES = [
    (m, [f"mechanism.precision={p}", f"mechanism.anchor_precision={a}", *r])
    for m in ("gep", "bgep")
    for p, a in itertools.product(("fp32", "bf16", "fp16"), ("fp32", "bf16"))
    for r in ([["mechanism.residual=bookkeeping"], ["mechanism.residual=materialize"]]
              if m == "gep" else [[]])
]  # fmt: skip


def build(*overrides: str):
    try:
        return build_run(compose_cfg(*SMALL, *overrides))
    except ConfigError as e:  # a combination the project refuses up front is not a hole
        pytest.skip(f"refused: {e}")


def releases(run, x, y) -> list[tuple[str, torch.Tensor, float]]:
    """(name, value before noise, sensitivity) of every release of one step on (x, y)."""
    seen = []
    noise = Privatizer(SeededNoise(torch.Generator().manual_seed(0)))
    gaussian, shaped = noise.gaussian, noise.shaped

    noise.gaussian = lambda s, *a, **k: (seen.append((_name(a, k), s)), gaussian(s, *a, **k))[1]
    noise.shaped = lambda s, *a, **k: (seen.append((_name(a, k, 2), s)), shaped(s, *a, **k))[1]
    ctx = StepContext(0, run.total_steps, 32.0, 1.0, noise, torch.Generator().manual_seed(1))
    out = run.mechanism.step(x, y, ctx)
    assert torch.isfinite(out.grad).all(), "the released gradient is not finite"
    return [(n, s.value.detach().double().clone(), s.sensitivity) for n, s in seen]


def _name(args, kwargs, at: int = 1) -> str:
    return kwargs.get("name", args[at] if len(args) > at else "release")


def check_hostile(run) -> None:
    d = run.data
    x, y = d.train_x[:24].clone(), d.train_y[:24].clone()
    bad = torch.stack([f(d.train_x[24 + i]) for i, f in enumerate(HOSTILE.values())])
    full_x, full_y = torch.cat([x, bad]), torch.cat([y, d.train_y[24 : 24 + len(HOSTILE)]])
    full = releases(run, full_x, full_y)
    assert full, "the step released nothing"
    for name, value, _ in full:
        assert torch.isfinite(value).all(), f"release {name!r} is not finite"
    for i, kind in enumerate(HOSTILE):
        keep = torch.ones(len(full_y), dtype=torch.bool)
        keep[24 + i] = False
        without = releases(run, full_x[keep], full_y[keep])
        for (name, a, sens), (_, b, _) in zip(full, without, strict=True):
            gap = float((a - b).norm())
            assert gap <= sens * (1 + 1e-3) + 1e-6, f"{kind}: {name} moved {gap} > {sens}"
    # the trainer's own step with the hostile batch: the model stays finite
    d.train_x, d.train_y = (
        torch.cat([d.train_x, bad]),
        torch.cat([d.train_y, d.train_y[24 : 24 + len(HOSTILE)]]),
    )
    n = len(d.train_y)
    train_step(run, idx=torch.cat([torch.arange(24), torch.arange(n - len(HOSTILE), n)]))
    for p in run.model.parameters():
        assert torch.isfinite(p).all(), "a hostile example made the model non-finite"
