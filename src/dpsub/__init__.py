"""dpsub: differentially private deep learning with gradient-subspace methods.

The Python API (:mod:`dpsub.api`, docs/api.md): ``dpsub.make_private(model, optimizer,
data, ...)``. It is imported on first use, so ``import dpsub.<light module>`` (the config
validator) does not pay for torch. The package is typed (``py.typed``): a type checker
sees the API's signatures through the ``TYPE_CHECKING`` import below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports it
    from dpsub.api import (
        BudgetExhausted,
        PrivateTraining,
        Repetitions,
        Selection,
        make_private,
        planned_rdp,
        select_privately,
    )

__all__ = [
    "BudgetExhausted",
    "PrivateTraining",
    "Repetitions",
    "Selection",
    "make_private",
    "planned_rdp",
    "select_privately",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import dpsub.api

        return getattr(dpsub.api, name)
    raise AttributeError(f"module 'dpsub' has no attribute {name!r}")
