"""Per-example gradients (vectorized), clipping, and the flat layout they use."""

from dpsub.grads.clip import (
    ClippedAccumulator,
    ClippedResidualSum,
    ClipStats,
    clip_rows,
    clipped_sum,
    finite_norms,
    finite_rows,
)
from dpsub.grads.engine import (
    BACKENDS,
    BatchStats,
    Chunk,
    ClippedSum,
    GradEngine,
    GradTarget,
    auto_microbatch,
    check_private_model,
)
from dpsub.grads.layout import ParamLayout

__all__ = [
    "BACKENDS",
    "BatchStats",
    "Chunk",
    "ClipStats",
    "ClippedAccumulator",
    "ClippedResidualSum",
    "ClippedSum",
    "GradEngine",
    "GradTarget",
    "ParamLayout",
    "auto_microbatch",
    "check_private_model",
    "clip_rows",
    "clipped_sum",
    "finite_norms",
    "finite_rows",
]
