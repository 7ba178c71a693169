"""Run logging: metrics.jsonl, Weights & Biases (offline by default)."""

from dpsub.tracking.run_logger import METRICS_FILE, RunLogger, read_metrics, resolve_mode

__all__ = ["METRICS_FILE", "RunLogger", "read_metrics", "resolve_mode"]
