"""Vectorized per-example gradients.

:class:`GradEngine` turns a model and a (logical) batch into a stream of
micro-batches of *flat* per-example gradients ``G`` of shape ``(b, p)``, laid out
by :class:`ParamLayout` (the trainable parameters in ``named_parameters`` order,
each flattened). DP-SGD clips the rows of ``G``; GEP projects them onto a basis;
both see the same tensor. The micro-batch size bounds memory: a logical batch of
1000 is processed as ``ceil(1000 / microbatch)`` vectorized chunks.

Two backends compute the same thing:

* ``vmap``: ``torch.func.vmap(grad(loss of one example))`` over the micro-batch.
* ``opacus``: Opacus' ``GradSampleModule`` hooks (per-layer closed forms).

``scripts/bench.py --backends`` measures both; ``vmap`` is the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

BACKENDS = ("vmap", "opacus")


@dataclass(frozen=True)
class ParamLayout:
    """Where each trainable parameter lives in the flat gradient vector."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]  # start of each parameter; offsets[-1] + numel[-1] == dim

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        names, shapes, offsets, off = [], [], [], 0
        for name, p in model.named_parameters():
            if p.requires_grad:
                names.append(name)
                shapes.append(p.shape)
                offsets.append(off)
                off += p.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets))

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(s).numel()) for s in self.shapes)

    @property
    def dim(self) -> int:
        return self.offsets[-1] + self.numels[-1] if self.names else 0

    def slices(self) -> dict[str, slice]:
        return {
            n: slice(o, o + k)
            for n, o, k in zip(self.names, self.offsets, self.numels, strict=True)
        }


@dataclass
class Chunk:
    """Per-example gradients of one micro-batch, with the forward pass' by-products."""

    grads: torch.Tensor  # (b, p)
    loss: torch.Tensor  # (b,) per-example loss
    correct: torch.Tensor  # (b,) bool, prediction == label


class GradEngine:
    """Per-example and mean gradients of a classifier's cross-entropy loss."""

    def __init__(self, model: nn.Module, microbatch: int = 256, backend: str = "vmap"):
        if backend not in BACKENDS:
            raise ValueError(f"grads.backend must be one of {BACKENDS}, got {backend!r}")
        if microbatch < 1:
            raise ValueError(f"grads.microbatch must be >= 1, got {microbatch}")
        self.model = model
        self.microbatch = int(microbatch)
        self.backend = backend
        self.layout = ParamLayout.of(model)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._gsm = None
        if backend == "vmap":
            self._per_example_fn = vmap(
                grad(self._single_loss, has_aux=True), in_dims=(None, None, 0, 0)
            )

    # ------------------------------------------------------------- helpers
    @property
    def dim(self) -> int:
        return self.layout.dim

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self._params])

    def set_grad(self, flat: torch.Tensor) -> None:
        """Write a flat gradient into ``p.grad`` of every trainable parameter."""
        for p, off, n in zip(self._params, self.layout.offsets, self.layout.numels, strict=True):
            p.grad = flat[off : off + n].view_as(p).clone()

    def _single_loss(self, params, buffers, x, y):
        logits = functional_call(self.model, (params, buffers), (x.unsqueeze(0),))
        loss = F.cross_entropy(logits, y.unsqueeze(0))
        return loss, (loss.detach(), logits.detach().argmax(-1).squeeze(0) == y)

    # --------------------------------------------------------- per-example
    def per_example(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[Chunk]:
        """Yield flat per-example gradients micro-batch by micro-batch."""
        for start in range(0, x.shape[0], self.microbatch):
            xb, yb = x[start : start + self.microbatch], y[start : start + self.microbatch]
            if self.backend == "vmap":
                yield self._vmap_chunk(xb, yb)
            else:
                yield self._opacus_chunk(xb, yb)

    def _vmap_chunk(self, x, y) -> Chunk:
        params = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        buffers = dict(self.model.named_buffers())
        grads, (loss, correct) = self._per_example_fn(params, buffers, x, y)
        flat = torch.cat([grads[n].reshape(x.shape[0], -1) for n in self.layout.names], dim=1)
        return Chunk(flat, loss, correct)

    def _opacus_chunk(self, x, y) -> Chunk:
        from opacus import GradSampleModule

        if self._gsm is None:
            self._gsm = GradSampleModule(self.model, batch_first=True, loss_reduction="sum")
        for p in self._params:
            p.grad_sample = None
            p.grad = None
        logits = self._gsm(x)
        losses = F.cross_entropy(logits, y, reduction="none")
        losses.sum().backward()
        flat = torch.cat([p.grad_sample.reshape(x.shape[0], -1) for p in self._params], dim=1)
        for p in self._params:
            p.grad_sample = None
            p.grad = None
        return Chunk(flat, losses.detach(), logits.detach().argmax(-1) == y)

    # ---------------------------------------------------------------- mean
    def mean_gradient(self, x: torch.Tensor, y: torch.Tensor) -> Chunk:
        """Ordinary (non-private) mean gradient, one backward pass per micro-batch.

        Returns a :class:`Chunk` whose ``grads`` is the mean gradient, shape ``(1, p)``.
        """
        total = torch.zeros(self.dim, device=x.device)
        losses, corrects = [], []
        for start in range(0, x.shape[0], self.microbatch):
            xb, yb = x[start : start + self.microbatch], y[start : start + self.microbatch]
            logits = self.model(xb)
            per = F.cross_entropy(logits, yb, reduction="none")
            gs = torch.autograd.grad(per.sum(), self._params)
            total += torch.cat([g.reshape(-1) for g in gs])
            losses.append(per.detach())
            corrects.append(logits.detach().argmax(-1) == yb)
        n = max(int(x.shape[0]), 1)
        return Chunk((total / n)[None], torch.cat(losses), torch.cat(corrects))


def check_private_model(model: nn.Module) -> None:
    """Refuse models through which private data reaches the output unclipped.

    BatchNorm mixes examples in a batch and its running statistics are updated from
    private data outside any clipping, so neither per-example clipping nor the
    accountant covers them. Use GroupNorm (every dpsub model does).
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) or getattr(
            module, "track_running_stats", False
        ):
            raise ValueError(
                f"model: module {name!r} ({type(module).__name__}) keeps statistics of private "
                "batches outside clipping; private training needs GroupNorm/LayerNorm instead"
            )


def clip_rows(g: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale every row of ``g`` to L2 norm at most ``bound``.

    Returns the clipped rows and the boolean mask of rows that were scaled down.
    Uses ``min(1, C / ||g_i||)``: rows with norm <= C are unchanged, larger rows get
    norm exactly C (and an all-zero row stays zero).
    """
    norms = g.norm(dim=1)
    factor = (bound / (norms + 1e-12)).clamp(max=1.0)
    return g * factor[:, None], norms > bound


def clipped_sum(g: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of the clipped rows of ``g`` (without materializing them) and the clip mask."""
    norms = g.norm(dim=1)
    factor = (bound / (norms + 1e-12)).clamp(max=1.0)
    return factor @ g, norms > bound
