"""The dataset names (torch-free, for the config validator); ``datasets.LOADERS`` has one loader each."""

from dpsub.choices import DATASETS

__all__ = ["DATASETS", "PUBLISHED_SIZES", "published_train_size"]

#: (train, test) sizes of the official releases; SVHN's optional 'extra' split has 531,131.
PUBLISHED_SIZES = {
    "mnist": (60_000, 10_000),
    "fashion_mnist": (60_000, 10_000),
    "cifar10": (50_000, 10_000),
    "svhn": (73_257, 26_032),
}
SVHN_EXTRA = 531_131


def published_train_size(dataset: dict, aux: dict) -> int | None:
    """N of a run from the official release's size, for cost estimates where the data is
    absent: the train split (SVHN with ``use_extra``: plus 'extra'), less the validation
    and ``public_train`` auxiliary carve-outs; None for a dataset without a published size."""
    name = dataset.get("name")
    if name not in PUBLISHED_SIZES:
        return None
    n = PUBLISHED_SIZES[name][0] + (SVHN_EXTRA if dataset.get("use_extra") else 0)
    n -= int(dataset.get("validation_size") or 0)
    if aux.get("name") == "public_train":
        n -= int(aux.get("num_samples") or 0)
    return n
