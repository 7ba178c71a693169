"""DP-SGD (Abadi et al. 2016), the "GP" baseline of the subspace papers.

Clip every per-example gradient to norm C, sum, add N(0, z^2 C^2 I_p), divide by
the expected batch size B = qN. The L2 sensitivity of the sum under add/remove
of one example is C, so the release has noise multiplier z.
"""

from __future__ import annotations

from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, register


@register("dpsgd")
class DPSGD(Mechanism):
    def step(self, x, y, ctx: StepContext) -> StepResult:
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        noisy, std = ctx.noise.release(clipped.sum, ctx.z, "gradient")
        return StepResult(
            grad=noisy / ctx.expected_batch_size,
            stats=clipped.stats,
            metrics={"noise_std": std},
        )
