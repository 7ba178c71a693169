"""The dataset names (torch-free, for the config validator); ``datasets.LOADERS`` has one loader each."""

from dpsub.choices import DATASETS

__all__ = ["DATASETS"]
