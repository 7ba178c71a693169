"""Vectorized per-example gradients of a gradient target.

A :class:`GradTarget` says *what* is differentiated: named leaf tensors ``params``
and a ``forward(params, x) -> logits`` that uses them. The default target is the
model's trainable parameters through the model itself; a mechanism may pass its own
(RGP differentiates low-rank carriers of a reparametrized model and never
materializes per-example weight gradients).

:class:`GradEngine` turns a target and a (logical) batch into a stream of
micro-batches of *flat* per-example gradients ``G`` of shape ``(b, p)``, laid out by
the target's :class:`~dpsub.grads.layout.ParamLayout`. Two verbs:

* :meth:`GradEngine.per_example`: materialized rows (GEP projects them);
* :meth:`GradEngine.clipped_sum`: the sum of the rows clipped to C, a
  :class:`~dpsub.privacy.noise.Sensitive` of sensitivity C (DP-SGD; backends may
  compute it without materializing the rows).

Backends: ``vmap`` (``torch.func.vmap(grad(...))``, any target), ``opacus``
(Opacus' ``GradSampleModule`` hooks, the model's own parameters only) and ``ghost``
(:class:`~dpsub.grads.ghost.GhostClipper`: book-keeping ghost clipping computes
:meth:`GradEngine.clipped_sum` from one forward and one backward without materializing
per-example gradients; its :meth:`GradEngine.per_example` rows are materialized layer by
layer from the same one forward and one backward, for the model's own parameters, and
with ``vmap`` for any other target).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpsub.choices import BACKENDS
from dpsub.errors import ConfigError
from dpsub.grads.clip import ClippedAccumulator, ClipStats
from dpsub.grads.layout import ParamLayout
from dpsub.grads.loss import LossFn, correct, cross_entropy, per_example
from dpsub.privacy.noise import Sensitive

Forward = Callable[[dict[str, Tensor], Tensor], Tensor]


class _Views(Protocol):
    """What the engine needs of ``train.augmult`` (``dpsub.data.augment.Augmult``)."""

    k: int

    def views(self, x: Tensor) -> Tensor: ...


@dataclass
class GradTarget:
    """Named leaves ``params`` and ``forward(params, x) -> logits`` (x a batch).

    ``module``, if given, is the same function as an ``nn.Module`` whose trainable
    parameters are ``params`` under the names ``module_names`` maps to theirs (made of
    plain Conv2d / Linear / norm layers): ``grads.backend=ghost`` clips it by ghost
    clipping instead of ``vmap`` (RGP's carriers, :mod:`dpsub.subspace.reparam`).
    """

    params: dict[str, Tensor]
    forward: Forward
    module: nn.Module | None = None
    module_names: dict[str, str] | None = None  # module parameter name -> params name
    layout: ParamLayout = field(init=False)

    def __post_init__(self) -> None:
        self.layout = ParamLayout.of_tensors(self.params)

    @classmethod
    def of_model(cls, model: nn.Module) -> GradTarget:
        """The model's trainable parameters through the model (buffers read at call time)."""
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}

        def forward(p: dict[str, Tensor], x: Tensor) -> Tensor:
            return functional_call(model, (p, dict(model.named_buffers())), (x,))

        return cls(params, forward)


@dataclass
class Chunk:
    """Per-example gradients of one micro-batch, with the forward pass' by-products."""

    grads: Tensor  # (b, p)
    loss: Tensor  # (b,) per-example loss
    correct: Tensor  # (b,) bool, prediction == label


@dataclass
class BatchStats:
    """Private by-products of a batch (diagnostics only: never released by default)."""

    loss_sum: float | Tensor = 0.0  # 0-d tensors on the device: read only when logged
    correct: int | Tensor = 0
    clip: ClipStats = field(default_factory=ClipStats)

    def add(self, loss: Tensor, correct: Tensor) -> None:
        self.loss_sum = self.loss_sum + loss.detach().float().sum()  # no host sync
        self.correct = self.correct + correct.sum()


@dataclass
class ClippedSum:
    """A clipped sum with the private statistics of the batch it came from."""

    sum: Sensitive
    stats: BatchStats


