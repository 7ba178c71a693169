"""Which releases a session's ledger charges, so that loading a state never lowers it.

A :class:`~dpsub.api.private.PrivateTraining` session gives each release it makes a random
id and keeps, for every release its ledger charges (its own and those that came with
loaded states), what it was charged. A state carries that list. Loading a state sets the
ledger to the state's and charges again every release the session knew that the state
does not hold, so a rollback, a resume followed by a rollback, states passed between
sessions, or a session copied with ``copy.deepcopy`` never drop a release from the
ledger. A state without the list (a ``dpsub-train`` checkpoint, an older API state) counts
as new releases each time it is loaded: its releases cannot be told from another run's
(on the safe side: loading one twice counts it twice).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

#: (z, q) charged to the honest ledger, and (z, q) to the nominal one (None: none kept)
Charge = tuple[tuple[float, float], "tuple[float, float] | None"]
KEY = "api_releases"  # in a state_dict: [[id, z, q, z_nominal, q_nominal], ...]


@dataclass
class ReleaseBook:
    known: dict[str, Charge] = field(default_factory=dict)  # every release the ledger charges

    def record(self, account) -> None:
        """The release just charged to ``account``'s ledgers (after it, not before). A random
        id, not a counter: a session copied with deepcopy must not name its next release as
        the original names its own."""
        last = lambda led: (float(led.history[-1][0]), float(led.history[-1][1]))  # noqa: E731
        nominal = last(account.nominal) if account.nominal is not None else None
        self.known[secrets.token_hex(12)] = (last(account.ledger), nominal)

    def state(self) -> list[list]:
        return [[rid, *h, *(n or (None, None))] for rid, (h, n) in self.known.items()]

    def after_load(self, state: dict, account) -> None:
        """``account`` holds ``state``'s ledgers: charge every known release it lacks."""
        held = held_by(state)
        for rid, (honest, nominal) in self.known.items():
            if rid not in held and account.ledger is not None:
                account.ledger.step(*honest)
                if nominal is not None and account.nominal is not None:
                    account.nominal.step(*nominal)
        self.known = {**held, **self.known}


def held_by(state: dict) -> dict[str, Charge]:
    """The releases ``state``'s ledger charges, by id (new ids for a state without them)."""
    if state.get(KEY) is not None:
        return {r[0]: ((r[1], r[2]), None if r[3] is None else (r[3], r[4])) for r in state[KEY]}
    ledger = state.get("ledger")
    if not ledger:
        return {}
    honest = _steps(ledger["history"])
    nominal = _steps(state["nominal"]["history"]) if state.get("nominal") else []
    pair = lambda i: nominal[i] if len(nominal) == len(honest) else None  # noqa: E731
    return {secrets.token_hex(12): (zq, pair(i)) for i, zq in enumerate(honest)}


def _steps(history) -> list[tuple[float, float]]:
    return [(float(z), float(q)) for z, q, n in history for _ in range(int(n))]
