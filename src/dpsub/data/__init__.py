"""Datasets as normalized in-memory tensors."""

from dpsub.data.datasets import LOADERS, DatasetBundle, DatasetNotFoundError, load_dataset

__all__ = ["LOADERS", "DatasetBundle", "DatasetNotFoundError", "load_dataset"]