def available_bytes(device: torch.device) -> int:
    """Free memory of ``device``: the CUDA allocator's free bytes, or MemAvailable on Linux."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def auto_microbatch(
    num_params: int, batch_size: int, device: torch.device, free: int | None = None
) -> int:
    """The largest micro-batch (<= the expected batch, a power of two unless it is the batch)
    whose per-example gradients fit a quarter of the free memory, counting 3x their size
    for the temporaries of their computation and clipping (``grads.microbatch: auto``).
    On a CPU at most :data:`CPU_MICROBATCH`: there the caches, not the memory, set the pace
    (ResNet20, batch 1,000, ghost clipping, 2 threads: a median 3.1-3.3 s a clipped sum at
    125-250, 4.5 s at 500: docs/speed.md)."""
    free = available_bytes(device) if free is None else free
    fits = max(1, (free // 4) // (3 * 4 * max(num_params, 1)))
    if torch.device(device).type == "cpu":
        fits = min(fits, CPU_MICROBATCH)
    if fits >= batch_size:
        return int(batch_size)
    return 1 << (int(fits).bit_length() - 1)


#: ``grads.microbatch: auto``'s ceiling on a CPU (measured 2026-11-29, auto_microbatch)
CPU_MICROBATCH = 256


def example_losses(losses: Tensor, k: int) -> Tensor:
    """Per-example losses from :meth:`GradEngine.view_losses`' rows (k views: their sum)."""
    return losses if k == 1 else losses.view(-1, k).sum(1)


# ------------------------------------------------------------- backends
class VmapBackend:
    """``grads.backend=vmap``: ``torch.func.vmap(grad(...))`` over any target.

    A backend is a strategy object the engine holds (one per engine): :meth:`chunk` gives
    one micro-batch of flat per-example gradients, :meth:`clipped_sum` the clipped sum
    of a batch. Its flags say what mechanisms may ask of it.
    """

    name = "vmap"
    any_target = True  # differentiates any GradTarget (else: the model's own parameters only)
    module_targets = False  # clips a target through its module form (GradTarget.module)

    def __init__(self, engine: GradEngine):
        self.engine = engine

    def chunk(self, x: Tensor, y: Tensor, target: GradTarget) -> Chunk:
        params = {n: p.detach() for n, p in target.params.items()}
        fn = self.engine._per_example_fn(target, self.engine.views_of(x))
        with self.engine.autocast(x.device):
            grads, (loss, correct) = fn(params, x, y)
        return Chunk(target.layout.flatten(grads, batch=True), loss.float(), correct)

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float, target: GradTarget) -> ClippedSum:
        """Clip the per-parameter rows, never concatenated into (b, p)."""
        stats, acc = BatchStats(), ClippedAccumulator()
        params = {n: p.detach() for n, p in target.params.items()}
        fn = self.engine._per_example_fn(target, self.engine.views_of(x))
        for xb, yb in self.engine._microbatches(x, y):
            with self.engine.autocast(x.device):
                grads, (loss, correct) = fn(params, xb, yb)
            acc.add("grad", [grads[n] for n in target.layout.names], clip)  # float32
            stats.add(loss, correct)
        return _finished(acc, stats, clip, target, x.device)


_INPUT_HOOK_WARNING = (
    "Full backward hook is firing when gradients are computed with respect to module outputs"
)


