"""dpsub as a library: private training around your own loop, data, model and loss.

::

    private = dpsub.make_private(model, optimizer, (x, y), batch_size=256,
                                 mechanism="gep", aux=public_x, epsilon=2.0, epochs=5)
    for xb, yb in private.batches():      # Poisson batches of the private data
        private.backward(xb, yb)          # the private gradient, in each p.grad (charged)
        optimizer.step()
    print(private.epsilon)

:func:`make_private` composes the same parts as ``dpsub-train`` (the gradient engine, the
mechanism, the privacy account with its ledger and plan, the privatizer that records
every noise draw) through the same :func:`~dpsub.training.build.assemble_run`, and its
releases go through the same :func:`~dpsub.training.build.release`: a seeded run gives the
weights and the ledger ``dpsub-train`` gives (a test checks it). docs/api.md is the
reference.
"""

from dpsub.api.private import BudgetExhausted, PrivateTraining, make_private
from dpsub.api.selection import Selection, select_privately
from dpsub.privacy.accountants import planned_rdp
from dpsub.privacy.selection import Repetitions

__all__ = [
    "BudgetExhausted",
    "PrivateTraining",
    "Repetitions",
    "Selection",
    "make_private",
    "planned_rdp",
    "select_privately",
]
