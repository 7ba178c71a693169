"""Book-keeping ghost clipping: DP-SGD's clipped gradient sum from one forward and one backward.

For a batch ``(x, y)`` and a clip bound C, :class:`GhostClipper` computes

    grad_sum = sum_i c_i g_i,    c_i = min(1, C / (||g_i|| + 1e-12))  (0 if not finite),

where ``g_i`` is the gradient of example i's cross-entropy loss w.r.t. all trainable
parameters, exactly as materializing the ``(b, p)`` matrix of per-example gradients and
calling :func:`dpsub.grads.clip.clipped_sum` would, but without a second backward pass
and, for most layers, without ever forming ``g_i`` (Li et al. 2022, ghost clipping;
Bu et al. 2022, mixed ghost clipping; Bu et al., ICML 2023, book-keeping).

One forward pass stores the input ``a`` of every layer that owns trainable parameters;
one backward pass of ``sum_i loss_i`` (w.r.t. the layer *outputs* only, so autograd
skips the weight gradients) gives each layer's output gradient ``B``, per example since
examples do not interact. A layer ``out = W a + bias`` applied at T positions (T = 1 for
a plain Linear, the sequence length for a Linear on 3-D input, the output positions of
a Conv2d whose input is unfolded into patches of size d = C_in*kh*kw) has, with A_i the
(T, d) input and B_i the (T, out) output gradient of example i,

    grad_W(i) = B_i^T A_i,        grad_bias(i) = sum_t B_i[t],
    ||grad_W(i)||^2 = <A_i A_i^T, B_i B_i^T>     ghost norm, O(T^2 (d + out)) per example,
                    = ||B_i^T A_i||_F^2          materialized, O(T d out) per example.

A Conv2d's ``grad_W(i)`` for all i is the weight gradient of one convolution with the
batch folded into the channels (``groups * b`` groups; on the CPU in cache-sized blocks of
examples); its ghost norm unfolds the input (``groups == 1`` only).

The clipped sum is book-keeping: ``sum_i c_i grad_W(i) = sum_i (c_i B_i)^T A_i``, the
ordinary weight gradient of the output gradients scaled by the clip factors (one GEMM or
weight-gradient convolution, no second backward), or ``c @ G`` when the materialized
``grad_W(i)`` are kept (while they fit in ``keep_bytes``). The per-layer choice between
ghost norm and materialization (mixed ghost clipping) counts the multiply-adds of both
ways (:func:`_prefer_ghost`): ghost for a plain Linear (T = 1, where the norm is
``||a_i||^2 ||b_i||^2``), materialization for convolutions with many output positions.

Affine GroupNorm / LayerNorm get materialized per-example gradients (cheap: one value per
channel): ``grad_weight(i) = sum_positions xhat_i * B_i``, ``grad_bias(i) = sum B_i``.
Any other module owning trainable parameters falls back to materializing its own
per-example gradients with ``vmap`` over the batch of ``vjp`` of its functional forward,
given its stored inputs and output gradient, so such models stay exact.

Safety: while the forward runs, a ``TorchFunctionMode`` checks that every trainable
parameter is only used inside the forward of a module that owns it (the hooks would
otherwise miss part of its gradient and under-estimate the norm, i.e. the sensitivity);
parameters shared by several modules are materialized and summed by name; stored
activations must not be modified in place afterwards. Examples whose loss or gradient
norm is not finite get factor 0 and their rows are zeroed before the book-keeping sums,
so no NaN/Inf reaches ``grad_sum``; their reported norm is 0 (as in ``clip.clipped_sum``).
(An infinite loss with a finite gradient, e.g. a true class masked to -inf, is dropped too.)
At T > 1 positions the terms of ``B_i^T A_i`` may cancel (a crafted input whose float32
ghost norm was 0 once added ~1,800 C to the sum): there the ghost norm is formed in float64,
the book-keeping sum too (:func:`_book`), and a materialized norm gets the rounding bound of
the rows it came from (:func:`_bounded`).

Assumptions, as for any hook-based per-example method: row i of every layer's output
depends on example i only (no BatchNorm), every layer output (and a supported layer's
input) has the batch as its leading dimension (checked), and fallback modules are
deterministic (``vmap`` refuses random ops such as dropout there).
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpsub.grads.clip import clip_factors
from dpsub.grads.layout import ParamLayout
from dpsub.grads.loss import LossFn, correct, cross_entropy, per_example

__all__ = [
    "RULES",
    "GhostClipper",
    "GhostError",
    "GhostResult",
    "LayerRule",
    "fallback_layers",
    "register_rule",
]

STRATEGIES = ("auto", "ghost", "materialize")
# On the CPU, per-example convolution gradients are computed for as many examples at a time
# as fit in this many bytes (cache-sized blocks: ~2x faster on resnet20's 64-channel layers
# than the whole batch at once, measured with 1 thread); on a GPU the whole batch at once.
_CPU_BLOCK_BYTES = 1 << 21
# A convolution with at most this many input channels (a first layer) gets its per-example
# gradients on the CPU from one grouped convolution over the input channels.
_FEW_CHANNELS = 3


class GhostError(RuntimeError):
    """A model the hooks cannot account for exactly (the result would be wrong)."""


@dataclass
class GhostResult:
    """The clipped gradient sum of a batch, with the per-example by-products."""

    grad_sum: Tensor  # (p,) sum_i c_i g_i, in ParamLayout.of(model) order
    norms: Tensor  # (b,) ||g_i|| over all trainable parameters (0 for dropped examples)
    loss: Tensor  # (b,) per-example cross-entropy, detached
    correct: Tensor  # (b,) bool, argmax == label
    nonfinite: Tensor  # (b,) bool, dropped: non-finite loss or gradient


@dataclass
class _ChunkResult:
    """One micro-batch of :meth:`GhostClipper.clipped_sum`: the rows of a
    :class:`GhostResult` and the clipped sums by parameter name (layout names)."""

    norms: Tensor
    loss: Tensor
    correct: Tensor
    nonfinite: Tensor
    sums: dict[str, Tensor]


# ------------------------------------------------------------------------ layers
@dataclass
class _Call:
    """One forward call of a layer: its inputs, its output leaves and their gradients."""

    args: tuple
    kwargs: dict
    outs: list[Tensor]  # tensor leaves of the output
    out_spec: object  # pytree spec of the output
    versions: list[tuple[Tensor, int]]  # stored tensors and their version counters
    grads: list[Tensor | None] = field(default_factory=list)


@dataclass
class _Layer:
    """A module owning trainable parameters and how its per-example gradients are found."""

    name: str
    module: nn.Module
    params: dict[str, nn.Parameter]  # relative name -> parameter
    names: dict[str, str]  # relative name -> name in the layout
    rule: LayerRule  # how its per-example gradients are found (RULES, else FALLBACK)
    shared: bool = False  # a parameter also owned by another layer: materialize
    calls: list[_Call] = field(default_factory=list)


def _own_params(m: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters of ``m`` itself, plus those of its ParameterList/Dict children."""
    out = {n: p for n, p in m._parameters.items() if p is not None and p.requires_grad}
    for cn, c in m._modules.items():
        if isinstance(c, nn.ParameterList | nn.ParameterDict):
            out.update({f"{cn}.{n}": p for n, p in _own_params(c).items()})
    return out


