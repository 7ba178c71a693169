"""Low-rank reparametrization: per-example gradients of gradient carriers, never of weights.

RGP (Yu et al., ICML 2021, Section 2) rewrites every trainable weight matrix
``W`` (p x d; a convolution's kernel read as out x in*kh*kw) as

    W  ->  L R + stop_grad(W - L R)                                        (eq. 1)

with carriers ``L`` (p x r) and ``R`` (r x d). The forward and backward signals are
unchanged, and the carriers' gradients are ``dL = (dW) R^T`` and ``dR = L^T (dW)``
(Theorem 2.1). A convolution becomes a conv with kernel ``R`` (in -> r, the original
kernel size, stride, padding and dilation), a 1x1 conv with kernel ``L`` (r -> out) and
the frozen residual conv (Section 2.1, eq. 4); a linear layer becomes the pair
``x -> (x R^T) L^T`` plus the frozen residual.

:class:`LowRankReparam` does this surgery once on a copy of the model and then, for
any carriers, gives a :class:`~dpsub.grads.engine.GradTarget` whose parameters are the
carriers of every weight and the model's other trainable (non-matrix) parameters and
whose forward is the reparametrized network with the *current* weights as the frozen
part. ``GradEngine.per_example(x, y, target)`` then yields per-example gradients of
size ``sum r (p + d)`` per example instead of ``sum p d``: memory O(B r d).
:meth:`LowRankReparam.reconstruct` maps a released carrier gradient back to a flat
gradient of the model's own parameters (Corollary 2.1.1).

With ``grads.backend=ghost``, :meth:`LowRankReparam.ghost_target` gives the same target
with the reparametrized network as plain modules (:class:`_CarrierLayer`: the residual,
``R`` and ``L`` as three Conv2d / Linear layers), which :mod:`dpsub.grads.ghost` clips from
one forward and one backward: no ``vmap``, and its per-example gradients are those of the
carriers only (O(B r (p + d)) for conv kernels, materialized in cache-sized blocks).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from dpsub.grads.engine import GradTarget
from dpsub.grads.layout import ParamLayout
from dpsub.subspace.lowrank import carrier_projection

__all__ = ["Carriers", "LowRankConv2d", "LowRankLinear", "LowRankReparam"]

#: Per weight name: (L (p x r) with orthonormal columns, R (r x d) with orthonormal rows).
Carriers = dict[str, tuple[Tensor, Tensor]]


def _placeholder() -> Tensor:
    return torch.empty(0)


class LowRankConv2d(nn.Module):
    """``conv(x, W - L R) + conv1x1(conv(x, R), L)`` (eq. 4); tensors supplied at call time.

    ``left`` (out, r, 1, 1), ``right`` (r, in, kh, kw) and ``residual`` are buffers
    that :func:`torch.func.functional_call` replaces; ``bias`` stays a parameter.
    """

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        if conv.groups != 1 or conv.padding_mode != "zeros":
            raise ValueError(
                "RGP reparametrizes convolutions with groups=1 and zero padding, got "
                f"groups={conv.groups}, padding_mode={conv.padding_mode!r}"
            )
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        for name in ("left", "right", "residual"):
            self.register_buffer(name, _placeholder(), persistent=False)
        self.bias = conv.bias

    def forward(self, x: Tensor) -> Tensor:
        geometry = {"stride": self.stride, "padding": self.padding, "dilation": self.dilation}
        low = F.conv2d(F.conv2d(x, self.right, None, **geometry), self.left)
        return F.conv2d(x, self.residual, self.bias, **geometry) + low


class LowRankLinear(nn.Module):
    """``x (W - L R)^T + (x R^T) L^T + b`` (eq. 1); tensors supplied at call time."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        for name in ("left", "right", "residual"):
            self.register_buffer(name, _placeholder(), persistent=False)
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.residual, self.bias) + F.linear(F.linear(x, self.right), self.left)