class OpacusBackend(VmapBackend):
    """``grads.backend=opacus``: Opacus' ``GradSampleModule`` hooks (the model's parameters)."""

    name = "opacus"
    any_target = False

    def __init__(self, engine: GradEngine):
        super().__init__(engine)
        self._gsm = None

    def chunk(self, x: Tensor, y: Tensor, target: GradTarget) -> Chunk:
        from opacus import GradSampleModule

        engine = self.engine
        if target is not engine.target:
            raise ValueError(
                "grads.backend=opacus differentiates the model's own parameters only; "
                "this mechanism needs grads.backend=vmap"
            )
        if not engine.model.training:  # Opacus' hooks record activations in training mode
            if self._gsm is not None:  # only: an eval-mode gradient (PDP-SGD's public set)
                self._gsm.remove_hooks()  # is torch.func's, without the hooks in the way
                self._gsm = None
            return super().chunk(x, y, target)
        if self._gsm is None:
            self._gsm = GradSampleModule(engine.model, batch_first=True, loss_reduction="sum")
        for p in engine._params:
            p.grad_sample = None
            p.grad = None
        k, b = engine.views_of(x), x.shape[0]
        logits, losses = engine.view_losses(self._gsm, x, y, k)
        with warnings.catch_warnings():  # the input needs no gradient, so the first layer's
            # hook sees no grad_input; Opacus reads only grad_output (harmless, said each run)
            warnings.filterwarnings("ignore", _INPUT_HOOK_WARNING, UserWarning)
            losses.sum().backward()  # per view: its example's loss is the mean over its views
        flat = torch.cat([p.grad_sample.reshape(b, k, -1).sum(1) for p in engine._params], dim=1)
        for p in engine._params:
            p.grad_sample = None
            p.grad = None
        return Chunk(flat, example_losses(losses.detach(), k), correct(logits.detach(), y))

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float, target: GradTarget) -> ClippedSum:
        stats, acc = BatchStats(), ClippedAccumulator()
        for chunk in self.engine.per_example(x, y, target):
            acc.add("grad", chunk.grads, clip)
            stats.add(chunk.loss, chunk.correct)
        return _finished(acc, stats, clip, target, x.device)


class GhostBackend(VmapBackend):
    """``grads.backend=ghost``: :class:`~dpsub.grads.ghost.GhostClipper` (book-keeping ghost
    clipping) for the model and for targets with a module form; ``vmap`` for other targets."""

    name = "ghost"
    module_targets = True

    def __init__(self, engine: GradEngine):
        super().__init__(engine)
        self._clipper = None

    def clipper(self):
        from dpsub.grads.ghost import GhostClipper

        if self._clipper is None:
            e = self.engine
            self._clipper = GhostClipper(e.model, microbatch=e.microbatch, loss_fn=e.loss_fn)
        return self._clipper

    def chunk(self, x: Tensor, y: Tensor, target: GradTarget) -> Chunk:
        if target is not self.engine.target:
            return super().chunk(x, y, target)
        return Chunk(*next(self.clipper().per_example(x, y, self.engine.views_of(x))))

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float, target: GradTarget) -> ClippedSum:
        k = self.engine.views_of(x)
        if target is self.engine.target:
            r = self.clipper().clipped_sum(x, y, clip, views=k)
        elif target.module is not None:  # its flat sum put back in the target's order
            from dpsub.grads.ghost import GhostClipper

            e = self.engine
            clipper = GhostClipper(target.module, microbatch=e.microbatch, loss_fn=e.loss_fn)
            r = clipper.clipped_sum(x, y, clip, views=k)
            parts = ParamLayout.of(target.module).unflatten(r.grad_sum)
            named = {target.module_names[n]: t for n, t in parts.items()}
            r.grad_sum = target.layout.flatten(named)
        else:
            return super().clipped_sum(x, y, clip, target)
        stats = BatchStats()
        stats.add(r.loss, r.correct)
        stats.clip = ClipStats(int(x.shape[0]), (r.norms > clip).sum(), r.nonfinite.sum())
        return ClippedSum(Sensitive(r.grad_sum, float(clip)), stats)


def _finished(acc: ClippedAccumulator, stats: BatchStats, clip, target, device) -> ClippedSum:
    stats.clip = acc.stats.get("grad", ClipStats())
    return ClippedSum(acc.sum("grad", clip, target.layout.dim, device), stats)


#: ``grads.backend`` -> its strategy class.
BACKEND_CLASSES: dict[str, type[VmapBackend]] = {
    b.name: b for b in (VmapBackend, OpacusBackend, GhostBackend)
}
assert tuple(BACKEND_CLASSES) == BACKENDS, "dpsub.choices.BACKENDS names every strategy"


