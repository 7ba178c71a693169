"""GEP and B-GEP: gradient embedding perturbation (Yu et al., ICLR 2021).

Each step (``docs/methods.md``, "GEP and B-GEP"):

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

Cost (``docs/speed.md``). The paper recomputes the subspace at every step from a fresh
random start; ``subspace_every`` reuses it for N steps and ``warm_start`` starts each
recomputation from the previous basis (subspace tracking: t iterations per update
accumulate across updates), with a fresh start every ``refresh_every`` steps. The
anchor gradients are streamed through the power step (never stacked into m x p for
t = 1). ``residual=bookkeeping`` clips the residual without forming it:
``||r_i||^2 = ||g_i||^2 - ||w_i||^2`` (bounded from above with a margin for rounding,
:meth:`~dpsub.subspace.GroupedBasis.residual_norms`) and
``sum_i c_i r_i = sum_i c_i g_i - B^T sum_i c_i w_i``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import nullcontext

import torch

from dpsub.grads import BatchStats, ClippedAccumulator, ClippedResidualSum, ClipStats, finite_norms
from dpsub.mechanisms.base import Mechanism, Refit, StepContext, StepResult, register
from dpsub.privacy import noise_std
from dpsub.subspace import (
    GroupedBasis,
    GroupedPowerStep,
    group_parameters,
    grouped_quota,
    random_starts,
    resolve_dtype,
    stable_rank,
    warm_starts,
)


@register("gep")
class GEP(Mechanism):
    release_residual = True
    recomputable = ("basis",)  # from the anchors (public); None: refit from a fresh start

    def __init__(self, parsed=None, /, **options):
        super().__init__(parsed, **options)
        self.basis: GroupedBasis | None = None
        self.refit = Refit(self.opts.subspace_every)  # any fit
        self.fresh = Refit(self.opts.refresh_every)  # a fit from a random start

    # ------------------------------------------------------------ privacy
    def noise_stds(self, z: float) -> tuple[float, float]:
        """(s1, s2): std of the embedding and residual noise at multiplier z."""
        o = self.opts
        if self.release_residual:
            z2 = z * math.sqrt(2)
            return noise_std(z2, o.clip_embedding), noise_std(z2, o.clip_residual)
        return noise_std(z, o.clip_embedding), 0.0

    # ----------------------------------------------------------- subspace
    def setup(self, engine, aux=None) -> None:
        super().setup(engine, aux)
        o = self.opts
        self.groups = group_parameters(engine.layout, o.grouping, o.num_groups)
        cap = sum(min(g.size, len(aux)) for g in self.groups)
        if o.num_bases > cap:
            more = any(g.size > len(aux) for g in self.groups)  # anchors limit a group
            raise ValueError(
                f"mechanism.num_bases={o.num_bases} exceeds the {cap} directions that "
                f"{len(aux)} anchor gradients span over {len(self.groups)} parameter group(s) of "
                f"{engine.dim} parameters (a group: at most min(its size, the anchors)); lower "
                + ("num_bases or raise aux.num_samples" if more else "num_bases")
            )

    def anchor_chunks(self, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """Micro-batches of G_a: per-example gradients of the auxiliary examples.

        With ``anchor_precision=bf16`` the forward and backward passes run under autocast
        (only inside the engine: the consumer's code between chunks is not autocast).
        """
        labels = self.aux.batch_labels(generator)
        low = self.opts.anchor_precision == "bf16"
        autocast = torch.autocast(self.aux.x.device.type, torch.bfloat16) if low else nullcontext()
        if self.engine.distributed:  # split across ranks
            with autocast:
                yield self.engine.public_gradients(self.aux.x, labels)
            return
        chunks = self.engine.per_example(self.aux.x, labels)
        while True:
            with autocast:
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk.grads

    def fit_subspace(
        self, generator: torch.Generator, start: GroupedBasis | None = None
    ) -> GroupedBasis:
        """The anchor subspace: ``power_iters`` power steps from ``start`` (or random starts).

        For t = 1 the anchor gradients are streamed through the power step (never m x p).
        """
        o = self.opts
        chunks = self.anchor_chunks(generator)  # draws the labels first
        device = self.aux.x.device
        quota = grouped_quota(self.groups, o.num_bases, len(self.aux))
        if start is None:
            starts = random_starts(self.groups, quota, generator, device)
        else:
            starts = warm_starts(start, self.groups, quota, device)
        if o.power_iters > 1:
            chunks = list(chunks)
        tf32 = o.precision == "tf32" and device.type == "cuda"
        dtype = torch.float32 if o.precision in ("fp32", "tf32") else resolve_dtype(o.precision)
        with _allow_tf32() if tf32 else nullcontext():
            for _ in range(o.power_iters):
                step = GroupedPowerStep(self.groups, starts, self.engine.dim, dtype)
                for G in chunks:
                    step.add(G)
                basis = step.finish()
                starts = basis.bases
        self.engine.broadcast_(basis.bases)  # ranks: exactly rank 0's basis
        return basis

    def current_basis(self, ctx: StepContext) -> GroupedBasis:
        """Refit every ``subspace_every`` steps; warm-started unless a refresh is due."""
        if not self.refit.due(ctx.step, self.basis):
            return self.basis
        warm = self.opts.warm_start and not self.fresh.due(ctx.step, self.basis)
        self.basis = self.fit_subspace(ctx.rng, start=self.basis if warm else None)
        self.refit.mark(ctx.step)
        if not warm:
            self.fresh.mark(ctx.step)
        return self.basis

    # ---------------------------------------------------------------- step
    def step(self, x, y, ctx: StepContext) -> StepResult:
        basis = self.current_basis(ctx)
        o = self.opts
        every = o.diagnostics_every
        diag = ctx.diagnostics and bool(every) and ctx.step % every == 0
        book = self.release_residual and o.residual == "bookkeeping"
        acc, stats, nonfinite = ClippedAccumulator(), BatchStats(), 0
        res = ClippedResidualSum(o.clip_residual) if book else None
        g_sum = torch.zeros(basis.dim, device=x.device) if diag else None
        res_sum = torch.zeros(basis.dim, device=x.device) if diag else None
        private: dict[str, float] = {}
        for i, chunk in enumerate(self.engine.per_example(x, y)):
            G, norms, ok = finite_norms(chunk.grads)  # non-finite examples -> 0 (counted)
            bad = (~ok).sum()  # a device tensor: no host sync
            nonfinite += bad
            W = basis.embed(G)
            acc.add("embedding", W, o.clip_embedding)
            R = None
            if book:
                res.add(G, W, basis.residual_norms(norms, W), bad)
            elif self.release_residual or diag:
                R = basis.residual(G, W)  # from the unclipped embedding
                if self.release_residual:
                    acc.add("residual", R, o.clip_residual)
            stats.add(chunk.loss, chunk.correct)
            if diag:
                g_sum += G.sum(0)
                res_sum += R.sum(0) if R is not None else G.sum(0) - basis.reconstruct(W.sum(0))
                if i == 0:  # stable ranks of the first micro-batch (GEP Figure 5)
                    private["stable_rank_grad"] = stable_rank(G)
                    private["stable_rank_residual"] = stable_rank(
                        R if R is not None else basis.residual(G, W)
                    )

        s1, s2 = self.noise_stds(ctx.z)
        w_sum = acc.sum("embedding", o.clip_embedding, basis.k, x.device)
        update = basis.reconstruct(ctx.noise.gaussian(w_sum, s1, "embedding"))
        metrics = {"noise_std_embedding": s1}
        if self.release_residual:
            if book:
                r_sum = res.sum(basis.reconstruct, basis.dim, x.device)
                acc.stats["residual"] = res.stats
            else:
                r_sum = acc.sum("residual", o.clip_residual, basis.dim, x.device)
            update = update + ctx.noise.gaussian(r_sum, s2, "residual")
            metrics["noise_std_residual"] = s2
        emb = acc.stats.get("embedding", ClipStats())
        stats.clip = ClipStats(emb.n, emb.clipped, nonfinite)
        n = max(stats.clip.n, 1)
        for name, st in acc.stats.items():
            private[f"clip_fraction_{name}"] = st.clipped / n  # a device tensor: read if logged
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
            "basis_step": self.refit.last,
            "fresh_step": self.fresh.last,
        }

    def load_state_dict(self, state: dict) -> None:
        b = state.get("basis")
        device = self.aux.x.device if self.aux is not None else None
        self.basis = None if b is None else GroupedBasis.from_state_dict(b, device=device)
        self.refit.mark(state.get("basis_step", -1))
        self.fresh.mark(state.get("fresh_step", self.refit.last))


@register("bgep")
class BGEP(GEP):
    """Biased GEP: release only the noisy embedding (docs/methods.md: s1 = z * S1)."""

    release_residual = False


class _allow_tf32:
    def __enter__(self):
        self._old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._old
