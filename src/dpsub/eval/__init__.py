"""Evaluations of a trained model beyond test accuracy (membership inference: :mod:`.mia`)."""