def _layers(model: nn.Module) -> list[_Layer]:
    """Every module owning trainable parameters, named as in ``model.named_parameters()``."""
    canon = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    layers = []
    for name, m in model.named_modules():
        if isinstance(m, nn.ParameterList | nn.ParameterDict):
            continue
        own = _own_params(m)
        if own:
            names = {r: canon[id(p)] for r, p in own.items()}
            layers.append(_Layer(name, m, own, names, RULES.get(type(m), FALLBACK)))
    owners = Counter(id(p) for lay in layers for p in lay.params.values())
    for lay in layers:
        lay.shared = any(owners[id(p)] > 1 for p in lay.params.values())
    return layers


def fallback_layers(model: nn.Module) -> list[str]:
    """The modules owning trainable parameters that no rule covers, as ``'name' (Type)``:
    their per-example gradients are materialized by ``vmap`` of ``vjp`` (exact, slower)."""
    return [
        f"{lay.name!r} ({type(lay.module).__name__})"
        for lay in _layers(model)
        if lay.rule is FALLBACK
    ]


# -------------------------------------------------------------------- recording
class _ParamGuard(TorchFunctionMode):
    """Refuses any use of a trainable parameter outside the forward of a module owning it."""

    def __init__(self, owners: dict[int, list[nn.Module]], active: Counter):
        super().__init__()
        self.owners, self.active = owners, active

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, list | tuple) else (a,):
                if isinstance(t, nn.Parameter) and id(t) in self.owners:
                    self._check(t, func)
        return func(*args, **kwargs)

    def _check(self, p: nn.Parameter, func) -> None:
        if not any(self.active[id(m)] for m in self.owners[id(p)]):
            raise GhostError(
                f"a trainable parameter of shape {tuple(p.shape)} is used by "
                f"{getattr(func, '__name__', func)} outside the forward of its module; "
                "per-example gradients from module hooks would miss that use"
            )


class _Recorder:
    """Forward hooks that store every layer call; removed on exit."""

    def __init__(self, layers: list[_Layer]):
        self.layers = layers
        self.active: Counter = Counter()
        owners: dict[int, list[nn.Module]] = {}
        for lay in layers:
            for p in lay.params.values():
                owners.setdefault(id(p), []).append(lay.module)
        self.guard = _ParamGuard(owners, self.active)
        self.handles: list = []

    def __enter__(self) -> _Recorder:
        for lay in self.layers:
            lay.calls = []
            m = lay.module
            self.handles.append(m.register_forward_pre_hook(self._enter))
            self.handles.append(
                m.register_forward_hook(self._leave(lay), with_kwargs=True, prepend=True)
            )
        self.guard.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.guard.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _enter(self, module, args) -> None:
        self.active[id(module)] += 1

    def _leave(self, lay: _Layer):
        def hook(module, args, kwargs, output):
            self.active[id(module)] -= 1
            outs, spec = tree_flatten(output)
            stored = [t for t in (*tree_flatten((args, kwargs))[0], *outs) if isinstance(t, Tensor)]
            versions = [(t, t._version) for t in stored]
            lay.calls.append(_Call(args, kwargs, outs, spec, versions))

        return hook


def _differentiable(t) -> bool:
    return isinstance(t, Tensor) and t.requires_grad


def _check_versions(layers: list[_Layer]) -> None:
    """Stored inputs and outputs must be unchanged (no in-place op after the layer)."""
    for lay in layers:
        for call in lay.calls:
            if any(t._version != v for t, v in call.versions):
                raise GhostError(
                    f"an input or output of layer {lay.name!r} was modified in place after "
                    "its forward; use out-of-place operations (e.g. ReLU(inplace=False))"
                )


