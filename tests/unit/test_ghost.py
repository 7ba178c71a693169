"""Book-keeping ghost clipping equals materialized per-example clipping, on every model.

The reference materializes the per-example gradients with ``vmap(grad(...))`` over
``functional_call``, zeroes the rows with a non-finite entry and clips them with
:func:`dpsub.grads.clip.clipped_sum`; :class:`GhostClipper` must agree to float tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

import dpsub.grads.ghost as ghost
from dpsub.grads.clip import clipped_sum, finite_rows
from dpsub.grads.ghost import GhostClipper, GhostError
from dpsub.grads.layout import ParamLayout
from dpsub.models import build_model


@dataclass
class Ref:
    grad_sum: Tensor
    norms: Tensor
    loss: Tensor
    correct: Tensor
    nonfinite: Tensor
    clip: float


def reference(model: nn.Module, x: Tensor, y: Tensor, clip: float | None = None) -> Ref:
    """Materialize g_i by vmap(grad), zero non-finite rows, ``clip.clipped_sum``.

    ``clip=None``: the median norm, checked to clip some examples and not others.
    """
    layout = ParamLayout.of(model)
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def loss_i(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    G = layout.flatten(vmap(grad(loss_i), in_dims=(None, 0, 0))(params, x, y), batch=True)
    ok = finite_rows(G)
    norms = torch.where(ok[:, None], G, 0.0).norm(dim=1)
    if clip is None:
        clip = float(norms.median())
        assert (norms > clip * 1.01).any() and (norms < clip * 0.99).any()
    total, _ = clipped_sum(G, clip)
    with torch.no_grad():
        logits = model(x)
    loss = F.cross_entropy(logits, y, reduction="none")
    return Ref(total.value, norms, loss, logits.argmax(1) == y, ~ok, clip)


def assert_matches(res, ref: Ref, rtol: float = 1e-4) -> None:
    """Equal to float tolerance, except that the norms of layers at T > 1 positions are
    upper bounds: rounding errors added (``ghost._bounded``, < 1e-3 here), never below."""
    scale = float(ref.grad_sum.abs().max())
    torch.testing.assert_close(res.grad_sum, ref.grad_sum, rtol=1e-3, atol=rtol * scale)
    torch.testing.assert_close(res.norms, ref.norms, rtol=1e-3, atol=1e-6)
    assert (res.norms >= ref.norms * (1 - rtol)).all()
    assert torch.equal(res.nonfinite, ref.nonfinite)
    good = ~ref.nonfinite
    torch.testing.assert_close(res.loss[good], ref.loss[good], rtol=1e-5, atol=1e-6)
    assert torch.equal(res.correct, ref.correct)


def batch(shape, b: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, *shape, generator=g), torch.randint(0, 10, (b,), generator=g)


MODELS = {
    "mnist_cnn": ("mnist_cnn", (1, 28, 28), {}),
    "mnist_cnn-gn": ("mnist_cnn", (1, 28, 28), {"norm": "group"}),
    "lenet": ("lenet", (1, 28, 28), {}),
    "lenet-gn": ("lenet", (3, 32, 32), {"norm": "group"}),
    "resnet20": ("resnet20", (3, 32, 32), {}),
    "wrn-10-1": ("wrn", (3, 32, 32), {"depth": 10, "width": 1, "gn_groups": 4}),
}


def make(key: str, seed: int = 0):
    name, shape, kw = MODELS[key]
    torch.manual_seed(seed)
    return build_model(name, shape, 10, **kw), shape


# --------------------------------------------------------------- test models
class Scale(nn.Module):
    """A custom module owning Parameters (one in a ParameterList): the generic fallback."""

    def __init__(self, c: int):
        super().__init__()
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(c, 1))
        self.shift = nn.ParameterList([nn.Parameter(0.1 * torch.randn(c, 1))])

    def forward(self, h):
        return h * self.scale + self.shift[0] * h.tanh()


class FallbackNet(nn.Module):
    """Conv2d, then layers the closed forms do not cover (Conv1d, Embedding, Scale), an
    affine LayerNorm and a Linear on 3-D input (T = 5 positions)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.conv1d = nn.Conv1d(4, 5, 3, padding=1)
        self.scale = Scale(5)
        self.ln = nn.LayerNorm(36)
        self.seq = nn.Linear(36, 8)
        self.emb = nn.Embedding(2, 8)
        self.head = nn.Linear(40, 10)

    def forward(self, x):
        h = self.conv1d(torch.relu(self.conv(x)).flatten(2))  # (b, 5, 36)
        h = torch.tanh(self.seq(self.ln(self.scale(h))))  # (b, 5, 8)
        h = h + self.emb((x[:, 0, 0, :5] > 0).long())  # (b, 5, 8)
        return self.head(h.flatten(1))


