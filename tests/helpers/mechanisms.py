"""A tiny mechanism set-up and step context shared by the mechanism unit tests."""

from __future__ import annotations

import torch

from dpsub.data.aux import AuxData
from dpsub.grads import GradEngine
from dpsub.mechanisms import StepContext, build_mechanism
from dpsub.privacy import Privatizer, SeededNoise

from helpers.nets import TinyNet


def make_huge(model, x, y):
    """Scale example 0 up and give it the least likely label: a huge gradient."""
    x, y = x.clone(), y.clone()
    x[0] *= 1e4
    with torch.no_grad():
        y[0] = model(x[:1]).argmin()
    return x, y


def setup(name, n=40, seed=0, aux_m=64, **opts):
    torch.manual_seed(seed)
    model = TinyNet()
    x = torch.randn(n, 12)
    y = torch.randint(0, 4, (n,))
    engine = GradEngine(model, microbatch=16)
    mech = build_mechanism(name, **opts)
    aux = None
    if mech.needs_aux:
        aux = AuxData(
            x=torch.randn(aux_m, 12),
            y=None,
            num_classes=4,
            source="test",
            labels="random_once",
            fixed_labels=torch.randint(0, 4, (aux_m,)),
        )
    mech.setup(engine, aux)
    return model, engine, mech, x, y


def reuse_per_example_grads(engine):
    """Compute the per-example gradients of the first batch once and hand the same chunks
    to every later ``engine.per_example`` call on that batch. For tests that release one
    fixed batch hundreds of times to measure the noise: the mechanism still clips,
    projects and draws noise at every step; only the (identical) gradients are not
    recomputed. The chunks are never modified in place by a mechanism (finite_norms copies)."""
    original, memo = engine.per_example, {}

    def per_example(x, y, *args, **kwargs):
        key = (id(x), id(y), args, tuple(sorted(kwargs.items())))
        if key not in memo:
            memo[key] = (x, y, list(original(x, y, *args, **kwargs)))  # x, y kept alive
        return iter(memo[key][2])

    engine.per_example = per_example
    return engine


def ctx(seed=0, B=40.0, step=0, z=0.0):
    """A step context at multiplier z whose noise comes from a generator seeded with ``seed``."""
    noise = Privatizer(SeededNoise(torch.Generator().manual_seed(seed)))
    return StepContext(step, 100, B, z, noise, torch.Generator().manual_seed(10_000 + seed))
