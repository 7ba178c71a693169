"""RGP and RGP-random: reparametrized gradient perturbation (Yu et al., ICML 2021).

Each step (Algorithm 1; ``docs/methods.md``, "RGP, RGP-random, DP-PowerSGD"):

1. Carriers per weight matrix W (p x d): RGP runs K power iterations (Algorithm 2) on
   the historical update ``Delta = W_t - W_0``, or on ``W_t`` itself during the first
   ``warmup_steps`` steps (line 5: the historical update is 0 at the start), and
   orthonormalizes ``L`` (p x r) and ``R`` (r x d). RGP-random draws them uniformly
   at random from ``ctx.rng``. Both use only public quantities: the initialization
   and the released updates.
2. Per-example gradients of the carriers only, through the reparametrized network
   ``W = L R + stop_grad(W - L R)`` (:class:`~dpsub.subspace.reparam.LowRankReparam`), plus
   those of the small non-matrix parameters (biases, norm affines); ``vmap`` by default,
   ghost clipping of the carriers as plain layers with ``grads.backend=ghost``.
3. Clip the concatenation of all of them to C per example: one ``Sensitive`` of
   sensitivity C; add N(0, z^2 C^2) to every coordinate through ``ctx.noise``. The
   record (C, z C) gives exactly the planned multiplier z.
4. Reconstruct every weight's gradient by Corollary 2.1.1,
   ``(dL) R + L (dR) - L L^T (dL) R``, pass the non-matrix parameters' noisy gradients
   through, divide by the expected batch size; any optimizer follows (post-processing).

``update=left`` is the authors' code: the right carrier is frozen (no gradient, no
noise) and the update is ``(dL) R``. ``source=weights`` decomposes ``W_t`` at every
step, which is what the code does by default (its warm-up snapshot is off).
``head=full`` leaves the classification layer (the last ``nn.Linear``) un-reparametrized:
its full per-example gradient, times ``head_scale`` (the code's 1/100), joins the joint
clip, and its noisy sum is its gradient. ``mechanism=rgp_authors`` sets all three.

Privacy schedule: a single phase. The paper's warm-up is the same release (carriers
from ``W_t`` instead of ``W_t - W_0``), so it is charged like every other step.
"""

from __future__ import annotations

from abc import abstractmethod

from torch import Tensor, nn

from dpsub.mechanisms.base import Mechanism, Refit, StepContext, StepResult, register
from dpsub.subspace.lowrank import carrier_projection, power_carriers, random_carriers
from dpsub.subspace.reparam import Carriers, LowRankReparam


