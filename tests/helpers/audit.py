"""The audit tests' smallest run."""

TINY = (
    "dataset=synthetic",
    "dataset.synthetic.n_train=32",
    "dataset.synthetic.n_test=32",
    "train.batch_size=32",
    "train.max_steps=1",
    "model=lenet",
)
