"""Non-private training: the ordinary mean gradient, no clipping, no noise.

Its cost is infinite: the run reports epsilon = inf, never 0.
"""

from __future__ import annotations

import math

from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, register


@register("nonprivate")
class NonPrivate(Mechanism):
    private = False

    def effective_noise_multiplier(self) -> float:
        return math.inf

    def step(self, x, y, ctx: StepContext) -> StepResult:
        chunk = self.engine.mean_gradient(x, y)
        return StepResult(
            grad=chunk.grads[0],
            z_eff=math.inf,
            loss_sum=float(chunk.loss.sum()),
            correct=int(chunk.correct.sum()),
            n=int(x.shape[0]),
        )