class ConvZoo(nn.Module):
    """Conv2d with 'same' padding of an even kernel, reflect padding with dilation, stride
    with groups, and no bias."""

    def __init__(self):
        super().__init__()
        self.same = nn.Conv2d(2, 4, 4, padding="same")
        self.reflect = nn.Conv2d(4, 4, 3, padding=2, dilation=2, padding_mode="reflect")
        self.grouped = nn.Conv2d(4, 6, 3, stride=2, groups=2)
        self.nobias = nn.Conv2d(6, 3, 1, bias=False)
        self.head = nn.Linear(27, 10)

    def forward(self, x):
        h = torch.tanh(self.reflect(torch.tanh(self.same(x))))
        return self.head(self.nobias(torch.tanh(self.grouped(h))).flatten(1))


class SharedNet(nn.Module):
    """A Linear called twice, and two Linears sharing one weight (tied)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 8)
        self.twice = nn.Linear(8, 8)
        self.tied = nn.Linear(8, 8, bias=False)
        self.tied.weight = self.twice.weight
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        h = torch.tanh(self.inp(x.flatten(1)))
        h = torch.tanh(self.twice(torch.tanh(self.twice(h))))
        return self.head(torch.tanh(self.tied(h)))


# --------------------------------------------------------------------- tests
@pytest.mark.parametrize("key", list(MODELS))
def test_matches_reference_on_every_model(key):
    model, shape = make(key)
    x, y = batch(shape)
    ref = reference(model, x, y)
    res = GhostClipper(model).clipped_sum(x, y, ref.clip)
    assert res.grad_sum.shape == (ParamLayout.of(model).dim,)
    assert_matches(res, ref)


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
@pytest.mark.parametrize("keep_bytes", [0, 1 << 30])
@pytest.mark.parametrize("key", ["mnist_cnn", "lenet-gn"])
def test_forced_strategies_match_reference(key, strategy, keep_bytes):
    """Ghost norms (Gram matrices, T > 1 for convs) and materialization, kept or recomputed."""
    model, shape = make(key)
    x, y = batch(shape)
    ref = reference(model, x, y)
    clipper = GhostClipper(model, strategy=strategy, keep_bytes=keep_bytes)
    assert_matches(clipper.clipped_sum(x, y, ref.clip), ref)
    matmul = {n for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)}
    assert {clipper.choices[n] for n in matmul} == {strategy}


def test_per_example_conv_gradients_in_blocks(monkeypatch):
    """CPU blocks of examples: 3 (lenet-gn's first conv, 1800 bytes each), 1 (second)."""
    monkeypatch.setattr(ghost, "_CPU_BLOCK_BYTES", 3 * 1800)
    model, shape = make("lenet-gn")
    x, y = batch(shape, 7)
    ref = reference(model, x, y)
    clipper = GhostClipper(model, strategy="materialize", keep_bytes=0)
    assert_matches(clipper.clipped_sum(x, y, ref.clip), ref)


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
        nn.Conv2d(2, 5, 3, padding="same", padding_mode="reflect", bias=False),
        nn.Conv2d(3, 4, 3, stride=3, dilation=2),
    ],
    ids=["mnist-first", "strided-dilated", "reflect-same", "stride-3"],
)
def test_per_example_conv_gradients_of_a_first_layer(conv):
    """The few-channel path (input channels as the batch) equals vmap of the weight gradient."""
    torch.manual_seed(0)
    a = torch.randn(5, conv.in_channels, 13, 11)
    g = torch.randn_like(conv(a))
    lay = ghost._layers(conv)[0]
    assert lay.params["weight"].shape[1] <= ghost._FEW_CHANNELS

    def weight_grad(ai, gi):
        w = conv.weight.detach()
        _, pull = torch.func.vjp(lambda w: functional_call(conv, {"weight": w}, (ai[None],)), w)
        return pull(gi[None])[0]

    want = vmap(weight_grad)(a, g)
    torch.testing.assert_close(lay.rule.per_example(lay, a, g), want, rtol=1e-5, atol=1e-5)


