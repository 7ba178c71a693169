"""dpsub: differentially private deep learning with gradient-subspace methods.

The Python API (:mod:`dpsub.api`, docs/api.md): ``dpsub.make_private(model, optimizer,
data, ...)``. It is imported on first use, so ``import dpsub.<light module>`` (the config
validator) does not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BudgetExhausted", "PrivateTraining", "make_private"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import dpsub.api

        return getattr(dpsub.api, name)
    raise AttributeError(f"module 'dpsub' has no attribute {name!r}")
