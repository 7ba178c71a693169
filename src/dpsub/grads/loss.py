"""Per-example losses: ``loss_fn(outputs, targets) -> (B,)``, one value per example.

Every backend differentiates ``loss_fn`` example by example (vmap calls it on a batch of
one; opacus and ghost backpropagate ``loss_fn(outputs, targets).sum()``, whose gradient
with respect to example i's outputs is example i's alone). A loss that mixes examples
(a batch mean, a contrastive loss over the batch) breaks per-example clipping: the
engine checks the shape, not the independence, so only pass per-example losses.
Cross-entropy on logits is the default; :func:`mse` is the regression one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-example cross-entropy of logits ``(B, classes)`` against labels ``(B,)``."""
    return F.cross_entropy(outputs, targets, reduction="none")


def mse(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-example mean squared error over each example's output entries."""
    diff = outputs - targets.reshape(outputs.shape).to(outputs.dtype)
    return diff.square().flatten(1).mean(1)


def correct(outputs: Tensor, targets: Tensor) -> Tensor:
    """``(B,)`` bool: the arg-max class equals the label (classification); all False for
    any other output/target pair (a regression has no accuracy)."""
    if outputs.dim() == 2 and targets.dim() == 1 and not targets.is_floating_point():
        return outputs.argmax(-1) == targets
    return torch.zeros(outputs.shape[0], dtype=torch.bool, device=outputs.device)


def per_example(loss_fn: LossFn, outputs: Tensor, targets: Tensor) -> Tensor:
    """``loss_fn(outputs, targets)``, checked to be one loss per example."""
    loss = loss_fn(outputs, targets)
    if loss.shape != (outputs.shape[0],):
        raise ValueError(
            f"loss_fn must return one loss per example, shape ({outputs.shape[0]},); got "
            f"{tuple(loss.shape)} (use reduction='none')"
        )
    return loss


#: the losses a config can name (``train.loss``-style options and the Python API)
LOSSES: dict[str, LossFn] = {"cross_entropy": cross_entropy, "mse": mse}