def test_auto_mixes_ghost_and_materialization():
    """mnist_cnn: convolutions (T = 196, 25) are materialized, Linears (T = 1) ghost-normed."""
    model, shape = make("mnist_cnn")
    clipper = GhostClipper(model)
    clipper.clipped_sum(*batch(shape, 2), 1.0)
    assert clipper.choices == {
        "features.0": "materialize",
        "features.4": "materialize",
        "classifier.0": "ghost",
        "classifier.2": "ghost",
    }


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
def test_fallback_layers_are_exact(strategy):
    torch.manual_seed(0)
    model = FallbackNet()
    x, y = batch((2, 6, 6), 8)
    ref = reference(model, x, y)
    clipper = GhostClipper(model, strategy=strategy, keep_bytes=0)
    assert_matches(clipper.clipped_sum(x, y, ref.clip), ref)
    assert {k: clipper.choices[k] for k in ("conv1d", "scale", "emb", "ln", "seq")} == {
        "conv1d": "fallback",
        "scale": "fallback",
        "emb": "fallback",
        "ln": "materialize",
        "seq": strategy,
    }


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
def test_conv_variants_are_exact(strategy):
    torch.manual_seed(0)
    model = ConvZoo()
    x, y = batch((2, 8, 8), 8)
    ref = reference(model, x, y)
    clipper = GhostClipper(model, strategy=strategy, keep_bytes=0)
    assert_matches(clipper.clipped_sum(x, y, ref.clip), ref)
    assert clipper.choices["grouped"] == "materialize"  # ghost norms need groups == 1
    assert clipper.choices["same"] == clipper.choices["reflect"] == strategy


def test_shared_modules_and_tied_weights_are_exact():
    torch.manual_seed(0)
    model = SharedNet()
    x, y = batch((1, 3, 4), 8)
    ref = reference(model, x, y)
    clipper = GhostClipper(model, strategy="ghost")
    assert_matches(clipper.clipped_sum(x, y, ref.clip), ref)
    assert clipper.choices["twice"] == clipper.choices["tied"] == "materialize"  # tied
    assert clipper.choices["inp"] == "ghost"


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
@pytest.mark.parametrize(
    "key, poison", [("lenet-gn", "inf"), ("lenet-gn", "overflow"), ("fallback", "inf")]
)
def test_nonfinite_examples_are_dropped(key, poison, strategy):
    if key == "fallback":
        torch.manual_seed(0)
        model, shape = FallbackNet(), (2, 6, 6)
    else:
        model, shape = make(key)
    x, y = batch(shape, 7)
    bad = torch.tensor([False, False, True, False, False, True, False])
    if poison == "inf":
        x[2, 0, 1, 1], x[5, -1, 2, 3] = float("inf"), -float("inf")
    else:
        x[2], x[5] = 1e30 * x[2].sign(), -1e30 * x[5].sign()
    ref = reference(model, x, y)
    assert torch.equal(ref.nonfinite, bad)  # the poison does reach the gradients
    res = GhostClipper(model, strategy=strategy, keep_bytes=0).clipped_sum(x, y, ref.clip)
    assert torch.isfinite(res.grad_sum).all()
    assert torch.equal(res.nonfinite, bad) and (res.norms[bad] == 0).all()
    assert_matches(res, ref)
    clean = GhostClipper(model, strategy=strategy, keep_bytes=0).clipped_sum(
        x[~bad], y[~bad], ref.clip
    )
    torch.testing.assert_close(res.grad_sum, clean.grad_sum, rtol=1e-5, atol=1e-6)