def classifier_weight(model) -> str:
    """The weight of the model's last ``nn.Linear``: its classification layer."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError("mechanism.head=full: the model has no nn.Linear classification layer")
    return f"{names[-1]}.weight" if names[-1] else "weight"


class _CarrierMechanism(Mechanism):
    """Steps 2-4 above; subclasses choose the carriers (step 1)."""

    def __init__(self, parsed=None, /, **options):
        super().__init__(parsed, **options)
        self.carriers: Carriers | None = None
        self.refit = Refit(self.opts.carriers_every)

    def setup(self, engine, aux=None) -> None:
        super().setup(engine, aux)
        if not engine.strategy.any_target:
            raise ValueError(
                f"mechanism={self.name} differentiates gradient carriers, which "
                "grads.backend=opacus cannot; use grads.backend=vmap"
            )
        o = self.opts
        head = () if o.head == "reparam" else (classifier_weight(engine.model),)
        if o.head_scale != 1.0 and not head:
            raise ValueError(
                f"mechanism.head_scale={o.head_scale} applies with mechanism.head=full only"
            )
        if o.head_scale != 1.0 and engine.backend == "ghost":
            raise ValueError("mechanism.head_scale != 1 needs grads.backend=vmap (not ghost)")
        self.reparam = LowRankReparam(
            engine.model, train_right=o.update == "full", full=head,
            scale={n: o.head_scale for n in head},
        )  # fmt: skip

    @abstractmethod
    def fit_carriers(self, ctx: StepContext) -> Carriers:
        """Orthonormal ``(L, R)`` for every weight matrix, from public quantities only."""

    def current_carriers(self, ctx: StepContext) -> Carriers:
        if self.refit.due(ctx.step, self.carriers):
            self.carriers = self.fit_carriers(ctx)
            self.engine.broadcast_([t for pair in self.carriers.values() for t in pair])
            self.refit.mark(ctx.step)
        return self.carriers

    def step(self, x, y, ctx: StepContext) -> StepResult:
        carriers = self.current_carriers(ctx)
        ghost = self.engine.strategy.module_targets  # ghost clipping of the carriers
        target = (self.reparam.ghost_target if ghost else self.reparam.target)(carriers)
        clipped = self.engine.clipped_sum(x, y, self.opts.clip, target=target)
        noisy, std = ctx.noise.release(clipped.sum, ctx.z, "carriers")
        grad = self.reparam.reconstruct(noisy, target, carriers)
        every = self.opts.diagnostics_every
        private = {}
        if ctx.diagnostics and every and ctx.step % every == 0 and x.shape[0]:
            private["projection_residual"] = self.projection_residual(x, y, carriers)
        return StepResult(
            grad=grad / ctx.expected_batch_size,
            stats=clipped.stats,
            metrics={"noise_std": std, "released_dim": float(target.layout.dim)},
            private_metrics=private,
        )

    def projection_residual(self, x: Tensor, y: Tensor, carriers: Carriers) -> float:
        """``||dW - P(dW)|| / ||dW||`` over all weights, dW the batch's mean gradient (eq. 5).

        How much of the (non-private) gradient the carriers miss; computed from private
        data without noise, so a diagnostic only.
        """
        mean, _ = self.engine.mean_gradient(x, y)
        grads = self.engine.layout.unflatten(mean)
        missed = total = 0.0
        for name, (L, R) in carriers.items():
            G = grads[name].reshape(L.shape[0], -1)
            dR = None if self.opts.update == "left" else L.T @ G
            missed += float((G - carrier_projection(G @ R.T, dR, L, R)).pow(2).sum())
            total += float(G.pow(2).sum())
        return (missed / total) ** 0.5 if total > 0 else 0.0

    @property
    def device(self):
        return next(iter(self.reparam.matrices().values())).device

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"carriers": self.carriers, "carrier_step": self.refit.last}

    def load_state_dict(self, state: dict) -> None:
        c, dev = state["carriers"], self.device
        self.carriers = (
            None if c is None else {n: (L.to(dev), R.to(dev)) for n, (L, R) in c.items()}
        )
        self.refit.mark(state["carrier_step"])


@register("rgp")
class RGP(_CarrierMechanism):
    """Carriers from the historical update by power iteration (Algorithms 1 and 2)."""

    def setup(self, engine, aux=None) -> None:
        super().setup(engine, aux)
        self.reference: dict[str, Tensor] = {}
        if self.opts.source == "historical":  # W_0: the initialization, public
            self.reference = {n: W.clone() for n, W in self.reparam.matrices().items()}

    def decomposed(self, name: str, W: Tensor, step: int) -> Tensor:
        """``Delta`` of Algorithm 1, line 5: ``W_t - W_0``, or ``W_t`` during the warm-up."""
        if self.opts.source == "weights" or step < self.opts.warmup_steps:
            return W
        return W - self.reference[name]

    def fit_carriers(self, ctx: StepContext) -> Carriers:
        o = self.opts
        return {
            n: power_carriers(self.decomposed(n, W, ctx.step), o.rank, o.power_iters, ctx.rng)
            for n, W in self.reparam.matrices().items()
        }

    def state_dict(self) -> dict:
        return {**super().state_dict(), "reference": self.reference}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.reference = {n: W.to(self.device) for n, W in state["reference"].items()}


@register("rgp_random")
class RGPRandom(_CarrierMechanism):
    """Uniformly random orthonormal carriers (the paper's RGP-random baseline)."""

    def fit_carriers(self, ctx: StepContext) -> Carriers:
        return {
            n: random_carriers(*W.shape, self.opts.rank, ctx.rng, self.device)
            for n, W in self.reparam.matrices().items()
        }
