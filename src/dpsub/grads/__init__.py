"""Per-example gradients (vectorized) and the flat parameter layout they use."""

from dpsub.grads.engine import (
    BACKENDS,
    Chunk,
    GradEngine,
    ParamLayout,
    check_private_model,
    clip_rows,
    clipped_sum,
)

__all__ = [
    "BACKENDS",
    "Chunk",
    "GradEngine",
    "ParamLayout",
    "check_private_model",
    "clip_rows",
    "clipped_sum",
]
