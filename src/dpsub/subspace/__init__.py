"""Gradient subspaces shared by GEP, PDP-SGD, RGP and DP-Hero.

* :mod:`~dpsub.subspace.grouping` -- parameter groups (contiguous ranges of the flat
  gradient vector) and the sqrt(size) split of the basis quota (GEP, Section 4).
* :mod:`~dpsub.subspace.power` -- power method (GEP Algorithm 1; streamed over chunks of
  anchor gradients, from a random or a previous basis), grouped orthonormal bases with
  embed / reconstruct / residual / project and book-keeping residual norms, random
  bases (RPDP-SGD, RGP-random) and exact top eigenvectors from a Gram matrix (PDP-SGD).
* :mod:`~dpsub.subspace.diagnostics` -- stable rank, projection errors.
"""

from .diagnostics import (
    captured_energy,
    orthonormality_error,
    relative_error_of_mean,
    relative_projection_error,
    row_relative_errors,
    stable_rank,
)
from .grouping import GROUPING_SCHEMES, Group, group_parameters, split_quota
from .power import (
    RESIDUAL_SLACK,
    GroupedBasis,
    GroupedPowerStep,
    PowerStep,
    fit_grouped_basis,
    grouped_quota,
    orthonormal_random_basis,
    power_iteration,
    random_starts,
    resolve_dtype,
    top_eigvecs_from_gram,
    warm_starts,
)

__all__ = [
    "GROUPING_SCHEMES",
    "RESIDUAL_SLACK",
    "Group",
    "GroupedBasis",
    "GroupedPowerStep",
    "PowerStep",
    "captured_energy",
    "fit_grouped_basis",
    "group_parameters",
    "grouped_quota",
    "orthonormal_random_basis",
    "orthonormality_error",
    "power_iteration",
    "random_starts",
    "relative_error_of_mean",
    "relative_projection_error",
    "resolve_dtype",
    "row_relative_errors",
    "split_quota",
    "stable_rank",
    "top_eigvecs_from_gram",
    "warm_starts",
]
