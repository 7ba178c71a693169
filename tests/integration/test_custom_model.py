"""``model=custom model._target_=pkg.Class``: a user's model class through the command line.

It trains (DP-SGD, GEP, and DP-SGD with ghost clipping; a factory function too); a BatchNorm
model, a target that cannot be imported and one that is neither an ``nn.Module`` class nor a
function (or returns no module) are one line naming the module or ``model._target_``, exit
code 2, no run directory.
"""

from __future__ import annotations

import json

import pytest

from conftest import SYNTH, cli_in_process
from helpers.cli_errors import fails, one_line_error

CUSTOM = ("model=custom", "model._target_=helpers.nets.GNConvNet", "+model.width=4")
STEPS = (*SYNTH, "train.max_steps=2", "train.checkpoint_every=0")
GEP = ("mechanism=gep", "mechanism.num_bases=4", "aux=gaussian", "aux.num_samples=16")


@pytest.mark.parametrize(
    "extra",
    [("mechanism=dpsgd",), GEP, ("mechanism=dpsgd", "grads.backend=ghost")],
    ids=["dpsgd", "gep", "dpsgd-ghost"],
)
def test_a_model_given_by_its_target_trains(tmp_path, extra):
    run_dir = tmp_path / "run"
    cli_in_process(*STEPS, *CUSTOM, *extra, run_dir=run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("step") == 2 for r in rows), rows[-3:]


def test_a_factory_function_trains_and_torchvision_s_says_batchnorm(tmp_path):
    """``_target_`` may be a function returning a module (torchvision's ``resnet18``); it gets
    num_classes because it names it, never in_shape through its **kwargs."""
    run_dir = tmp_path / "run"
    cli_in_process(
        *STEPS, "model=custom", "model._target_=helpers.nets.gn_convnet", run_dir=run_dir
    )
    assert (run_dir / "summary.json").is_file()
    (tmp_path / "tv").mkdir()
    proc = fails(
        tmp_path / "tv", *STEPS, "model=custom", "model._target_=torchvision.models.resnet18"
    )
    one_line_error(proc, "BatchNorm2d", "GroupNorm")


def test_batchnorm_is_one_line_naming_the_module_and_groupnorm(tmp_path):
    proc = fails(tmp_path, *STEPS, *CUSTOM[:1], "model._target_=helpers.nets.BNConvNet")
    one_line_error(proc, "'norm'", "BatchNorm2d", "GroupNorm")


@pytest.mark.parametrize(
    "target, needle",
    [
        ("no_such_pkg.Net", "cannot import 'no_such_pkg.Net'"),
        ("helpers.nets.NoSuchNet", "cannot import 'helpers.nets.NoSuchNet'"),
        ("collections.OrderedDict", "is neither an nn.Module class nor a function"),
        ("helpers.nets.not_a_model", "returned dict, not an nn.Module"),
        ("helpers.nets.ConvGN.forward", "cannot import"),
        ("null", "package.module.Class"),
    ],
)
def test_a_bad_target_is_one_line_naming_the_key(tmp_path, target, needle):
    proc = fails(tmp_path, *STEPS, "model=custom", f"model._target_={target}")
    one_line_error(proc, "model._target_", needle)


def test_a_keyword_without_plus_says_to_add_it(tmp_path):
    proc = fails(tmp_path, *STEPS, *CUSTOM[:2], "model.width=4")
    one_line_error(proc, "model.width", "+model.width=")


def test_ghost_says_which_modules_have_no_rule_and_fall_back():
    import torch
    from torch import nn

    from dpsub.grads import check_private_model

    class Scale(nn.Module):  # owns a parameter, no ghost rule
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.s

    said: list[str] = []
    model = nn.Sequential(nn.Linear(4, 3), Scale())
    check_private_model(model, "vmap", said.append)
    assert said == []
    check_private_model(model, "ghost", said.append)
    assert len(said) == 1 and "'1' (Scale)" in said[0] and "vmap" in said[0], said