# ----------------------------------------------------------------- per layer
@dataclass
class _Chunk:
    """Per-example pieces of one micro-batch, before the clip factors are known."""

    b: int  # examples
    sq: Tensor  # (b,) squared norms of the parts not kept in ``mat``
    keep_left: int  # bytes of per-example gradients that may still be kept in ``mat``
    mat: dict[str, Tensor] = field(default_factory=dict)  # name -> (b, *shape)
    later: list[tuple[str, Callable]] = field(default_factory=list)  # name, (c, bad) -> sum
    #: per-layer output buffers reused from step to step (the clipper's): writing a fresh
    #: tens-of-MiB tensor page-faults it in, which cost resnet20 ~15% of a step on the CPU
    buffers: dict[str, Tensor] | None = None
    #: per-example rows written straight into the caller's (b, p) matrix: name -> its view
    rows_into: dict[str, Tensor] | None = None
    #: views per example (``train.augmult``): the layers saw b * views rows, example i's
    #: views being rows i * views ... (i + 1) * views - 1; its gradient is their sum
    views: int = 1

    def fold(self, t: Tensor) -> Tensor:
        """Per-view rows (b * views, ...) summed into per-example rows (b, ...)."""
        return t if self.views == 1 else t.view(self.b, self.views, *t.shape[1:]).sum(1)

    def unfold(self, t: Tensor | None) -> Tensor | None:
        """Per-example rows (b, ...) repeated for each view (b * views, ...)."""
        return t if t is None or self.views == 1 else t.repeat_interleave(self.views, 0)

    def buffer(
        self, key: str, shape: tuple[int, ...], like: Tensor, name: str = ""
    ) -> Tensor | None:
        """Where layer ``key``'s per-example gradients of parameter ``name`` go: the view of
        the caller's matrix, a reusable (b, *shape) tensor, or None (a fresh one)."""
        if self.rows_into is not None and name in self.rows_into and name not in self.mat:
            return self.rows_into[name]
        if self.buffers is None:
            return None
        buf = self.buffers.get(key)
        fits = buf is not None and buf.shape[1:] == shape and buf.shape[0] >= self.b
        if not (fits and buf.dtype == like.dtype and buf.device == like.device):
            buf = self.buffers[key] = like.new_empty(self.b, *shape)
        return buf[: self.b]

    def add(self, name: str, g: Tensor) -> None:
        """Materialized per-example gradients of ``name`` (summed over calls/owners)."""
        self.mat[name] = self.mat[name] + g if name in self.mat else g

    def keep(self, g: Tensor) -> bool:
        """Whether ``g`` fits in what is left of the budget (then it is counted)."""
        size = g.numel() * g.element_size()
        if size > self.keep_left:
            return False
        self.keep_left -= size
        return True


def _input(call: _Call) -> Tensor:
    """The input of a Linear / Conv2d / GroupNorm / LayerNorm call."""
    return call.args[0] if call.args else call.kwargs["input"]


def _conv_in(m: nn.Conv2d, a: Tensor) -> tuple[Tensor, tuple[int, int]]:
    """The convolution's input padded as its forward pads it, and the padding left to apply."""
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        return F.pad(a, m._reversed_padding_repeated_twice, mode=mode), (0, 0)
    return a, m.padding


def _per_example_few_channels(m: nn.Conv2d, a: Tensor, g: Tensor, pad) -> Tensor:
    """``grad_W(i)[o, c] = sum_t a_i[c, dil * k + stride * t] g_i[o, t]`` for all i in one
    convolution: the input channels are the batch, example i's output gradients are the
    filters of group i (``b`` groups), dilated by the stride, strided by the dilation.
    On the CPU ~1.5x faster than the folded weight gradient for a first layer (1-3 input
    channels, many positions; measured with 1 thread), slower for wide layers."""
    b, out, (kh, kw) = g.shape[0], g.shape[1], m.kernel_size
    if any(pad):
        a = F.pad(a, (pad[1], pad[1], pad[0], pad[0]))
    r = F.conv2d(
        a.transpose(0, 1), g.reshape(b * out, 1, *g.shape[2:]),
        stride=m.dilation, dilation=m.stride, groups=b,
    )  # fmt: skip
    r = r[..., :kh, :kw].reshape(a.shape[1], b, out, kh, kw)
    return r.permute(1, 2, 0, 3, 4).contiguous()


def _by_example(t: Tensor, b: int) -> Tensor:
    """(b * views, T, d) per-view patches as (b, views * T, d): an example's views are more
    positions of the same matrix product, so ``grad_W(i) = sum_v B_iv^T A_iv = B_i^T A_i``
    and its ghost norm ``<A_i A_i^T, B_i B_i^T>`` holds the cross-view Gram terms."""
    return t if t.shape[0] == b else t.reshape(b, -1, t.shape[-1])


def _views_as_batch(t: Tensor, views: int) -> Tensor:
    """(k * views, C, H, W) rows as (views, k * C, H, W): the views of k examples as the batch
    of a convolution with the examples folded into the channels (which sums over its batch)."""
    if views == 1:
        return t.reshape(1, -1, *t.shape[2:])
    k = t.shape[0] // views
    return t.view(k, views, *t.shape[1:]).transpose(0, 1).reshape(views, -1, *t.shape[2:])


