"""DP-Hero (Zheng et al., "Rethinking Improved Privacy-Utility Trade-off with Pre-existing
Knowledge for DP Training"): DP-SGD whose isotropic noise is reshaped, layer by layer, by
the principal components of the layer's own weights.

Algorithm 1 (line 8) releases ``sum_i clip(g_i) + SVec^(t-1) N`` and Algorithm 2 builds
``SVec = B V`` from the weights ``W^(t-1)`` *before* the step (public: they are the
post-processing of earlier releases). Theorem 3 sets the scales so that the total noise
variance equals DP-SGD's. How dpsub reads the paper (no public code exists):

* **Which matrices.** Every trainable tensor with >= 2 dimensions, in its matrix view
  ``W`` = (out, in*kh*kw) (:meth:`~dpsub.grads.ParamLayout.matrix_view`): the weights of
  linear and convolution layers. ``W~ = W W^T`` is (out x out), so ``k = out`` (the
  number of eigenvalues; the paper's ``k``).
* **B and V.** ``W~ = B diag(egv) B^T`` (``eigh`` in float64; eigenvalues below 0 from
  rounding are set to 0). ``B`` is (k x k) orthogonal; ``V = diag(v)`` with Theorem 3's
  ``v_i = egv_i sqrt(k) sigma / ||egv||_2`` (so ``sum v_i^2 = k sigma^2``). Eigenvalues
  within rounding of 0 (``<= k eps_float64 egv_max``) count as 0.
* **The noise.** The layer's (out x in') block of the clipped sum gets
  ``C B diag(v) N`` with ``N`` i.i.d. standard normal (out x in'): every column has
  covariance ``sigma^2 C^2 B diag(s)^2 B^T`` with ``s = v / sigma``. The factor C (DP-SGD's
  ``N(0, sigma^2 C^2 I)``) is implicit in the paper; with it, equal eigenvalues give
  ``s = 1`` and exactly DP-SGD's noise. Drawn through
  ``ctx.noise.shaped(sum, std=z C, blocks=[NoiseBlock(start, out, in', left=B diag(s))])``.
* **Biases and norm parameters** (1-D tensors) have no ``W W^T``; the paper does not say
  what they get. They get DP-SGD's isotropic ``N(0, z^2 C^2)`` (the privatizer's noise
  outside every block).
* **Eigenvalues of zero.** ``egv_i = 0`` gives ``v_i = 0``: no noise at all in that
  direction, which no finite epsilon covers; the trainer refuses such a step
  (PrivacyError). This happens for every layer with more outputs than inputs
  (``out > in'``: rank of ``W W^T`` <= in') and for dead rows; the error names the layer
  and points to ``dphero_floor``.
  An all-zero ``W`` (0/0 in Theorem 3) is read as equal eigenvalues: isotropic noise.

Privacy. The paper's Theorems 2-3 charge the step as DP-SGD with multiplier sigma
because the *total* variance is unchanged. That is not a privacy guarantee: a Gaussian
mechanism with covariance Sigma and L2 sensitivity C is exactly as private as an
isotropic one with multiplier ``sqrt(lambda_min(Sigma)) / C`` (the worst neighbour
shifts the output along the least noisy direction; docs/methods.md). Since ``mean(s^2) = 1``,
``min s <= 1``, with equality only for equal eigenvalues. dpsub therefore runs DP-Hero
with ``accounting = "measured"``: the ledger is charged ``z_rec = z min_layers min_i s_i``
from the privatizer's noise records (the honest epsilon, on which the budget is
enforced), and a nominal ledger the planned z (the paper's epsilon); both are logged.
``mechanism.accounting=nominal`` enforces the budget on the nominal epsilon instead (to
reproduce the paper; the trainer warns that it is not a guarantee).

``dphero_floor`` keeps the shape but never adds less noise in any direction than
DP-SGD: ``s_i -> max(s_i, 1)``. Its least noisy direction is ``z C``, so the planned
accounting holds (its nominal epsilon is its honest one); it adds more total noise than
DP-SGD whenever the eigenvalues differ.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from dpsub.errors import PrivacyError
from dpsub.mechanisms.base import Mechanism, StepContext, StepResult, register
from dpsub.privacy import NoiseBlock

__all__ = ["DPHero", "DPHeroFloor", "hero_scales"]


def hero_scales(w: Tensor) -> tuple[Tensor, Tensor]:
    """``(B, s)`` of one weight matrix ``w`` (out x in'), both float64.

    ``w w^T = B diag(egv) B^T`` (Algorithm 2) and ``s_i = egv_i sqrt(k) / ||egv||_2``
    (Theorem 3's ``v_i / sigma``, ``k = out``), so ``sum_i s_i^2 = k``. Eigenvalues within
    rounding of 0 are 0 (so ``s_i = 0``); an all-zero ``w`` gives ``s = 1`` (equal eigenvalues).
    """
    w = w.detach().double()
    egv, basis = torch.linalg.eigh(w @ w.T)
    # eigenvalues within rounding of 0 (rank-deficient W) are 0: no noise in that direction
    egv = torch.where(egv > egv.max() * egv.numel() * torch.finfo(egv.dtype).eps, egv, 0.0)
    norm = torch.linalg.vector_norm(egv)
    if norm == 0:
        return basis, torch.ones_like(egv)
    return basis, egv * math.sqrt(egv.numel()) / norm


@register("dphero")
class DPHero(Mechanism):
    """Clip, sum, add ``z C B diag(s) N`` per weight matrix (DP-SGD's noise elsewhere)."""

    floor: ClassVar[bool] = False

    def __init__(self, parsed: Any = None, /, **options: Any):
        super().__init__(parsed, **options)
        self.accounting = "planned" if self.floor else self.opts.accounting

    def noise_blocks(self) -> tuple[list[NoiseBlock], Tensor]:
        """One :class:`NoiseBlock` per weight matrix from the current weights, and all scales."""
        layout = self.engine.layout
        flat = self.engine.flat_params()
        blocks, scales = [], []
        for name in layout.matrix_names():
            rows, cols = layout.matrix_shape(name)
            basis, s = hero_scales(layout.matrix_view(flat, name))
            if self.floor:
                s = s.clamp_min(1.0)
            elif not bool(s.min() > 0):
                raise _starved(name, rows, cols, int((s <= 0).sum()))
            start = layout.offsets[layout.names.index(name)]
            blocks.append(NoiseBlock(start, rows, cols, basis * s))  # B diag(s)
            scales.append(s)
        return blocks, torch.cat(scales)

    def step(self, x, y, ctx: StepContext) -> StepResult:
        blocks, s = self.noise_blocks()  # from W^(t-1), before this step's update
        clipped = self.engine.clipped_sum(x, y, self.opts.clip)
        std = ctx.noise.std(ctx.z, clipped.sum.sensitivity)
        noisy = ctx.noise.shaped(clipped.sum, std, blocks, "gradient")
        return StepResult(
            grad=noisy / ctx.expected_batch_size,
            stats=clipped.stats,
            metrics={"noise_std": std, "min_scale": float(s.min()), "max_scale": float(s.max())},
        )


def _starved(name: str, rows: int, cols: int, zeros: int) -> PrivacyError:
    """The step is refused before anything is drawn: directions without noise."""
    why = f"{rows} outputs > {cols} inputs" if rows > cols else "dead or dependent rows"
    return PrivacyError(
        f"mechanism dphero: {zeros} directions of {name}'s noise would get no noise (W W^T of "
        f"its {rows} x {cols} weight has zero eigenvalues: {why}); no finite epsilon covers "
        "them: use mechanism=dphero_floor, which gives every direction at least DP-SGD's noise"
    )


@register("dphero_floor")
class DPHeroFloor(DPHero):
    """DP-Hero with scales ``max(s_i, 1)``: never less noise than DP-SGD in any direction."""

    floor: ClassVar[bool] = True