class GradEngine:
    """Per-example, clipped-sum and mean gradients of a per-example loss.

    ``loss_fn(outputs, targets) -> (B,)``: cross-entropy of logits by default
    (:mod:`dpsub.grads.loss`). ``dist``: a :class:`~dpsub.training.distributed.Dist` in multi-process training (its
    rank splits public gradients and reduces mean gradients), else None.
    """

    def __init__(
        self,
        model: nn.Module,
        microbatch: int = 256,
        backend: str = "vmap",
        compile: bool = False,
        dist=None,
        loss_fn: LossFn = cross_entropy,
    ):
        if backend not in BACKEND_CLASSES:
            raise ValueError(f"grads.backend must be one of {BACKENDS}, got {backend!r}")
        if microbatch < 1:
            raise ValueError(f"grads.microbatch must be >= 1, got {microbatch}")
        self.model = model
        self.loss_fn = loss_fn
        self.microbatch = int(microbatch)
        self.backend = backend
        self.strategy = BACKEND_CLASSES[backend](self)
        self.compile = bool(compile)
        self.target = GradTarget.of_model(model)
        self.layout = self.target.layout
        self._params = list(self.target.params.values())
        self.dist = dist if dist is not None and dist.active else None
        self._vmapped: dict[tuple[int, int], Callable] = {}
        self.amp: torch.dtype | None = None  # train.amp: autocast dtype of forward/backward
        #: train.augmult: the private batch arrives as (b, K, *example) views (None: K = 1)
        self.augmult: _Views | None = None

    def autocast(self, device: torch.device):
        """Autocast for computing gradients only (``train.amp``); clipping runs outside it."""
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.amp)

    # ------------------------------------------------------------- helpers
    @property
    def dim(self) -> int:
        return self.layout.dim

    @property
    def distributed(self) -> bool:
        """Several ranks share the work (public gradients are split across them)."""
        return self.dist is not None and self.dist.active

    def flat_params(self) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self._params])

    def set_grad(self, flat: Tensor) -> None:
        """Write a flat gradient into ``p.grad`` of every trainable parameter."""
        for p, off, n in zip(self._params, self.layout.offsets, self.layout.numels, strict=True):
            p.grad = flat[off : off + n].view_as(p).clone()

    def views_of(self, x: Tensor) -> int:
        """K when ``x`` is a batch of views ``(b, K, C, H, W)`` (``train.augmult``), else 1
        (a private batch without augmult, or public examples: anchors, a public set)."""
        return self.augmult.k if self.augmult is not None and x.dim() == 5 else 1

    def view_losses(self, model, x: Tensor, y: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """``(logits, losses)`` of a batch: per example, or with ``k`` views per example (x of
        shape (b, k, ...)) the view-mean logits and each view's loss / k as (b * k,) rows: the
        gradient of their sum is, per example, the mean of its views' gradients."""
        if k == 1:
            logits = model(x)
            return logits, per_example(self.loss_fn, logits, y)
        logits = model(x.flatten(0, 1))
        losses = per_example(self.loss_fn, logits, y.repeat_interleave(k, dim=0)) / k
        return logits.view(x.shape[0], k, *logits.shape[1:]).mean(1), losses

    def _per_example_fn(self, target: GradTarget, views: int = 1) -> Callable:
        key = (id(target.forward), views)
        if key not in self._vmapped:

            def single_loss(params, x, y):
                if views > 1:  # x: the example's K views; its loss is their mean
                    logits = target.forward(params, x)
                    loss = per_example(self.loss_fn, logits, y.expand(views, *y.shape)).mean()
                    mean = logits.detach().mean(0, keepdim=True)
                    return loss, (loss.detach(), correct(mean, y.unsqueeze(0))[0])
                logits = target.forward(params, x.unsqueeze(0))
                loss = per_example(self.loss_fn, logits, y.unsqueeze(0)).sum()
                return loss, (loss.detach(), correct(logits.detach(), y.unsqueeze(0))[0])

            fn = vmap(grad(single_loss, has_aux=True), in_dims=(None, 0, 0))
            if self.compile:  # dynamic: Poisson batches (and last micro-batches) vary in size
                fn = torch.compile(fn, dynamic=True)
            self._vmapped = {key: fn}
        return self._vmapped[key]

    def _microbatches(self, x: Tensor, y: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """``(x, y)`` cut into consecutive micro-batches of ``self.microbatch`` examples."""
        for start in range(0, x.shape[0], self.microbatch):
            yield x[start : start + self.microbatch], y[start : start + self.microbatch]

    # --------------------------------------------------------- per-example
    def per_example(
        self, x: Tensor, y: Tensor, target: GradTarget | None = None
    ) -> Iterator[Chunk]:
        """Yield flat per-example gradients of ``target`` micro-batch by micro-batch."""
        target = target or self.target
        for xb, yb in self._microbatches(x, y):
            yield self.strategy.chunk(xb, yb, target)

    def public_gradients(self, x: Tensor, y: Tensor, target: GradTarget | None = None) -> Tensor:
        """Per-example gradients ``(m, p)`` of a *public* set (anchors, public examples).

        In multi-process training the m examples are split across ranks and the rows
        all-gathered, so each rank does 1/world of the work and all hold the same matrix.
        """
        target = target or self.target
        m = int(x.shape[0])
        mine = torch.arange(m, device=x.device)
        if self.dist is not None:
            mine = self.dist.shard(mine)
        rows = [c.grads for c in self.per_example(x[mine], y[mine], target)]
        local = torch.cat(rows) if rows else x.new_zeros((0, target.layout.dim))
        return local if self.dist is None else self.dist.all_gather_rows(local, m)

    def broadcast_(self, tensors) -> None:
        """Rank 0's values of ``tensors`` on every rank (identical copies in one process)."""
        if self.distributed:
            for t in tensors:
                self.dist.broadcast(t)

    # ---------------------------------------------------------- clipped sum
    def clipped_sum(
        self, x: Tensor, y: Tensor, clip: float, target: GradTarget | None = None
    ) -> ClippedSum:
        """``sum_i min(1, C/||g_i||) g_i`` over the batch (non-finite rows dropped)."""
        return self.strategy.clipped_sum(x, y, clip, target or self.target)

    # ---------------------------------------------------------------- mean
    def mean_gradient(self, x: Tensor, y: Tensor) -> tuple[Tensor, BatchStats]:
        """Ordinary (non-private) mean gradient, one backward pass per micro-batch."""
        total = torch.zeros(self.dim, device=x.device)
        stats = BatchStats()
        k = self.views_of(x)
        for xb, yb in self._microbatches(x, y):
            with self.autocast(x.device):
                logits, per = self.view_losses(self.model, xb, yb, k)
            gs = torch.autograd.grad(per.sum(), self._params)
            total += torch.cat([g.reshape(-1) for g in gs])
            stats.add(example_losses(per.detach(), k), correct(logits.detach(), yb))
        n = torch.tensor(float(x.shape[0]), device=x.device)
        if self.distributed:  # the mean over every rank's shard
            total, n = self.dist.all_reduce(total), self.dist.all_reduce(n)
        stats.clip.n = int(x.shape[0])
        return total / n.clamp_min(1.0), stats


def check_private_model(
    model: nn.Module, backend: str = "vmap", say: Callable[[str], None] = lambda _: None
) -> None:
    """Refuse models through which private data reaches the output unclipped (a
    :class:`~dpsub.errors.ConfigError` naming the module and what to use instead).

    BatchNorm mixes examples in a batch and its running statistics are updated from
    private data outside any clipping, so neither per-example clipping nor the
    accountant covers them. Use GroupNorm (every dpsub model does). With
    ``backend="ghost"``, modules that own trainable parameters but have no ghost rule
    (Linear, Conv2d, GroupNorm, LayerNorm have one) are ``say``-ed: their per-example
    gradients are materialized by ``vmap`` (exact, slower).
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) or getattr(
            module, "track_running_stats", False
        ):
            raise ConfigError(
                f"model: module {name!r} ({type(module).__name__}) keeps statistics of private "
                "batches outside clipping; use GroupNorm (or LayerNorm) instead"
            )
    if backend == "ghost":
        from dpsub.grads.ghost import fallback_layers

        if others := fallback_layers(model):
            say(
                f"grads.backend=ghost: no ghost rule for {', '.join(others)}; their "
                "per-example gradients are materialized by vmap (exact, slower)"
            )