class _CarrierLayer(nn.Module):
    """The ghost-clipping form of either layer: ``residual(x) + left(right(x))`` with three
    plain ``nn.Conv2d`` (or ``nn.Linear``) children whose weights :meth:`LowRankReparam.target`
    assigns (the residual's frozen, the model's bias on it), so per-example gradients of
    the carriers come from :mod:`dpsub.grads.ghost`'s closed forms, not from ``vmap``."""

    def __init__(self, layer: nn.Conv2d | nn.Linear):
        super().__init__()
        if isinstance(layer, nn.Conv2d):
            g = {"stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation}
            k = layer.kernel_size
            self.left = nn.Conv2d(1, 1, 1, bias=False)
            self.right = nn.Conv2d(1, 1, k, bias=False, **g)
            self.residual = nn.Conv2d(1, 1, k, bias=layer.bias is not None, **g)
        else:
            self.left, self.right = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
            self.residual = nn.Linear(1, 1, bias=layer.bias is not None)
        for p in self.parameters():  # placeholders until assigned
            p.requires_grad_(False)
        if layer.bias is not None:  # a frozen bias keeps its value; a trainable one is assigned
            self.residual.bias = nn.Parameter(layer.bias.detach().clone(), layer.bias.requires_grad)

    def forward(self, x: Tensor) -> Tensor:
        return self.residual(x) + self.left(self.right(x))


def _assign(root: nn.Module, name: str, t: Tensor, trainable: bool) -> None:
    prefix, _, attr = name.rpartition(".")
    module = root.get_submodule(prefix) if prefix else root
    setattr(module, attr, nn.Parameter(t.detach(), requires_grad=trainable))


def _join(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix else attr


class LowRankReparam:
    """The model with every trainable Conv2d/Linear weight reparametrized (eq. 1).

    Args:
        model: the network; its weights are read at every :meth:`target` call.
        train_right: differentiate ``R`` too (paper); ``False`` freezes it (the authors'
            code: only ``(dL) R`` is used).
        full: weights left as they are (no carriers): their full per-example gradient is
            a parameter of the target (the authors' classification layer).
        scale: per weight of ``full``, a factor its per-example gradient is multiplied by
            inside the target (the authors divide the classification layer's by 100 so
            that it does not dominate the joint clip); the forward values are unchanged.

    Raises ValueError for a trainable tensor of two or more dimensions that is not the
    weight of an ``nn.Conv2d`` (groups=1) or ``nn.Linear``: it would need a full
    per-example gradient.
    """

    def __init__(
        self,
        model: nn.Module,
        train_right: bool = True,
        full: tuple[str, ...] = (),
        scale: dict[str, float] | None = None,
    ):
        self.model = model
        self.train_right = train_right
        self.layout = ParamLayout.of(model)
        self.weights = [n for n in self.layout.matrix_names() if n not in full]
        self.scale = {n: float(s) for n, s in (scale or {}).items() if s != 1.0}
        if set(self.scale) - set(full):
            raise ValueError(
                f"only a full-rank weight is scaled, not {sorted(set(self.scale) - set(full))}"
            )
        modules = dict(model.named_modules())
        self._module_of: dict[str, str] = {}
        for name in self.weights:
            prefix, _, attr = name.rpartition(".")
            module = modules[prefix]
            if attr != "weight" or not isinstance(module, (nn.Conv2d, nn.Linear)):
                raise ValueError(
                    f"RGP reparametrizes the weights of Conv2d and Linear layers only; {name} "
                    f"belongs to a {type(module).__name__}"
                )
            self._module_of[name] = prefix
        self.copy = self._rebuilt(
            lambda m: (LowRankConv2d if isinstance(m, nn.Conv2d) else LowRankLinear)(m)
        )
        self._frozen: dict[str, Tensor] = {}
        self._forward = self._make_forward()
        self._ghost: nn.Module | None = None  # built on the first ghost_target call

    def _rebuilt(self, wrap) -> nn.Module:
        """A copy of the model with every reparametrized layer replaced by ``wrap(layer)``."""
        out = copy.deepcopy(self.model)
        for prefix in self._module_of.values():
            layer = wrap(out.get_submodule(prefix) if prefix else out)
            if prefix:
                out.set_submodule(prefix, layer)
            else:
                out = layer
        return out

    def _make_forward(self):
        copy_ = self.copy

        def forward(params: dict[str, Tensor], x: Tensor) -> Tensor:
            for name, s in self.scale.items():  # same value, gradient times s
                p = params[name]
                params = {**params, name: p.detach() + s * (p - p.detach())}
            return functional_call(copy_, {**params, **self._frozen}, (x,))

        return forward

    # ------------------------------------------------------------ weights
    def matrices(self) -> dict[str, Tensor]:
        """Current weight matrices (p x in*kh*kw), detached views of the model's tensors."""
        params = dict(self.model.named_parameters())
        return {n: params[n].detach().reshape(params[n].shape[0], -1) for n in self.weights}

    def carrier_names(self, weight: str) -> tuple[str, str]:
        prefix = self._module_of[weight]
        return _join(prefix, "left"), _join(prefix, "right")

    # ------------------------------------------------------------- target
    def target(self, carriers: Carriers) -> GradTarget:
        """Differentiate the carriers (and non-matrix parameters) at the current weights."""
        params: dict[str, Tensor] = {}
        frozen = dict(self.model.named_buffers())
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            if name not in carriers:
                params[name] = p.detach()
                continue
            L, R = carriers[name]
            W = p.detach().reshape(p.shape[0], -1)
            left, right = self.carrier_names(name)
            frozen[_join(self._module_of[name], "residual")] = (W - L @ R).view_as(p)
            conv = p.dim() == 4
            params[left] = L.view(*L.shape, 1, 1) if conv else L
            (params if self.train_right else frozen)[right] = R.view(R.shape[0], *p.shape[1:])
        missing = set(self.weights) - set(carriers)
        if missing:
            raise ValueError(f"no carriers for {sorted(missing)}")
        self._frozen = frozen
        return GradTarget(params, self._forward)

    def ghost_target(self, carriers: Carriers) -> GradTarget:
        """:meth:`target` with a ``module`` for ghost clipping: the same function and
        parameters, every reparametrized layer a :class:`_CarrierLayer` of plain layers."""
        if self.scale:
            raise ValueError("a scaled full-rank weight needs grads.backend=vmap (not ghost)")
        target = self.target(carriers)
        if self._ghost is None:
            self._ghost = self._rebuilt(_CarrierLayer)
        layers, names = set(self._module_of.values()), {}
        for name, t in {**self._frozen, **target.params}.items():
            prefix, _, attr = name.rpartition(".")
            trainable = name in target.params
            if prefix in layers and attr in ("left", "right", "residual", "bias"):
                child = "residual" if attr == "bias" else attr
                name_in = _join(_join(prefix, child), "bias" if attr == "bias" else "weight")
                _assign(self._ghost, name_in, t, trainable)
            elif trainable:
                name_in = name
                _assign(self._ghost, name, t, True)
            else:  # a buffer of the model
                module = self._ghost.get_submodule(prefix) if prefix else self._ghost
                module._buffers[attr] = t
            if trainable:
                names[name_in] = name
        return GradTarget(target.params, target.forward, self._ghost, names)

    def reconstruct(self, flat: Tensor, target: GradTarget, carriers: Carriers) -> Tensor:
        """A flat gradient of the model's parameters from a flat carrier gradient of ``target``.

        Weights: Corollary 2.1.1, ``(dL) R + L (dR) - L L^T (dL) R`` (or ``(dL) R`` with a
        frozen ``R``); other parameters: their own entries, unchanged.
        """
        parts = target.layout.unflatten(flat)
        out = []
        for name in self.layout.names:
            if name in carriers:
                L, R = carriers[name]
                left, right = self.carrier_names(name)
                dL = parts[left].reshape(L.shape)
                dR = parts[right].reshape(R.shape) if self.train_right else None
                out.append(carrier_projection(dL, dR, L, R).reshape(-1))
            else:
                out.append(parts[name].reshape(-1))
        return torch.cat(out)
