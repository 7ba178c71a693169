"""DP-PowerSGD: DP-SGD's release, compressed to low rank per weight matrix.

The RGP paper's baseline (Yu et al., ICML 2021, Section 5): PowerSGD (Vogels et al.,
NeurIPS 2019) finds the principal components of an *aggregated* gradient, so under DP
the gradient must be perturbed first and projected after ("otherwise the sensitivity
is hard to track"). Each step:

1. DP-SGD: clip every per-example gradient to C, sum, add N(0, z^2 C^2 I) through
   ``ctx.noise``, divide by the expected batch size B.
2. For every weight matrix M (out x in*kh*kw) of that noisy gradient, one PowerSGD step
   (Algorithm 1 of Vogels et al.): ``P = orth(M Q)``, ``Q = M^T P``, update ``P Q^T``;
   ``Q`` is kept as the next step's warm start. Non-matrix parameters pass through.
   With ``error_feedback`` the previous step's compression error is added to M first
   and the new error ``M - P Q^T`` is kept.

Step 2 is post-processing of DP-SGD's release: the cost is exactly DP-SGD's. Unlike
RGP it needs full per-example gradients (or ghost clipping: ``grads.backend=ghost``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, register
from dpsub.subspace.lowrank import powersgd, powersgd_start


@register("dppowersgd")
class DPPowerSGD(Mechanism):
    def __init__(self, parsed=None, /, **options):
        super().__init__(parsed, **options)
        self.Q: dict[str, Tensor] = {}  # per weight: (in*kh*kw, r), PowerSGD's warm start
        self.error: dict[str, Tensor] = {}  # per weight: last compression error (feedback)

    def step(self, x, y, ctx: StepContext) -> StepResult:
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        noisy, std = ctx.noise.release(clipped.sum, ctx.z, "gradient")
        return StepResult(
            grad=self.compress(noisy / ctx.expected_batch_size, ctx.rng),
            stats=clipped.stats,
            metrics={"noise_std": std},
        )

    def compress(self, g: Tensor, generator: torch.Generator) -> Tensor:
        """Every weight matrix of the flat gradient ``g`` replaced by its rank-r PowerSGD step."""
        layout = self.engine.layout
        out = g.clone()
        for name in layout.matrix_names():
            M = layout.matrix_view(g, name)
            if self.opts.error_feedback and name in self.error:
                M = M + self.error[name]
            if name not in self.Q:  # Vogels et al.: Q ~ N(0, I) at the first step
                self.Q[name] = powersgd_start(*M.shape, self.opts.rank, generator, M.device)
            approx, self.Q[name] = powersgd(M, self.Q[name])
            if self.opts.error_feedback:
                self.error[name] = M - approx
            layout.matrix_view(out, name).copy_(approx)
        return out

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"Q": self.Q, "error": self.error}

    def load_state_dict(self, state: dict) -> None:
        device = self.engine.flat_params().device
        self.Q = {n: q.to(device) for n, q in state["Q"].items()}
        self.error = {n: e.to(device) for n, e in state["error"].items()}
