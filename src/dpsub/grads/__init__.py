"""Per-example gradients (vectorized) and the flat parameter layout they use."""

from dpsub.grads.engine import BACKENDS, Chunk, GradEngine, ParamLayout, clip_rows, clipped_sum

__all__ = ["BACKENDS", "Chunk", "GradEngine", "ParamLayout", "clip_rows", "clipped_sum"]