class MaskedLogits(nn.Module):
    """Logits masked to -inf where the input says so: an infinite loss, finite gradients."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc(x).masked_fill(x[:, :10] > 100, -float("inf"))


def test_infinite_loss_is_dropped():
    torch.manual_seed(0)
    model = MaskedLogits()
    x, y = batch((1, 3, 4), 6)
    x.view(6, -1)[3, y[3]] = 1e3  # masks example 3's true class: loss +inf
    bad = torch.arange(6) == 3
    res = GhostClipper(model).clipped_sum(x, y, 0.1)
    assert torch.isinf(res.loss[3]) and torch.equal(res.nonfinite, bad)
    ref = reference(model, x[~bad], y[~bad], 0.1)
    torch.testing.assert_close(res.grad_sum, ref.grad_sum, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(res.norms[~bad], ref.norms, rtol=1e-4, atol=1e-7)


class TwoPositions(nn.Module):
    """One Linear at T = 2 positions; the logits are the difference of its two outputs."""

    def __init__(self, d: int = 16):
        super().__init__()
        torch.manual_seed(1)
        self.fc = nn.Linear(d, d, bias=False)
        nn.init.normal_(self.fc.weight, std=0.1)

    def forward(self, x):
        h = self.fc(x)
        return h[:, 0] - h[:, 1]


@pytest.mark.parametrize("big", [1e10, 2.0**30])
@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
def test_cancelling_positions_cannot_pass_unclipped(strategy, big):
    """Two positions equal up to one float32 step of 1e10: the float32 ghost norm cancels
    to 0 (clip factor 1) while the book-keeping sum is ~1,800 C: the sum must stay <= C.
    At 2^30 the float32 Gram's error also exceeds the float64 one's margin."""
    x = torch.full((1, 2, 16), big)
    x[0, 0, 15] += 1024.0
    x[0, 0, 14] -= 1024.0
    y = torch.tensor([3])
    res = GhostClipper(TwoPositions(), strategy=strategy, keep_bytes=0).clipped_sum(x, y, 1.0)
    assert torch.isfinite(res.grad_sum).all()
    assert float(res.grad_sum.norm()) <= 1.0 + 1e-5


def test_the_rounding_bound_covers_the_materialized_rows():
    """A materialized norm at T > 1 positions grows by the rows' worst rounding error
    (``gamma * reach``): a computed norm of 0 with terms of total size R still clips as if
    the example's part were ``gamma R`` (float32: (T + 8) 2^-24 R; TF32 inputs: + 2^-10 R)."""
    like, reach = torch.zeros(1), torch.tensor([1e6], dtype=torch.float64)
    got = ghost._bounded(torch.zeros(1), reach, 64, 0.0, like).sqrt()
    assert float(got) >= 72 * 2.0**-24 * 1e6 * (1 - 1e-6)
    tf32 = ghost._bounded(torch.zeros(1), reach, 64, 2.0**-11, like).sqrt()
    assert float(tf32) >= 2.0**-10 * 1e6
    assert torch.equal(
        ghost._bounded(torch.full((1,), 3.0), None, 1, 0.0, like), torch.full((1,), 3.0)
    )


class Positions(nn.Module):
    """A Linear at T positions, summed: example i's loss is its first output (B_i[t] = e_0)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.fc = nn.Linear(d, 1, bias=False)

    def forward(self, x):
        return self.fc(x).sum(1)


@pytest.mark.parametrize(("strategy", "T"), [("ghost", 256), ("materialize", 4096)])
def test_an_example_cannot_ride_the_rounding_of_the_others_sum(strategy, T):
    """254 examples put ~C each into one weight entry; the crafted one's T - 1 tiny terms
    are each just above half a float32 unit of that sum, so in a float32 book-keeping GEMM
    every one rounded up a whole unit: its part of the sum exceeded C (1.49 C at T = 65,536;
    review 2026-11-29). The sum at T > 1 is made in float64."""
    others = torch.zeros(254, T, 8)
    others[:, 0, 0] = 1.0
    v = 2.0**-17 * (1 + 2**-8)
    x = torch.zeros(1, T, 8)
    x[0, 0, 0], x[0, 1:, 0] = 1 / (1 + 2 * (T + 8) * 2.0**-24) - (T - 1) * v - 1e-6, v
    y = torch.zeros(255, dtype=torch.long)
    clip = GhostClipper(Positions(), strategy=strategy, keep_bytes=0,
                        loss_fn=lambda out, y: out[:, 0])  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (a float32 GEMM then adds in sequence: the attack's order)
    try:
        with_x = clip.clipped_sum(torch.cat([others, x]), y, 1.0).grad_sum.double()
        without = clip.clipped_sum(others, y[:-1], 1.0).grad_sum.double()
    finally:
        torch.set_num_threads(threads)
    assert float((with_x - without).norm()) <= 1.0 + 1e-6


@pytest.mark.parametrize("precision", ["high", "medium"])
@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
def test_reduced_precision_matmuls_cannot_pass_an_example_unclipped(precision, strategy):
    """``torch.set_float32_matmul_precision("medium")`` on a CPU with bf16 units rounds a
    float32 GEMM's inputs to bf16: two positions straddling a bf16 rounding boundary gave
    a norm of 0.18 and a sum of 668 C (review). The bound counts the inputs' rounding."""
    x = torch.full((1, 2, 64), 9984.0 + 32)
    x[0, 0] += 2.0**-9
    x[0, 1] -= 2.0**-9
    x = torch.cat([x, torch.zeros(31, 2, 64)])
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        clip = GhostClipper(TwoPositions(64), strategy=strategy, keep_bytes=0)
        res = clip.clipped_sum(x, torch.full((32,), 3), 1.0)
    finally:
        torch.set_float32_matmul_precision(old)
    assert float(res.grad_sum.norm()) <= 1.0 + 1e-5


