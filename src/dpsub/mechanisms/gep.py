"""GEP and B-GEP: gradient embedding perturbation (Yu et al., ICLR 2021).

Each step (``METHODS.md``, "GEP and B-GEP"):

1. Anchor subspace. Per-example gradients ``G_a`` (m x p) of the auxiliary
   examples with (by default freshly drawn) random labels; per parameter group a
   basis ``B_j`` (k_j rows, k_j proportional to sqrt(group size)) by ``t`` power
   iterations with QR. Auxiliary data is public: this costs no privacy.
2. Per private example: embedding ``w_i = B g_i`` (k) and residual
   ``r_i = g_i - B^T w_i`` (p), both from the *unclipped* gradient; clip ``w_i`` to
   S1 and ``r_i`` to S2 separately.
3. Release ``w~ = sum w_i + N(0, s1^2 I_k)`` and ``r~ = sum r_i + N(0, s2^2 I_p)``;
   update ``v = (B^T w~ + r~) / B_expected``.

Accounting. Both releases use the same Poisson subsample. Together they are one
Gaussian mechanism on the normalized concatenation ``[w / S1, r / S2]`` whose L2
sensitivity is sqrt(2) (each part has norm <= 1 after clipping); with
``s_j = z * sqrt(2) * S_j`` its noise multiplier is z, so ``z_eff = z``. (The
official code instead doubles the RDP of a multiplier-z mechanism; we do not.)

B-GEP releases only the embedding, one Gaussian mechanism with sensitivity S1:
``s1 = z * S1``, ``z_eff = z``; its update ``B^T w~ / B_expected`` is biased by the
residual.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from dpsub.grads import clip_rows
from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, check_positive, register
from dpsub.subspace import (
    GROUPING_SCHEMES,
    GroupedBasis,
    fit_grouped_basis,
    group_parameters,
    resolve_dtype,
    stable_rank,
)

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@register("gep")
class GEP(Mechanism):
    needs_aux = True
    release_residual = True

    def __init__(
        self,
        noise_multiplier: float,
        num_bases: int = 1000,
        clip_embedding: float = 10.0,
        clip_residual: float = 2.0,
        power_iters: int = 1,
        grouping: str = "stages",
        num_groups: int = 3,
        precision: str = "fp32",
        subspace_every: int = 1,
        diagnostics_every: int = 50,
    ):
        super().__init__(noise_multiplier)
        if int(num_bases) < 1:
            raise ValueError(f"mechanism.num_bases must be >= 1, got {num_bases}")
        if int(power_iters) < 1:
            raise ValueError(f"mechanism.power_iters must be >= 1, got {power_iters}")
        if grouping not in GROUPING_SCHEMES:
            raise ValueError(
                f"mechanism.grouping must be one of {GROUPING_SCHEMES}, got {grouping!r}"
            )
        if precision not in PRECISIONS:
            raise ValueError(f"mechanism.precision must be one of {PRECISIONS}, got {precision!r}")
        if int(subspace_every) < 1:
            raise ValueError(f"mechanism.subspace_every must be >= 1, got {subspace_every}")
        self.k = int(num_bases)
        self.clip_embedding = check_positive("clip_embedding", clip_embedding)
        self.clip_residual = check_positive("clip_residual", clip_residual)
        self.power_iters = int(power_iters)
        self.grouping, self.num_groups = grouping, int(num_groups)
        self.precision = precision
        self.subspace_every = int(subspace_every)
        self.diagnostics_every = int(diagnostics_every)
        self.basis: GroupedBasis | None = None
        self._basis_step = -1

    # ------------------------------------------------------------ privacy
    def effective_noise_multiplier(self) -> float:
        return self.noise_multiplier

    def noise_stds(self) -> tuple[float, float]:
        """(s1, s2): std of the embedding and residual noise."""
        z = self.noise_multiplier
        if z == 0:  # noise off (tests); avoids 0 * inf when clipping is off too
            return 0.0, 0.0
        if self.release_residual:
            return z * math.sqrt(2) * self.clip_embedding, z * math.sqrt(2) * self.clip_residual
        return z * self.clip_embedding, 0.0

    # ----------------------------------------------------------- subspace
    def setup(self, engine, aux=None) -> None:
        if aux is None:
            raise ValueError(
                f"mechanism={self.name} needs auxiliary data: choose an aux source, e.g. aux=natural"
            )
        super().setup(engine, aux)
        self.groups = group_parameters(engine.layout, self.grouping, self.num_groups)
        cap = sum(min(g.size, len(aux)) for g in self.groups)
        if self.k > cap:
            raise ValueError(
                f"mechanism.num_bases={self.k} exceeds what {len(aux)} anchor gradients can span "
                f"over these parameter groups ({cap}); lower num_bases or raise aux.num_samples"
            )

    def anchor_gradients(self, generator: torch.Generator) -> torch.Tensor:
        """G_a (m x p): per-example gradients of the auxiliary examples."""
        labels = self.aux.batch_labels(generator)
        return torch.cat([c.grads for c in self.engine.per_example(self.aux.x, labels)])

    def fit_subspace(self, generator: torch.Generator) -> GroupedBasis:
        Ga = self.anchor_gradients(generator)
        tf32 = self.precision == "tf32" and Ga.is_cuda
        ctx = _allow_tf32() if tf32 else nullcontext()
        dtype = (
            torch.float32 if self.precision in ("fp32", "tf32") else resolve_dtype(self.precision)
        )
        with ctx:
            return fit_grouped_basis(
                Ga,
                self.groups,
                self.k,
                iters=self.power_iters,
                generator=generator,
                compute_dtype=dtype,
            )

    # ---------------------------------------------------------------- step
    def step(self, x, y, ctx: StepContext) -> StepResult:
        if self.basis is None or ctx.step - self._basis_step >= self.subspace_every:
            self.basis = self.fit_subspace(ctx.generator)
            self._basis_step = ctx.step
        basis = self.basis
        s1, s2 = self.noise_stds()
        diag = bool(self.diagnostics_every) and ctx.step % self.diagnostics_every == 0

        w_sum = torch.zeros(basis.k, device=x.device)
        r_sum = torch.zeros(basis.dim, device=x.device) if self.release_residual else None
        g_sum = torch.zeros(basis.dim, device=x.device) if diag else None
        res_sum = torch.zeros(basis.dim, device=x.device) if diag else None
        loss_sum, correct, clipped_w, clipped_r = 0.0, 0, 0, 0
        metrics: dict[str, float] = {}
        for i, chunk in enumerate(self.engine.per_example(x, y)):
            G = chunk.grads
            W = basis.embed(G)
            R = basis.residual(G, W)  # from the unclipped embedding
            if diag:
                g_sum += G.sum(0)
                res_sum += R.sum(0)
                if i == 0:  # stable ranks of the first micro-batch (GEP Figure 5)
                    metrics["stable_rank_grad"] = stable_rank(G)
                    metrics["stable_rank_residual"] = stable_rank(R)
            Wc, mw = clip_rows(W, self.clip_embedding)
            w_sum += Wc.sum(0)
            clipped_w += int(mw.sum())
            if self.release_residual:
                Rc, mr = clip_rows(R, self.clip_residual)
                r_sum += Rc.sum(0)
                clipped_r += int(mr.sum())
            loss_sum += float(chunk.loss.sum())
            correct += int(chunk.correct.sum())

        w_noisy = w_sum + self.gaussian(w_sum.shape, s1, ctx, x.device)
        update = basis.reconstruct(w_noisy)
        if self.release_residual:
            update = update + r_sum + self.gaussian(r_sum.shape, s2, ctx, x.device)
        n = int(x.shape[0])
        metrics.update(
            clip_fraction_embedding=clipped_w / max(n, 1),
            noise_std_embedding=s1,
        )
        if self.release_residual:
            metrics.update(clip_fraction_residual=clipped_r / max(n, 1), noise_std_residual=s2)
        if diag and n:
            # ||(1/n) sum r_i|| / ||(1/n) sum g_i||, GEP Figure 4 (private batch: monitoring only)
            metrics["projection_error"] = float(res_sum.norm() / g_sum.norm().clamp_min(1e-12))
        return StepResult(
            grad=update / ctx.expected_batch_size,
            z_eff=self.effective_noise_multiplier(),
            loss_sum=loss_sum,
            correct=correct,
            n=n,
            metrics=metrics,
        )

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "basis": None if self.basis is None else self.basis.state_dict(),
            "basis_step": self._basis_step,
        }

    def load_state_dict(self, state: dict) -> None:
        b = state.get("basis")
        device = self.aux.x.device if getattr(self, "aux", None) is not None else None
        self.basis = None if b is None else GroupedBasis.from_state_dict(b, device=device)
        self._basis_step = int(state.get("basis_step", -1))


@register("bgep")
class BGEP(GEP):
    """Biased GEP: release only the noisy embedding (METHODS.md: s1 = z * S1)."""

    release_residual = False


class _allow_tf32:
    def __enter__(self):
        self._old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._old
