"""Tests for dpsub.models: shapes, parameter counts, vmap per-example gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dpsub.models import MODELS, build_model, count_parameters

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)

# Small configurations that keep the CPU tests fast.
FAST_KWARGS = {
    "mnist_cnn": {},
    "lenet": {},
    "resnet20": {},
    "wrn": {"depth": 10, "width": 1},
    "cifar_cnn": {"channels": 8, "hidden": 16},
    "mlp": {"hidden": 16},
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_registry_names():
    assert set(MODELS) == {
        "mnist_cnn",
        "lenet",
        "resnet20",
        "wrn",
        "cifar_cnn",
        "linear",
        "scatter_cnn",
        "mlp",
        "custom",
    }


def test_a_custom_class_gets_in_shape_and_num_classes_only_when_it_names_them():
    net = build_model("custom", MNIST, 7, _target_="helpers.nets.GNConvNet", width=2)
    assert net(torch.randn(2, *MNIST)).shape == (2, 7) and net.conv.out_channels == 2
    tiny = build_model("custom", MNIST, 7, _target_="helpers.nets.TinyNet", d=28 * 28, c=5)
    assert tiny(torch.randn(2, *MNIST)).shape == (2, 5)  # TinyNet(d, h, c): its own keys only


@pytest.mark.parametrize("in_shape", [MNIST, CIFAR], ids=["mnist", "cifar"])
@pytest.mark.parametrize("name", sorted(FAST_KWARGS))
def test_forward_shapes(name, in_shape):
    model = build_model(name, in_shape, 7, **FAST_KWARGS[name])
    out = model(torch.randn(2, *in_shape))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("in_shape", [MNIST, CIFAR], ids=["mnist", "cifar"])
@pytest.mark.parametrize("name", ["mnist_cnn", "lenet"])
def test_group_norm_variant(name, in_shape):
    model = build_model(name, in_shape, 10, norm="group")
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert model(torch.randn(2, *in_shape)).shape == (2, 10)
    with pytest.raises(ValueError):
        build_model(name, in_shape, 10, norm="batch")


@pytest.mark.parametrize(
    ("name", "in_shape", "kwargs", "expected"),
    [
        ("mnist_cnn", MNIST, {}, 26_010),
        ("mnist_cnn", CIFAR, {}, 37_274),
        ("lenet", MNIST, {}, 61_706),
        ("lenet", CIFAR, {}, 62_006),
        ("resnet20", CIFAR, {}, 268_346),
        ("resnet20", MNIST, {}, 268_058),
        ("wrn", CIFAR, {"depth": 28, "width": 4}, 5_828_800),
        ("wrn", CIFAR, {"depth": 28, "width": 2}, 1_458_272),
        ("wrn", CIFAR, {"depth": 10, "width": 1}, 74_800),
        ("cifar_cnn", CIFAR, {}, 1_832_266),  # Abadi et al.: 64 channels, 2 x 384 units
        ("cifar_cnn", MNIST, {}, 1_460_426),
    ],
)
def test_parameter_counts(name, in_shape, kwargs, expected):
    model = build_model(name, in_shape, 10, **kwargs)
    assert count_parameters(model) == expected


def test_mnist_cnn_flatten_size():
    assert build_model("mnist_cnn", MNIST, 10).flat_dim == 512
    assert build_model("lenet", MNIST, 10).flat_dim == 400
    assert build_model("lenet", CIFAR, 10).flat_dim == 400


def test_wrn_default_is_28_4():
    model = build_model("wrn", CIFAR, 10)
    assert (model.depth, model.width) == (28, 4)
    assert model.fc.bias is None and model.fc.in_features == 256
    with pytest.raises(ValueError):
        build_model("wrn", CIFAR, 10, depth=27)


@pytest.mark.parametrize("name", sorted(FAST_KWARGS))
def test_no_batchnorm_no_inplace(name):
    model = build_model(name, CIFAR, 10, **FAST_KWARGS[name])
    for m in model.modules():
        assert not isinstance(m, nn.modules.batchnorm._BatchNorm), m
        assert not getattr(m, "inplace", False), m
    # Every GroupNorm in the GEP / RGP ResNets is parameter-free.
    if name in ("resnet20", "wrn"):
        assert all(not m.affine for m in model.modules() if isinstance(m, nn.GroupNorm))


@pytest.mark.parametrize(
    ("name", "in_shape"),
    [
        ("mnist_cnn", MNIST),
        ("lenet", MNIST),
        ("resnet20", CIFAR),
        ("wrn", CIFAR),
        ("cifar_cnn", CIFAR),
    ],
)
def test_vmap_per_example_grads_match_loop(name, in_shape):
    model = build_model(name, in_shape, 10, **FAST_KWARGS[name]).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(3, *in_shape, dtype=torch.float64)
    y = torch.tensor([0, 3, 9])

    def loss_fn(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    per_example = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, x, y)

    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(per_example[k][i], p.grad, rtol=1e-9, atol=1e-11)


def test_unknown_model_raises():
    with pytest.raises(ValueError, match="not_a_model") as exc:
        build_model("not_a_model", CIFAR, 10)
    assert "resnet20" in str(exc.value)


def test_parameter_free_shortcut_zero_pads_channels():
    from dpsub.models.resnet import ParameterFreeShortcut

    x = torch.randn(2, 16, 8, 8)
    for out_planes in (32, 40):  # concat-with-zeros (x2) and generic zero padding
        sc = ParameterFreeShortcut(16, out_planes, stride=2, groups=4)
        out = sc(x)
        assert out.shape == (2, out_planes, 4, 4)
        assert torch.all(out[:, 16:] == 0)
        torch.testing.assert_close(out[:, :16], F.group_norm(x[:, :, ::2, ::2], 4))
        assert count_parameters(sc) == 0
        # Works on single examples under vmap as well.
        per_ex = vmap(lambda xi, sc=sc: sc(xi.unsqueeze(0)).squeeze(0))(x)
        torch.testing.assert_close(per_ex, out)
