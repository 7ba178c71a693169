"""The dataset names (torch-free, for the config validator); ``datasets.LOADERS`` has one loader each."""

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar10_subset", "svhn", "synthetic")