@pytest.mark.parametrize("conv", [dict(), dict(stride=2, padding=1), dict(dilation=2, groups=2)])
def test_conv_reach_is_the_unfolded_bound(conv):
    """The rounding bound's scale ``sum_t ||A_t|| ||B_t||`` of a convolution, computed
    without unfolding, equals the unfolded one (all input channels for groups > 1) and
    bounds the per-example gradient's norm."""
    torch.manual_seed(0)
    m = nn.Conv2d(4, 6, 3, **conv)
    a, views = torch.randn(6, 4, 9, 9), 2
    g = torch.randn_like(m(a))
    lay = ghost._Layer("c", m, dict(m.named_parameters()), {}, ghost.RULES[nn.Conv2d])
    unf = F.unfold(a, 3, dilation=m.dilation, padding=m.padding, stride=m.stride).mT
    want = ghost._reach(unf, g.flatten(2).mT).view(-1, views).sum(1)
    got = ghost.RULES[nn.Conv2d].reach(lay, a, g, views)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=0)
    norms = lay.rule.per_example(lay, a, g, views=views).flatten(1).norm(dim=1)
    assert (norms.double() <= got * (1 + 1e-6)).all()


def test_microbatches_sum_to_one_chunk():
    model, shape = make("lenet-gn")
    x, y = batch(shape, 10)
    whole = GhostClipper(model).clipped_sum(x, y, 0.5)
    parts = GhostClipper(model, microbatch=3).clipped_sum(x, y, 0.5)
    for f in ("grad_sum", "norms", "loss"):
        torch.testing.assert_close(getattr(parts, f), getattr(whole, f), rtol=1e-5, atol=1e-6)
    assert torch.equal(parts.correct, whole.correct) and parts.norms.shape == (10,)


def test_frozen_parameters_are_skipped():
    model, shape = make("lenet-gn")
    model.features[0].weight.requires_grad_(False)
    model.classifier[0].bias.requires_grad_(False)
    x, y = batch(shape)
    ref = reference(model, x, y)
    res = GhostClipper(model).clipped_sum(x, y, ref.clip)
    layout = ParamLayout.of(model)
    assert "features.0.weight" not in layout.names and "features.0.bias" in layout.names
    assert res.grad_sum.shape == (layout.dim,)
    assert_matches(res, ref)


def hook_counts(model: nn.Module) -> list[int]:
    return [
        len(d)
        for m in model.modules()
        for d in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks)
    ]


@pytest.mark.parametrize("train", [True, False])
def test_model_is_left_as_found(train):
    model, shape = make("mnist_cnn-gn")
    model.train(train)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    marker = torch.full_like(model.features[0].weight, 7.0)
    model.features[0].weight.grad = marker
    hooks = hook_counts(model)
    with torch.no_grad():  # also works when called under no_grad
        GhostClipper(model).clipped_sum(*batch(shape), 1.0)
    assert hook_counts(model) == hooks
    assert torch._C._len_torch_function_stack() == 0
    assert all(m.training == train for m in model.modules())
    assert model.features[0].weight.grad is marker and (marker == 7).all()
    assert all(p.grad is None for n, p in model.named_parameters() if n != "features.0.weight")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


class Sneaky(nn.Module):
    """Uses ``fc.weight`` without calling ``fc``: hooks on ``fc`` would miss that use."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        return F.linear(x.flatten(1), self.fc.weight)


class InPlace(nn.Module):
    """Overwrites a Linear's output in place after the Linear's forward."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(12, 8), nn.Linear(8, 10)

    def forward(self, x):
        return self.head(F.relu(self.fc(x.flatten(1)), inplace=True))


