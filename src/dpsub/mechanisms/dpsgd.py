"""DP-SGD (Abadi et al. 2016), the "GP" baseline of the subspace papers.

Clip every per-example gradient to norm C, sum, add N(0, z^2 C^2 I_p), divide by
the expected batch size B = qN. The L2 sensitivity of the sum under add/remove
of one example is C, so the step is a Gaussian mechanism with z_eff = z.
"""

from __future__ import annotations

from dpsub.mechanisms.base import (
    ClippedSumMixin,
    Mechanism,
    StepContext,
    StepResult,
    check_positive,
    register,
)


@register("dpsgd")
class DPSGD(ClippedSumMixin, Mechanism):
    def __init__(self, noise_multiplier: float, clip: float = 1.0):
        super().__init__(noise_multiplier)
        self.clip = check_positive("clip", clip)

    def effective_noise_multiplier(self) -> float:
        return self.noise_multiplier

    def step(self, x, y, ctx: StepContext) -> StepResult:
        total, loss_sum, correct, clipped = self.clipped_gradient_sum(x, y, self.clip)
        std = self.noise_multiplier * self.clip
        noisy = total + self.gaussian(total.shape, std, ctx, total.device)
        n = int(x.shape[0])
        return StepResult(
            grad=noisy / ctx.expected_batch_size,
            z_eff=self.effective_noise_multiplier(),
            loss_sum=loss_sum,
            correct=correct,
            n=n,
            metrics={"clip_fraction": clipped / max(n, 1), "noise_std": std},
        )
