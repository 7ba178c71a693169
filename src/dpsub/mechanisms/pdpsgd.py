"""PDP-SGD and RPDP-SGD: DP-SGD's noisy gradient projected onto a k-dim subspace.

Zhou, Wu and Banerjee, "Bypassing the Ambient Dimension: Private SGD with Gradient
Subspace Identification" (ICLR 2021), Algorithm 1; ``docs/methods.md``, "PDP-SGD and
RPDP-SGD". Each step t:

1. Release DP-SGD's noisy gradient: ``g~ = (sum_i clip(g_i, C) + N(0, z^2 C^2 I_p)) / B``
   (one record (C, z C): the step costs exactly DP-SGD's).
2. Subspace ``V_k`` (k x p, orthonormal rows), recomputed every ``s`` steps:
   PDP-SGD: the top-k eigenvectors of ``M_t = (1/m) sum_j g_j g_j^T`` over the m public
   examples' gradients (true labels, unclipped, model in eval mode as in the authors'
   code), exactly from the m x m Gram matrix (:func:`~dpsub.subspace.top_eigvecs_from_gram`)
   or by the power method (:func:`~dpsub.subspace.power_iteration`); RPDP-SGD: a random
   Gaussian k x p matrix, orthonormalized, from the public generator ``ctx.rng``.
3. Update with ``V_k^T V_k g~``: post-processing of the release, so no privacy cost.

Before ``start_step`` the update is plain DP-SGD (the authors' Fashion-MNIST run
projects from its 15th epoch on). The public examples come from the aux source
``public_train`` (removed from the private set, so N and q = B / N exclude them).

Metrics. Public: ``kept_norm_fraction`` = ||V^T V g~|| / ||g~|| (from the release),
``public_energy_topk`` = the share of tr(M_t) in its top-k eigenvalues (public data).
Private (``privacy.private_diagnostics`` only, every ``diagnostics_every`` steps):
``residual_mean_grad`` = ||(I - V^T V) g|| / ||g|| for the clean mean gradient g of the
batch, and ``residual_clipped_sum`` the same for the noise-free clipped sum.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpsub.mechanisms.base import Mechanism, Refit, StepContext, StepResult, register
from dpsub.subspace import (
    GroupedBasis,
    orthonormal_random_basis,
    power_iteration,
    top_eigvecs_from_gram,
)


def residual_fraction(basis: GroupedBasis, v: Tensor) -> float:
    """``||v - V^T V v|| / ||v||`` (0 for a zero vector)."""
    norm = float(v.norm())
    return float((v - basis.project(v)).norm()) / norm if norm > 0 else 0.0


@register("rpdpsgd")
class RPDPSGD(Mechanism):
    """RPDP-SGD: the projection onto a random orthonormal basis, redrawn every s steps."""

    recomputable = ("basis",)  # public (a random draw, or PDP-SGD's public gradients)

    def __init__(self, parsed=None, /, **options):
        super().__init__(parsed, **options)
        self.basis: Tensor | None = None
        self.refit = Refit(self.opts.subspace_every)

    def setup(self, engine, aux=None) -> None:
        super().setup(engine, aux)
        if self.opts.num_bases > engine.dim:
            raise ValueError(
                f"mechanism.num_bases={self.opts.num_bases} exceeds the model's "
                f"{engine.dim} parameters"
            )

    # ----------------------------------------------------------- subspace
    def fit_basis(self, ctx: StepContext) -> tuple[Tensor, dict[str, float]]:
        """A new (k, p) basis and its public metrics."""
        k, p = self.opts.num_bases, self.engine.dim
        return orthonormal_random_basis(p, k, ctx.rng, self._device()), {}

    def _device(self) -> torch.device:
        return next(self.engine.model.parameters()).device

    def current_basis(self, ctx: StepContext) -> tuple[Tensor, dict[str, float]]:
        if self.refit.due(ctx.step, self.basis):
            self.basis, metrics = self.fit_basis(ctx)
            self.engine.broadcast_([self.basis])  # ranks: exactly rank 0's basis
            self.refit.mark(ctx.step)
            return self.basis, metrics
        return self.basis, {}

    # ---------------------------------------------------------------- step
    def step(self, x, y, ctx: StepContext) -> StepResult:
        o = self.opts
        clipped = self.engine.clipped_sum(x, y, o.clip)
        noisy, std = ctx.noise.release(clipped.sum, ctx.z, "gradient")  # DP-SGD's release
        metrics = {"noise_std": std, "projected": 0.0}
        if ctx.step < o.start_step:
            return StepResult(noisy / ctx.expected_batch_size, clipped.stats, metrics)
        V, fit_metrics = self.current_basis(ctx)
        basis = GroupedBasis.single(V)  # one group: the whole flat vector
        update = basis.project(noisy)  # post-processing of the release
        metrics.update(fit_metrics, projected=1.0)
        kept = update.detach().norm() / noisy.detach().norm().clamp_min(1e-30)
        metrics["kept_norm_fraction"] = float(kept)
        private = {}
        every = o.diagnostics_every
        if ctx.diagnostics and every and ctx.step % every == 0:
            mean_grad, _ = self.engine.mean_gradient(x, y)
            private["residual_mean_grad"] = residual_fraction(basis, mean_grad)
            private["residual_clipped_sum"] = residual_fraction(basis, clipped.sum.value)
        return StepResult(update / ctx.expected_batch_size, clipped.stats, metrics, private)

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict:
        basis = None if self.basis is None else self.basis.detach().cpu()
        return {"basis": basis, "basis_step": self.refit.last}

    def load_state_dict(self, state: dict) -> None:
        basis = state.get("basis")
        self.basis = None if basis is None else basis.to(self._device())
        self.refit.mark(state.get("basis_step", -1))


@register("pdpsgd")
class PDPSGD(RPDPSGD):
    """PDP-SGD: the projection onto the top-k eigenspace of the public gradients' M_t."""

    def setup(self, engine, aux=None) -> None:
        super().setup(engine, aux)
        if self.opts.num_bases > len(aux):
            raise ValueError(
                f"mechanism.num_bases={self.opts.num_bases} exceeds the {len(aux)} public "
                "gradients, whose span has at most that many directions; lower num_bases or "
                "raise aux.num_samples"
            )

    def public_gradients(self, ctx: StepContext) -> Tensor:
        """M's factor (m, p): per-example gradients of the public set, model in eval mode."""
        model = self.engine.model
        was_training = model.training
        model.eval()
        try:
            labels = self.aux.batch_labels(ctx.rng)  # true labels for public_train
            return self.engine.public_gradients(self.aux.x, labels)  # split across ranks
        finally:
            model.train(was_training)

    def fit_basis(self, ctx: StepContext) -> tuple[Tensor, dict[str, float]]:
        G = self.public_gradients(ctx)
        k = self.opts.num_bases
        if self.opts.eigensolver == "power":
            basis = power_iteration(G, k, self.opts.power_iters, ctx.rng)
            top = float((G @ basis.T).pow(2).sum())
        else:
            basis, evals = top_eigvecs_from_gram(G, k, return_eigenvalues=True)
            top = float(evals.sum()) * G.shape[0]
        total = float(G.pow(2).sum())
        return basis, {"public_energy_topk": top / total if total > 0 else 0.0}
