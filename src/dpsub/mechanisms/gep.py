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

Accounting. Both releases use the same Poisson subsample and go through the
privatizer as two records, (S1, s1) and (S2, s2). Together they are one Gaussian
mechanism on ``[w / s1, r / s2]`` with multiplier ``1 / sqrt((S1/s1)^2 + (S2/s2)^2)``;
with ``s_j = z * sqrt(2) * S_j`` that is exactly z. (The official code instead
doubles the RDP of a multiplier-z mechanism; we do not.)

B-GEP releases only the embedding, one record (S1, s1 = z * S1); its update
``B^T w~ / B_expected`` is biased by the residual.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from dpsub.grads import BatchStats, ClippedAccumulator
from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, register
from dpsub.subspace import (
    GroupedBasis,
    fit_grouped_basis,
    group_parameters,
    resolve_dtype,
    stable_rank,
)


@register("gep")
class GEP(Mechanism):
    release_residual = True

    def __init__(self, **options):
        super().__init__(**options)
        self.basis: GroupedBasis | None = None
        self._basis_step = -1

    # ------------------------------------------------------------ privacy
    def noise_stds(self, z: float) -> tuple[float, float]:
        """(s1, s2): std of the embedding and residual noise at multiplier z."""
        if z == 0:  # noise off (tests); avoids 0 * inf when clipping is off too
            return 0.0, 0.0
        o = self.opts
        if self.release_residual:
            return z * math.sqrt(2) * o.clip_embedding, z * math.sqrt(2) * o.clip_residual
        return z * o.clip_embedding, 0.0

    # ----------------------------------------------------------- subspace
    def setup(self, engine, aux=None) -> None:
        super().setup(engine, aux)
        o = self.opts
        self.groups = group_parameters(engine.layout, o.grouping, o.num_groups)
        cap = sum(min(g.size, len(aux)) for g in self.groups)
        if o.num_bases > cap:
            raise ValueError(
                f"mechanism.num_bases={o.num_bases} exceeds what {len(aux)} anchor gradients can "
                f"span over these parameter groups ({cap}); lower num_bases or raise "
                "aux.num_samples"
            )

    def anchor_gradients(self, generator: torch.Generator) -> torch.Tensor:
        """G_a (m x p): per-example gradients of the auxiliary examples."""
        labels = self.aux.batch_labels(generator)
        return self.engine.public_gradients(self.aux.x, labels)

    def fit_subspace(self, generator: torch.Generator) -> GroupedBasis:
        Ga = self.anchor_gradients(generator)
        precision = self.opts.precision
        ctx = _allow_tf32() if precision == "tf32" and Ga.is_cuda else nullcontext()
        dtype = torch.float32 if precision in ("fp32", "tf32") else resolve_dtype(precision)
        with ctx:
            basis = fit_grouped_basis(
                Ga,
                self.groups,
                self.opts.num_bases,
                iters=self.opts.power_iters,
                generator=generator,
                compute_dtype=dtype,
            )
        self.engine.broadcast_(basis.bases)  # ranks: exactly rank 0's basis
        return basis

    def current_basis(self, ctx: StepContext) -> GroupedBasis:
        if self.basis is None or ctx.step - self._basis_step >= self.opts.subspace_every:
            self.basis = self.fit_subspace(ctx.rng)
            self._basis_step = ctx.step
        return self.basis

    # ---------------------------------------------------------------- step
    def step(self, x, y, ctx: StepContext) -> StepResult:
        basis = self.current_basis(ctx)
        o = self.opts
        every = o.diagnostics_every
        diag = ctx.diagnostics and bool(every) and ctx.step % every == 0
        acc, stats = ClippedAccumulator(), BatchStats()
        g_sum = torch.zeros(basis.dim, device=x.device) if diag else None
        res_sum = torch.zeros(basis.dim, device=x.device) if diag else None
        private: dict[str, float] = {}
        for i, chunk in enumerate(self.engine.per_example(x, y)):
            G = chunk.grads
            W = basis.embed(G)
            R = basis.residual(G, W)  # from the unclipped embedding
            acc.add("embedding", W, o.clip_embedding)
            if self.release_residual:
                acc.add("residual", R, o.clip_residual)
            stats.add(chunk.loss, chunk.correct)
            if diag:
                g_sum += G.sum(0)
                res_sum += R.sum(0)
                if i == 0:  # stable ranks of the first micro-batch (GEP Figure 5)
                    private["stable_rank_grad"] = stable_rank(G)
                    private["stable_rank_residual"] = stable_rank(R)

        s1, s2 = self.noise_stds(ctx.z)
        w_sum = acc.sum("embedding", o.clip_embedding, basis.k, x.device)
        update = basis.reconstruct(ctx.noise.gaussian(w_sum, s1, "embedding"))
        metrics = {"noise_std_embedding": s1}
        if self.release_residual:
            r_sum = acc.sum("residual", o.clip_residual, basis.dim, x.device)
            update = update + ctx.noise.gaussian(r_sum, s2, "residual")
            metrics["noise_std_residual"] = s2
        stats.clip = acc.stats.get("embedding", stats.clip)
        n = max(stats.clip.n, 1)
        for name, st in acc.stats.items():
            private[f"clip_fraction_{name}"] = st.clipped / n
        if diag and stats.clip.n:
            # ||(1/n) sum r_i|| / ||(1/n) sum g_i||, GEP Figure 4 (private batch: monitoring only)
            private["projection_error"] = float(res_sum.norm() / g_sum.norm().clamp_min(1e-12))
        return StepResult(
            grad=update / ctx.expected_batch_size,
            stats=stats,
            metrics=metrics,
            private_metrics=private,
        )

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "basis": None if self.basis is None else self.basis.state_dict(),
            "basis_step": self._basis_step,
        }

    def load_state_dict(self, state: dict) -> None:
        b = state.get("basis")
        device = self.aux.x.device if self.aux is not None else None
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