def _ghost_sq(A: Tensor, B: Tensor) -> Tensor:
    """``||B_i^T A_i||_F^2 = <A_i A_i^T, B_i B_i^T>`` per example, without forming B_i^T A_i.
    At T > 1 positions the Gram terms have both signs and may cancel: they are formed in
    float64 (products of float32 values are exact there), see :func:`_bounded`."""
    if A.shape[1] == 1:
        return A.square().sum((1, 2)) * B.square().sum((1, 2))
    A, B = A.double(), B.double()
    return (torch.bmm(A, A.mT) * torch.bmm(B, B.mT)).sum((1, 2))


def _reach(A: Tensor, B: Tensor) -> Tensor:
    """``sum_t ||A_i[t]|| ||B_i[t]||`` per example (float64): an upper bound on
    ``||B_i^T A_i||_F`` with no cancellation, the scale of its rounding errors."""
    norm = functools.partial(torch.linalg.vector_norm, dim=-1, dtype=torch.float64)
    return (norm(A) * norm(B)).sum(1)


def _bounded(
    sq: Tensor, reach: Tensor | None, T: int, u_in: float, like: Tensor, gram: int = 0
) -> Tensor:
    """An upper bound on the squared norm of example i's part of the book-keeping sum *as
    computed* (in float64: :func:`_book`), given ``sq``: the float64 ghost norm (off by at
    most ``gram 2^-53 reach^2``, ``gram = d + out + T^2`` terms), or, ``gram = 0``, the
    norm of the materialized ``B_i^T A_i`` in ``like``'s dtype.

    At T > 1 positions ``B_i^T A_i = sum_t B_i[t] A_i[t]^T`` can cancel: a crafted input
    made the float32 ghost norm 0 while the sum carried ~1,800 C (clip factor 1). The
    materialized rows differ from the float64 sum by at most ``gamma * reach``, ``gamma =
    2 u_in + (T + 8) u``: u the dtype's unit roundoff, u_in that of the product's inputs
    when the matmul rounds them (TF32 2^-11, bf16 2^-9: :func:`_input_rounding`), the
    standard bound for T products accumulated per example. Benign examples pay about
    ``T u reach / norm`` in relative terms (lenet's convolutions: ~4e-5); the ghost norm
    ~1e-12; at T = 1 nothing (no cancellation, one product per entry)."""
    if T == 1:
        return sq
    exact = sq.double().clamp_min(0) + (gram + 4) * 2.0**-52 * reach.square()
    if gram:
        return exact.to(like.dtype)
    gamma = 2 * u_in + (T + 8) * torch.finfo(like.dtype).eps / 2
    return (exact.sqrt() + gamma * reach).square().to(like.dtype)


def _input_rounding(like: Tensor, conv: bool) -> float:
    """The unit roundoff with which a float32 matmul / convolution may round its inputs:
    TF32 (2^-11) or bf16 (2^-9) under ``torch.set_float32_matmul_precision`` ("high",
    "medium": also on CPUs with bf16 units) or CUDA's TF32 switches; 0 if it does not."""
    if like.dtype != torch.float32:
        return 0.0  # (already rounded to its own dtype: u covers it)
    precision = torch.get_float32_matmul_precision()
    u = {"highest": 0.0, "high": 2.0**-11, "medium": 2.0**-9}.get(precision, 2.0**-9)
    if like.is_cuda:
        tf32 = torch.backends.cudnn.allow_tf32 if conv else torch.backends.cuda.matmul.allow_tf32
        u = max(u, 2.0**-11 if tf32 else 0.0)
    return u


def _prefer_ghost(lay: _Layer, chunk: _Chunk, io: list, strategy: str) -> bool:
    """Mixed ghost clipping: the cheaper way to the weight's norm and clipped sum, counted in
    multiply-adds per example. Ghost norm: Gram matrices ``T^2 (d + out)`` plus the
    book-keeping GEMM ``T d out``; materializing: ``B_i^T A_i`` (``T d out``), its norm
    (``d out``) and ``c @ G`` (``d out``) if G fits in the budget, else the GEMM. Shared
    weights and grouped convolutions are always materialized (or ``strategy`` forces it)."""
    if not lay.rule.ghost_ok(lay):
        return False
    if strategy != "auto":
        return strategy == "ghost"
    sizes = [lay.rule.dims(lay, a, g) for a, g in io]
    T, (_, d, out) = sum(t for t, _, _ in sizes) * chunk.views, sizes[0]  # views: positions
    kept = chunk.keep_left >= chunk.b * d * out * io[0][1].element_size()
    ghost = T * T * (d + out) + T * d * out
    return ghost < T * d * out + d * out + (d * out if kept else T * d * out)


def _scaled(t: Tensor, c: Tensor, bad: Tensor | None) -> Tensor:
    """Rows of ``t`` times ``c`` (rows of dropped examples zeroed first: 0 * NaN = NaN)."""
    return _zero(t, bad) * c.view(-1, *([1] * (t.dim() - 1)))


def _book(lay: _Layer, io: list, c: Tensor, bad: Tensor | None, exact: bool = False) -> Tensor:
    """Book-keeping: ``sum_i c_i grad_W(i) = sum_i (c_i B_i)^T A_i``, the ordinary weight
    gradient of output gradients scaled by the clip factors (summed over the calls).

    ``exact`` (layers at T > 1 positions): in float64, cast back once. In the working dtype
    an example's T terms are added to an accumulator that already holds the other examples'
    sum, each addition off by half a unit of *that* sum: a review added 1.49 C through one
    example so (T = 65,536); a reduced-precision matmul (TF32, bf16) made it 668 C."""
    wide = (lambda t: t.double()) if exact else (lambda t: t)
    c = wide(c)
    total = _total(
        lay.rule.summed(lay, _zero(wide(a), bad), _scaled(wide(g), c, bad)) for a, g in io
    )
    return total.to(io[0][1].dtype)


