"""mechanism=gep_authors: GEP as its authors ran it on CIFAR-10, following the paper's text
(Section 4; docs/methods.md)."""

from __future__ import annotations

from dpsub.config import validate
from dpsub.grads.layout import ParamLayout
from dpsub.models import build_model
from dpsub.subspace.grouping import group_parameters, split_quota

from conftest import compose_cfg


def test_the_preset_is_the_papers_algorithm_with_the_codes_three_chunks():
    cfg = compose_cfg("experiment=gep_cifar10_eps2", "mechanism=gep_authors")
    s = validate(cfg)
    m = s.mechanism
    assert s.mechanism_name == "gep" and (m.grouping, m.num_groups) == ("chunks", 3)
    assert (m.num_bases, m.clip_embedding, m.clip_residual, m.power_iters) == (1000, 10.0, 2.0, 1)
    assert (m.subspace_every, m.warm_start) == (1, False)  # every step, a fresh random start
    assert (s.aux["name"], s.aux["num_samples"], s.aux["labels"]) == (
        "natural", 2000, "random_per_step",
    )  # fmt: skip
    o = s.optim  # the experiment's: the paper's Section 4
    assert (o.lr, o.momentum, o.weight_decay, list(o.schedule.milestones), o.schedule.gamma) == (
        0.1, 0.9, 1e-4, [0.5], 0.1,
    )  # fmt: skip


def test_three_chunks_of_resnet20_split_k_by_the_square_root_of_their_sizes():
    layout = ParamLayout.of(build_model("resnet20", (3, 32, 32), 10))
    groups = group_parameters(layout, "chunks", 3)
    sizes = [g.size for g in groups]
    assert sum(sizes) == layout.dim == 268_346 and max(sizes) - min(sizes) <= 1
    assert groups[0].start == 0 and groups[-1].end == layout.dim  # contiguous, not by layer
    assert split_quota(sizes, 1000) == [334, 333, 333]