class SharedTable(nn.Module):
    """An Embedding looked up at fixed positions: its output has no batch dimension."""

    def __init__(self):
        super().__init__()
        self.pos, self.fc = nn.Embedding(12, 1), nn.Linear(12, 10)

    def forward(self, x):
        return self.fc(x.flatten(1) + self.pos(torch.arange(12))[:, 0])


class BroadcastProj(nn.Module):
    """A Linear applied to a constant row that is broadcast over the batch."""

    def __init__(self):
        super().__init__()
        self.proj, self.fc = nn.Linear(3, 12), nn.Linear(12, 10)

    def forward(self, x):
        return self.fc(x.flatten(1) + self.proj(torch.ones(1, 3)))


@pytest.mark.parametrize("cls", [Sneaky, InPlace, SharedTable, BroadcastProj])
def test_models_that_hooks_cannot_account_for_are_refused(cls):
    model = cls()
    hooks = hook_counts(model)
    with pytest.raises(GhostError):
        GhostClipper(model).clipped_sum(*batch((1, 3, 4), 4), 1.0)
    assert hook_counts(model) == hooks and torch._C._len_torch_function_stack() == 0


def test_empty_batch():
    model, shape = make("mnist_cnn")
    res = GhostClipper(model).clipped_sum(torch.zeros(0, *shape), torch.zeros(0).long(), 1.0)
    assert res.grad_sum.shape == (ParamLayout.of(model).dim,) and not res.grad_sum.any()
    assert res.norms.shape == res.nonfinite.shape == (0,)


@pytest.mark.parametrize("model_name", ["mnist_cnn", "resnet20"])
def test_engine_ghost_backend_equals_vmap(model_name):
    """grads.backend=ghost: the engine's clipped sum equals vmap's, with the same sensitivity."""
    from dpsub.grads import GradEngine
    from dpsub.models import build_model

    torch.manual_seed(0)
    shape = (1, 28, 28) if model_name == "mnist_cnn" else (3, 32, 32)
    model = build_model(model_name, shape, 10)
    x, y = torch.randn(12, *shape), torch.randint(0, 10, (12,))
    x[4] = float("nan")
    ref = GradEngine(model, microbatch=5, backend="vmap").clipped_sum(x, y, 0.5)
    got = GradEngine(model, microbatch=5, backend="ghost").clipped_sum(x, y, 0.5)
    torch.testing.assert_close(got.sum.value, ref.sum.value, rtol=1e-4, atol=1e-6)
    assert got.sum.sensitivity == ref.sum.sensitivity == 0.5
    assert (
        (got.stats.clip.n, got.stats.clip.nonfinite)
        == (12, 1)
        == (ref.stats.clip.n, ref.stats.clip.nonfinite)
    )
    assert got.stats.clip.clipped == ref.stats.clip.clipped


@pytest.mark.parametrize("key", [*MODELS, "fallback", "shared"])
def test_per_example_rows_match_vmap(key):
    """grads.backend=ghost's per-example rows (GEP's input): vmap's, on every shipped model
    and on modules the closed forms do not cover; unused parameters get zero rows."""
    from dpsub.grads import GradEngine

    if key == "fallback":
        torch.manual_seed(0)
        model, shape = FallbackNet(), (2, 6, 6)
    elif key == "shared":
        torch.manual_seed(0)
        model, shape = SharedNet(), (12,)
    else:
        model, shape = make(key)
    x, y = batch(shape, b=7)
    ref = list(GradEngine(model, microbatch=4, backend="vmap").per_example(x, y))
    got = list(GradEngine(model, microbatch=4, backend="ghost").per_example(x, y))
    assert len(got) == len(ref) == 2
    for a, b in zip(got, ref, strict=True):
        scale = float(b.grads.abs().max())
        torch.testing.assert_close(a.grads, b.grads, rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
        assert torch.equal(a.correct, b.correct)


def test_per_example_rows_of_unused_parameters_are_zero():
    from dpsub.grads import GradEngine

    model, shape = make("mnist_cnn")
    model.spare = nn.Linear(3, 3)  # never called by forward
    x, y = batch(shape, b=3)
    G = next(GradEngine(model, backend="ghost").per_example(x, y)).grads
    lay = GradEngine(model).layout
    spare = lay.names.index("spare.weight")
    assert not G[:, lay.offsets[spare] : lay.offsets[spare] + 12].any()
    assert G.abs().sum() > 0