# ------------------------------------------------------------ layer rules
class LayerRule:
    """How the per-example gradients of one module type are found.

    One instance per module type, registered by *exact* type in :data:`RULES` with
    :func:`register_rule` (as Opacus registers its grad samplers); every other module
    owning trainable parameters gets :data:`FALLBACK`. :meth:`process` adds a layer's
    per-example pieces of one micro-batch to the chunk and names what it did
    (``"ghost"``, ``"materialize"``, ``"fallback"`` or ``"unused"``).
    """

    reads_input = True  # the closed form reads the layer's input (checked to be batched)

    def process(self, lay: _Layer, chunk: _Chunk, strategy: str) -> str:
        raise NotImplementedError


#: Module type -> its rule (exact types: a subclass may change the forward).
RULES: dict[type[nn.Module], LayerRule] = {}


def register_rule(*types: type[nn.Module]):
    """Class decorator: one instance of the rule serves every module of ``types``."""

    def deco(cls: type[LayerRule]) -> type[LayerRule]:
        for t in types:
            RULES[t] = cls()
        return cls

    return deco


class _MatmulRule(LayerRule):
    """``out = W a + bias`` at T positions (Linear, Conv2d): bias materialized; the weight's
    norm by ghost norm or materialized ``grad_W(i)``, its clipped sum by :func:`_book` (or
    ``c @ G`` when G is kept)."""

    def dims(self, lay: _Layer, a: Tensor, g: Tensor) -> tuple[int, int, int]:
        """(T, d, out): positions, input size and output size of the layer's matrix product."""
        raise NotImplementedError

    def patches(self, lay: _Layer, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        """``(A, B)``: (b, T, d) inputs and (b, T, out) output gradients; out_t = W A_t (+ bias)."""
        raise NotImplementedError

    def per_example(
        self, lay: _Layer, a: Tensor, g: Tensor, out: Tensor | None = None, views: int = 1
    ) -> Tensor:
        """``grad_W(i) = B_i^T A_i`` as (b, *W.shape) (written into ``out`` if given); with
        ``views`` rows per example, ``sum_v B_iv^T A_iv`` (b = rows / views)."""
        raise NotImplementedError

    def summed(self, lay: _Layer, a: Tensor, g: Tensor) -> Tensor:
        """``sum_i grad_W(i) = sum_i B_i^T A_i``: the ordinary weight gradient (one GEMM)."""
        raise NotImplementedError

    def bias_grad(self, lay: _Layer, g: Tensor) -> Tensor:
        """``grad_bias(i) = sum_t B_i[t]``: the output gradient summed over positions, (b, out)."""
        raise NotImplementedError

    def ghost_ok(self, lay: _Layer) -> bool:
        """Whether the ghost norm applies (else the weight is always materialized)."""
        return not lay.shared

    def reach(self, lay: _Layer, a: Tensor, g: Tensor, views: int) -> Tensor:
        """:func:`_reach` of the layer's (A, B) per example (its views' positions summed)."""
        A, B = self.patches(lay, a, g)
        return _reach(A, B).view(-1, views).sum(1)

    def input_rounding(self, like: Tensor) -> float:
        """:func:`_input_rounding` of this layer's products."""
        return _input_rounding(like, conv=False)

    def process(self, lay: _Layer, chunk: _Chunk, strategy: str) -> str:
        io = [(_input(c), c.grads[0]) for c in lay.calls if c.grads[0] is not None]
        if not io:
            return "unused"
        if "bias" in lay.params:
            chunk.add(lay.names["bias"], chunk.fold(_total(self.bias_grad(lay, g) for _, g in io)))
        if "weight" not in lay.params:
            return "materialize"
        name = lay.names["weight"]
        T = sum(self.dims(lay, a, g)[0] for a, g in io) * chunk.views
        if _prefer_ghost(lay, chunk, io, strategy):
            # several calls, several views: T positions each, example i's all in its row i
            pairs = [[_by_example(t, chunk.b) for t in self.patches(lay, a, g)] for a, g in io]
            A, B = (torch.cat(t, 1) if len(io) > 1 else t[0] for t in zip(*pairs, strict=True))
            reach = _reach(A, B) if T > 1 else None
            gram = A.shape[-1] + B.shape[-1] + T * T
            chunk.sq += _bounded(_ghost_sq(A, B), reach, T, 0.0, A, gram)
            choice = "ghost"
        else:
            out, w = None, lay.params["weight"]  # one call whose rows will be kept: they go
            fits = chunk.b * w.numel() * io[0][1].element_size() <= chunk.keep_left
            if len(io) == 1 and fits and not lay.shared:  # to a reused buffer
                out = chunk.buffer(lay.name, tuple(w.shape), io[0][1], name)
            G = _total(self.per_example(lay, a, g, out, chunk.views) for a, g in io)
            if lay.shared or chunk.keep(G):
                chunk.add(name, G)
                return "materialize"
            reach = _total(self.reach(lay, a, g, chunk.views) for a, g in io) if T > 1 else None
            chunk.sq += _bounded(_sq_norms(G), reach, T, self.input_rounding(G), G)
            choice = "materialize"
        chunk.later.append((name, functools.partial(_book, lay, io, exact=T > 1)))
        return choice


@register_rule(nn.Linear)
class LinearRule(_MatmulRule):
    """A Linear on (b, d) or (b, ..., d) input: T = the positions of the leading dimensions."""

    def dims(self, lay, a, g):
        w = lay.params["weight"]
        return a.numel() // (a.shape[0] * w.shape[1]), w.shape[1], w.shape[0]

    def patches(self, lay, a, g):
        b = g.shape[0]
        return a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])

    def per_example(self, lay, a, g, out=None, views=1):
        b, shape = g.shape[0] // views, lay.params["weight"].shape
        A, B = (_by_example(t, b) for t in self.patches(lay, a, g))
        if out is None:
            return torch.bmm(B.mT, A).view(b, *shape)
        torch.bmm(B.mT, A, out=out.view(b, shape[0], -1))
        return out

    def summed(self, lay, a, g):
        A, B = self.patches(lay, a, g)
        return torch.tensordot(B, A, dims=([0, 1], [0, 1])).view(lay.params["weight"].shape)

    def bias_grad(self, lay, g):
        return g.reshape(g.shape[0], -1, g.shape[-1]).sum(1)


