"""Non-private training: the ordinary mean gradient, no clipping, no noise.

Its cost is infinite: the run reports epsilon = inf, never 0.
"""

from __future__ import annotations

from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, register


@register("nonprivate")
class NonPrivate(Mechanism):
    def step(self, x, y, ctx: StepContext) -> StepResult:
        grad, stats = self.engine.mean_gradient(x, y)
        return StepResult(grad=grad, stats=stats)