@register_rule(nn.Conv2d)
class Conv2dRule(_MatmulRule):
    """A Conv2d: T = its output positions, d = C_in*kh*kw (the input unfolded into patches)."""

    def dims(self, lay, a, g):
        w = lay.params["weight"]
        return g[0, 0].numel(), w[0].numel(), w.shape[0]

    def patches(self, lay, a, g):
        m = lay.module
        a, pad = _conv_in(m, a)
        unf = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=pad, stride=m.stride)
        return unf.mT, g.flatten(2).mT

    def per_example(self, lay, a, g, out=None, views=1):
        """The weight gradient of a convolution with the batch folded into the channels
        (``groups * k`` groups for k examples; an example's views are its batch)."""
        b, m, shape = g.shape[0] // views, lay.module, lay.params["weight"].shape
        a, pad = _conv_in(m, a)
        if not g.is_cuda and m.groups == 1 and shape[1] <= _FEW_CHANNELS:
            G = _per_example_few_channels(m, a, g, pad)
            return G if views == 1 else G.view(b, views, *shape).sum(1)
        G = g.new_empty(b, *shape) if out is None else out
        k = b if g.is_cuda else max(1, _CPU_BLOCK_BYTES // (shape.numel() * g.element_size()))
        for s in range(0, b, k):
            ak, gk = (_views_as_batch(t[s * views : (s + k) * views], views) for t in (a, g))
            n = ak.shape[1] // a.shape[1]
            G[s : s + n] = torch.nn.grad.conv2d_weight(
                ak, (n * shape[0], *shape[1:]), gk, m.stride, pad, m.dilation, m.groups * n,
            ).view(n, *shape)  # fmt: skip
        return G

    def summed(self, lay, a, g):
        m, shape = lay.module, lay.params["weight"].shape
        a, pad = _conv_in(m, a)
        return torch.nn.grad.conv2d_weight(a, shape, g, m.stride, pad, m.dilation, m.groups)

    def bias_grad(self, lay, g):
        return g.sum((2, 3))

    def ghost_ok(self, lay):
        return super().ghost_ok(lay) and lay.module.groups == 1

    def reach(self, lay, a, g, views):
        """Without unfolding: ``||A_i[t]||^2`` is a convolution of the input's squares
        summed over channels (all channels: an upper bound for a grouped convolution)."""
        m = lay.module
        a, pad = _conv_in(m, a)
        sq = a.double().square().sum(1, keepdim=True)
        ones = sq.new_ones(1, 1, *m.kernel_size)
        na = F.conv2d(sq, ones, stride=m.stride, padding=pad, dilation=m.dilation)
        nb = g.double().square().sum(1, keepdim=True)
        return (na.clamp_min(0).sqrt() * nb.sqrt()).flatten(1).sum(1).view(-1, views).sum(1)

    def input_rounding(self, like):
        return _input_rounding(like, conv=True)


@register_rule(nn.GroupNorm, nn.LayerNorm)
class NormRule(LayerRule):
    """Affine GroupNorm/LayerNorm: ``grad_w(i) = sum_pos xhat_i B_i``, ``grad_b(i) = sum_pos B_i``."""

    def process(self, lay: _Layer, chunk: _Chunk, strategy: str) -> str:
        m = lay.module
        for call in lay.calls:
            a, gout = _input(call), call.grads[0]
            if gout is None:
                continue
            if isinstance(m, nn.GroupNorm):  # (b, C, *spatial), parameters of shape (C,)
                xhat, dims = F.group_norm(a, m.num_groups, eps=m.eps), tuple(range(2, a.dim()))
            else:  # (b, *lead, *normalized_shape), parameters of shape normalized_shape
                xhat = F.layer_norm(a, m.normalized_shape, eps=m.eps)
                dims = tuple(range(1, a.dim() - len(m.normalized_shape)))

            def over(t: Tensor, dims=dims) -> Tensor:
                return t.sum(dims) if dims else t

            if "weight" in lay.params:
                chunk.add(lay.names["weight"], chunk.fold(over(xhat * gout)))
            if "bias" in lay.params:
                chunk.add(lay.names["bias"], chunk.fold(over(gout)))
        return "materialize"


def _batched(t, b: int) -> bool:
    """Whether ``t`` is a tensor whose leading dimension is the batch."""
    return isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] == b


def _unbatched(lay: _Layer):
    raise GhostError(
        f"layer {lay.name!r} ({type(lay.module).__name__}) was called on or returned a tensor "
        "without the batch dimension: its per-example gradients cannot be told apart"
    )


def _check_batched(lay: _Layer, b: int) -> None:
    """Every output of every call (and a supported layer's input) is batched, size b."""
    for call in lay.calls:
        ins = [_input(call)] if lay.rule.reads_input else []
        if not all(_batched(t, b) for t in (*ins, *call.outs)):
            _unbatched(lay)


def _fallback_call(lay: _Layer, call: _Call, b: int) -> dict[str, Tensor]:
    """Per-example gradients of the layer's own parameters for one call, by vmap of vjp.

    For example i: ``vjp(p -> module_p(inputs_i), p)(grad_out_i)``, every tensor input
    with leading dimension b being batched; other parameters are constants.
    """
    params = {r: p.detach() for r, p in lay.params.items()}
    flat_in, in_spec = tree_flatten((call.args, call.kwargs))
    in_dims = [0 if _batched(t, b) else None for t in flat_in]
    if 0 not in in_dims:
        _unbatched(lay)
    inputs = [t.detach() if isinstance(t, Tensor) else t for t in flat_in]
    cot = [
        g if g is not None else torch.zeros_like(o)
        for o, g in zip(call.outs, call.grads, strict=True)
    ]

    def one(p, cot_i, *flat_i):
        flat_i = [t.unsqueeze(0) if d == 0 else t for t, d in zip(flat_i, in_dims, strict=True)]
        args, kwargs = tree_unflatten(flat_i, in_spec)
        _, pull = vjp(lambda q: functional_call(lay.module, q, args, kwargs), p)
        return pull(tree_unflatten([c.unsqueeze(0) for c in cot_i], call.out_spec))[0]

    return vmap(one, in_dims=(None, 0, *in_dims))(params, cot, *inputs)


class FallbackRule(LayerRule):
    """Any other module: materialize its per-example gradients (summed over calls), by
    :func:`_fallback_call`."""

    reads_input = False

    def process(self, lay: _Layer, chunk: _Chunk, strategy: str) -> str:
        for call in lay.calls:
            if all(g is None for g in call.grads):
                continue
            for r, g in _fallback_call(lay, call, chunk.b * chunk.views).items():
                chunk.add(lay.names[r], chunk.fold(g))
        return "fallback"

    # ----------------------------------------------------------------- the clipper


FALLBACK = FallbackRule()


class GhostClipper:
    """Clipped per-example gradient sums of a model's loss, by book-keeping ghost clipping.

    ``clipped_sum(x, y, C)`` equals materializing the per-example gradients ``g_i`` of
    ``loss_fn(model(x_i[None]), y_i[None])`` (cross-entropy by default), zeroing rows with a non-finite
    entry and returning ``sum_i clip_factors(norms, C)_i g_i``, in micro-batches of
    ``microbatch`` examples. ``strategy`` forces the ghost norm or materialization for
    every Linear/Conv2d weight ("auto": the cheaper, per layer); ``choices`` records what
    each layer used in the last call. The model's hooks, gradients and mode are untouched.
    """

    def __init__(
        self,
        model: nn.Module,
        microbatch: int = 256,
        *,
        strategy: str = "auto",
        keep_bytes: int = 1 << 30,
        loss_fn: LossFn = cross_entropy,
    ):
        if microbatch < 1:
            raise ValueError(f"microbatch must be >= 1, got {microbatch}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.model, self.microbatch, self.strategy = model, int(microbatch), strategy
        self.loss_fn = loss_fn
        self.keep_bytes = int(keep_bytes)
        self.choices: dict[str, str] = {}
        self._buffers: dict[str, Tensor] = {}  # per-layer rows, reused by the next call

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float, views: int = 1) -> GhostResult:
        """``sum_i c_i g_i`` over the batch, ``c_i = clip_factors(||g_i||, clip)``.

        ``views`` > 1: ``x`` is (b, views, ...), example i's views ``x[i]``, its loss the mean
        of theirs and ``g_i`` the mean of their gradients (``train.augmult``)."""
        layout = ParamLayout.of(self.model)
        layers = _layers(self.model)
        dev = next((p.device for p in self.model.parameters()), x.device)
        dtype = next((p.dtype for p in self.model.parameters()), torch.float32)
        sums: dict[str, Tensor] = {}
        parts: list[_ChunkResult] = []
        for s in range(0, x.shape[0], self.microbatch):
            xb, yb = x[s : s + self.microbatch], y[s : s + self.microbatch]
            part = self._chunk(layers, xb, yb, clip, views)
            for n, g in part.sums.items():
                sums[n] = sums[n] + g if n in sums else g
            parts.append(part)
        flat = [
            sums[n].reshape(-1) if n in sums else torch.zeros(k, device=dev, dtype=dtype)
            for n, k in zip(layout.names, layout.numels, strict=True)
        ]
        grad_sum = torch.cat(flat) if flat else torch.zeros(0, device=dev, dtype=dtype)
        if not parts:  # an empty batch
            empty = x.new_zeros(0)
            return GhostResult(grad_sum, empty, empty, empty.bool(), empty.bool())
        per = ("norms", "loss", "correct", "nonfinite")
        return GhostResult(grad_sum, *(torch.cat([getattr(p, f) for p in parts]) for f in per))

    def per_example(
        self, x: Tensor, y: Tensor, views: int = 1
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(G, loss, correct)`` per micro-batch: the flat per-example gradients (b, p) in
        ``ParamLayout.of(model)`` order, from one forward and one backward (no vmap).

        Every layer is materialized (``per_example`` of the Linear/Conv2d rules, the
        closed forms of biases and norms, vmap of vjp for fallback modules); unused
        parameters get zero rows. Rows are not clipped or cleaned (GEP projects them).
        """
        layout = ParamLayout.of(self.model)
        layers = _layers(self.model)
        for s in range(0, x.shape[0], self.microbatch):
            xb, yb = x[s : s + self.microbatch], y[s : s + self.microbatch]
            yield self._rows(layers, layout, xb, yb, views)

    @torch.no_grad()
    def _rows(self, layers, layout: ParamLayout, x: Tensor, y: Tensor, views: int = 1):
        """One micro-batch of :meth:`per_example`."""
        loss, logits = self._forward(layers, x, y, views)
        b = x.shape[0]
        G = loss.new_empty(b, layout.dim)
        into = {name: G.narrow(1, off, n).view(b, *shape) for name, off, n, shape
                in zip(layout.names, layout.offsets, layout.numels, layout.shapes, strict=True)}  # fmt: skip
        chunk = _Chunk(b, loss.new_zeros(b), keep_left=1 << 62, rows_into=into, views=views)
        for lay in layers:
            _check_batched(lay, b * views)
            lay.rule.process(lay, chunk, "materialize")
            lay.calls = []
        for name, off, n in zip(layout.names, layout.offsets, layout.numels, strict=True):
            rows = chunk.mat.get(name)
            if rows is None:  # a parameter the forward did not use
                G.narrow(1, off, n).zero_()
            elif rows.data_ptr() != into[name].data_ptr():  # (else written there already)
                G.narrow(1, off, n).copy_(rows.reshape(b, n))
        return G, loss, correct(logits, y)

    @torch.enable_grad()
    def _forward(
        self, layers: list[_Layer], x: Tensor, y: Tensor, views: int = 1
    ) -> tuple[Tensor, Tensor]:
        """Recorded forward, then ``d(sum_i loss_i) / d(layer outputs)`` into each call
        (``views`` > 1: the b * views views in one forward; loss_i the mean of its views')."""
        with _Recorder(layers):
            logits = self.model(x if views == 1 else x.flatten(0, 1))
        if views == 1:
            loss = per_example(self.loss_fn, logits, y)
        else:
            per_view = per_example(self.loss_fn, logits, y.repeat_interleave(views, dim=0))
            loss, logits = (
                per_view.view(-1, views).mean(1),
                logits.view(-1, views, *logits.shape[1:]).mean(1),
            )
        _check_versions(layers)
        calls = [c for lay in layers for c in lay.calls]
        outs = [(c, i) for c in calls for i, o in enumerate(c.outs) if _differentiable(o)]
        grads = (
            torch.autograd.grad(loss.sum(), [c.outs[i] for c, i in outs], allow_unused=True)
            if outs
            else []
        )
        for c in calls:
            c.grads = [None] * len(c.outs)
        for (c, i), g in zip(outs, grads, strict=True):
            c.grads[i] = g
        return loss.detach(), logits.detach()

    @torch.no_grad()
    def _chunk(self, layers, x, y, clip, views: int = 1) -> _ChunkResult:
        """One micro-batch: its per-example by-products and clipped sums by parameter name."""
        loss, logits = self._forward(layers, x, y, views)
        b = x.shape[0]
        chunk = _Chunk(b, loss.new_zeros(b), self.keep_bytes, buffers=self._buffers, views=views)
        for lay in layers:
            _check_batched(lay, b * views)
            self.choices[lay.name] = lay.rule.process(lay, chunk, self.strategy)
            lay.calls = []
        sq = chunk.sq + sum(_sq_norms(g) for g in chunk.mat.values())
        bad = ~torch.isfinite(loss) | ~torch.isfinite(sq)
        norms = torch.where(bad, 0.0, sq.sqrt())
        c = torch.where(bad, 0.0, clip_factors(norms, clip))
        sums = _bookkeep(chunk, c, bad if bool(bad.any()) else None)
        return _ChunkResult(norms, loss, correct(logits, y), bad, sums)


def _sq_norms(g: Tensor) -> Tensor:
    """Squared norms of the rows of ``g`` (b, ...), in one pass (no squared temporary)."""
    return torch.linalg.vector_norm(g.flatten(1), dim=1).square()


def _total(ts: Iterable[Tensor]) -> Tensor:
    """The sum of a non-empty sequence of tensors (without Python's ``0 +`` copy)."""
    return functools.reduce(operator.add, ts)


def _zero(t: Tensor, bad: Tensor | None) -> Tensor:
    """Rows of dropped examples set to 0 (so that ``0 * NaN`` cannot reach the sum)."""
    if bad is None:
        return t
    return torch.where(bad.view(-1, *([1] * (t.dim() - 1))), 0.0, t)


def _bookkeep(chunk: _Chunk, c: Tensor, bad: Tensor | None) -> dict[str, Tensor]:
    """Clipped sums: ``c @ G`` for kept per-example gradients, the deferred sums otherwise."""
    sums = {n: torch.tensordot(c, _zero(g, bad), dims=1) for n, g in chunk.mat.items()}
    c_rows, bad_rows = chunk.unfold(c), chunk.unfold(bad)  # the deferred sums read per-view rows
    for name, book in chunk.later:
        g = book(c_rows, bad_rows)
        sums[name] = sums[name] + g if name in sums else g
    return sums
