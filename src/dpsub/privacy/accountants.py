"""Privacy accounting for Poisson-subsampled Gaussian mechanisms.

Every mechanism in dpsub reports, per step, one *effective noise multiplier*
``z_eff`` (noise std divided by the L2 sensitivity of everything released in
that step) together with the sampling rate ``q``. The :class:`PrivacyLedger`
composes these steps with Opacus' accountants, one :class:`Accountant` class each,
chosen by name in one place (:func:`accountant_for`):

* ``rdp``: Opacus' RDP analysis (Mironov et al.) with its default orders and
  the improved RDP -> (eps, delta) conversion. The running RDP curve is kept
  as a vector, so the epsilon after each step costs microseconds and the budget
  can be checked before every single step.
* ``prv``: Opacus' PRV accountant (Gopi et al.), tighter but ~0.1-1 s per
  query; it is evaluated when asked (every log interval) and the budget check
  falls back to it only off the plan (how many of the plan's steps fit the budget is
  found once: all of a calibrated plan, maybe fewer of a fixed ``privacy.noise_multiplier``).

The ledger's ``history`` (list of ``(z_eff, q, steps)``) is the single source of
truth; it is saved in checkpoints, so a resumed run continues the same
composition instead of starting a new one.

Start-up cost: ``import opacus`` (any of its submodules) runs the package's
``__init__``, which imports the privacy engine, its optimizers and
``torch.distributed.tensor``: about 5 s on a loaded 2-core machine, before the first
step, for nothing the accounting uses. So Opacus' RDP analysis module (numpy and
scipy.special only) is loaded by itself (:func:`_rdp_analysis`), RDP calibration runs
Opacus' own search over it (:func:`calibrate_noise`; a test keeps both equal), and
the ``opacus`` package is imported only for the PRV accountant.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from dpsub.choices import ACCOUNTANTS

#: Opacus' ``RDPAccountant.DEFAULT_ALPHAS`` (tests/unit/test_privacy.py keeps them equal).
DEFAULT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
#: Opacus' ``get_noise_multiplier`` gives up above this multiplier.
MAX_SIGMA = 1e6


def _rdp_analysis():
    """``opacus.accountants.analysis.rdp``, loaded without running ``opacus/__init__``."""
    import importlib.util
    import sys

    name = "opacus.accountants.analysis.rdp"
    if name in sys.modules:
        return sys.modules[name]
    if "_dpsub_opacus_rdp" not in sys.modules:
        root = importlib.util.find_spec("opacus").submodule_search_locations[0]
        path = Path(root) / "accountants" / "analysis" / "rdp.py"
        spec = importlib.util.spec_from_file_location("_dpsub_opacus_rdp", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["_dpsub_opacus_rdp"] = module
    return sys.modules["_dpsub_opacus_rdp"]


class Accountant(Protocol):
    """What an accountant does for a composition ``[(z, q, steps), ...]`` of
    Poisson-subsampled Gaussian steps. One class per analysis (RDP and PRV today; a PLD
    accountant would be one more class in :data:`ACCOUNTANT_CLASSES`). The ledger asks
    it for an epsilon only where :attr:`rdp_exact` is False: the ledger keeps a running RDP
    curve of its own (the per-step budget check and the logged running estimate), which is
    the RDP accountant's epsilon exactly.
    """

    #: the ``privacy.accountant`` value that selects it
    name: str
    #: its epsilon is the ledger's running RDP curve converted (microseconds per step)
    rdp_exact: bool

    def epsilon(self, history: list[tuple[float, float, int]], delta: float) -> float:
        """Epsilon at ``delta`` of a composition whose steps are all private (finite z)."""

    def calibrate(
        self, epsilon: float, delta: float, sample_rate: float, steps: int, tolerance: float
    ) -> float:
        """Smallest z with epsilon([(z, q, steps)]) <= ``epsilon`` (Opacus' search)."""


@dataclass(frozen=True)
class RDPAccountant:
    """Opacus' RDP analysis (Mironov et al.) over :data:`DEFAULT_ORDERS` with the improved
    RDP -> (eps, delta) conversion; exact, so ``eps_error`` is unused."""

    eps_error: float = 0.01
    name: ClassVar[str] = "rdp"
    rdp_exact: ClassVar[bool] = True

    def epsilon(self, history, delta: float) -> float:
        rdp = np.zeros(len(DEFAULT_ORDERS))
        for z, q, n in history:
            rdp += _rdp_curve(z, q) * n
        return _rdp_to_eps(rdp, delta)

    def calibrate(self, epsilon, delta, sample_rate, steps, tolerance) -> float:
        return search_multiplier(
            lambda z: self.epsilon([(z, sample_rate, steps)], delta), epsilon, tolerance
        )


@dataclass(frozen=True)
class PRVAccountant:
    """Opacus' PRV accountant (Gopi et al.): tighter, ~0.1-1 s per query, to ``eps_error``."""

    eps_error: float = 0.01
    name: ClassVar[str] = "prv"
    rdp_exact: ClassVar[bool] = False

    def epsilon(self, history, delta: float) -> float:
        from opacus.accountants import PRVAccountant as OpacusPRV

        acc = OpacusPRV()
        acc.history = list(history)
        return float(acc.get_epsilon(delta=delta, eps_error=self.eps_error))

    def calibrate(self, epsilon, delta, sample_rate, steps, tolerance) -> float:
        with warnings.catch_warnings():  # Opacus' PRV warns on coarse grids while searching
            warnings.simplefilter("ignore")
            return search_multiplier(
                lambda z: self.epsilon([(z, sample_rate, steps)], delta), epsilon, tolerance
            )


def search_multiplier(eps_of, epsilon: float, tolerance: float) -> float:
    """The one noise-multiplier search (Opacus' ``get_noise_multiplier`` step for step, over
    any composition ``eps_of(z)``): double an upper bound from 20 until its epsilon is at most
    the target, then bisect until it is within ``tolerance`` below it; the upper end, whose
    epsilon never exceeds the target, is returned."""
    eps_high, sigma_low, sigma_high = math.inf, 0.0, 10.0
    while eps_high > epsilon:
        sigma_high = 2 * sigma_high
        eps_high = eps_of(sigma_high)
        if sigma_high > MAX_SIGMA:
            raise ValueError(
                f"no noise multiplier reaches epsilon={epsilon}: the budget is too low"
            )
    while epsilon - eps_high > tolerance:
        sigma = (sigma_low + sigma_high) / 2
        eps = eps_of(sigma)
        if eps < epsilon:
            sigma_high, eps_high = sigma, eps
        else:
            sigma_low = sigma
    return float(sigma_high)


#: ``privacy.accountant`` -> its class (:data:`dpsub.choices.ACCOUNTANTS` names the keys).
ACCOUNTANT_CLASSES: dict[str, type] = {c.name: c for c in (RDPAccountant, PRVAccountant)}


def accountant_for(name: str, eps_error: float = 0.01) -> Accountant:
    """The accountant ``privacy.accountant`` names: the one place a name is looked up."""
    if name not in ACCOUNTANT_CLASSES:
        raise ValueError(f"privacy.accountant must be one of {ACCOUNTANTS}, got {name!r}")
    return ACCOUNTANT_CLASSES[name](eps_error=eps_error)


def _private(history) -> list[tuple[float, float, int]]:
    """The steps that cost something (``z == inf``: nothing private released)."""
    return [(float(z), float(q), int(n)) for z, q, n in history if n > 0 and math.isfinite(z)]


def epsilon_for(
    history: list[tuple[float, float, int]],
    delta: float,
    accountant: str = "rdp",
    eps_error: float = 0.01,
) -> float:
    """Epsilon of a composition ``[(z, q, steps), ...]`` at ``delta``.

    Steps with ``z == inf`` (nothing private released) cost nothing.
    """
    method = accountant_for(accountant, eps_error)
    hist = _private(history)
    return method.epsilon(hist, delta) if hist else 0.0


def calibrate_noise(
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    tolerance: float = 0.01,
) -> float:
    """Smallest noise multiplier z with eps(z, q, steps) <= epsilon (Opacus' search)."""
    if steps <= 0:
        raise ValueError("cannot calibrate noise for 0 steps")
    return accountant_for(accountant).calibrate(epsilon, delta, sample_rate, steps, tolerance)


@dataclass(frozen=True)
class PrivacyPlan:
    """The noise multiplier of every step: phases ``(z, q, steps)`` in order.

    Made by :func:`calibrate_plan` from a mechanism's schedule; the trainer charges
    step t the multiplier :meth:`multiplier_at` and refuses a step whose noise
    records show less.
    """

    phases: tuple[tuple[float, float, int], ...]

    @property
    def total_steps(self) -> int:
        return sum(n for _, _, n in self.phases)

    def multiplier_at(self, step: int) -> float:
        end = 0
        for z, _, n in self.phases:
            end += n
            if step < end:
                return z
        return self.phases[-1][0]  # past the plan (budget permitting): the last phase's z

    def history(self) -> list[tuple[float, float, int]]:
        return [tuple(p) for p in self.phases]

    def rdp(self) -> np.ndarray:
        """The RDP curve over ``DEFAULT_ORDERS`` of every planned step: what a run charged
        its plan spends at most, known before it starts."""
        return sum(
            (planned_rdp(z, q, n) for z, q, n in _private(self.phases)),
            np.zeros(len(DEFAULT_ORDERS)),
        )


def _schedule_history(z: float, q: float, phases) -> list[tuple[float, float, int]]:
    return [(p.scale * z, q, p.steps) for p in phases if p.steps > 0]


def calibrate_plan(
    epsilon: float,
    delta: float,
    sample_rate: float,
    phases,
    accountant: str = "rdp",
    tolerance: float = 0.01,
) -> tuple[float, PrivacyPlan]:
    """Smallest base multiplier z whose schedule ``[(scale_j z, q, steps_j)]`` spends <= epsilon.

    ``phases`` are objects with ``steps`` and ``scale`` (:class:`dpsub.mechanisms.Phase`).
    A single phase of scale 1 is Opacus' ``get_noise_multiplier`` exactly; otherwise the
    same search (:func:`search_multiplier`) runs over the whole composition.
    """
    phases = [p for p in phases if p.steps > 0]
    if not phases:
        raise ValueError("cannot calibrate noise for 0 steps")
    if len(phases) == 1 and phases[0].scale == 1.0:
        z = calibrate_noise(epsilon, delta, sample_rate, phases[0].steps, accountant, tolerance)
        return z, PrivacyPlan(tuple(_schedule_history(z, sample_rate, phases)))

    def eps(z: float) -> float:
        return epsilon_for(_schedule_history(z, sample_rate, phases), delta, accountant)

    z = search_multiplier(eps, epsilon, tolerance)
    return z, PrivacyPlan(tuple(_schedule_history(z, sample_rate, phases)))


def fixed_plan(z: float, sample_rate: float, phases) -> PrivacyPlan:
    """The plan of a fixed base multiplier (``privacy.noise_multiplier``)."""
    return PrivacyPlan(tuple(_schedule_history(z, sample_rate, phases)))


_RDP_CACHE: dict[tuple[float, float], np.ndarray] = {}


def _rdp_curve(z: float, q: float) -> np.ndarray:
    key = (z, q)
    if key not in _RDP_CACHE:
        _RDP_CACHE[key] = np.asarray(
            _rdp_analysis().compute_rdp(
                q=q, noise_multiplier=z, steps=1, orders=list(DEFAULT_ORDERS)
            ),
            dtype=np.float64,
        )
    return _RDP_CACHE[key]


def planned_rdp(noise_multiplier: float, sample_rate: float, steps: int) -> np.ndarray:
    """The RDP curve (over ``DEFAULT_ORDERS``) of ``steps`` Poisson-subsampled Gaussian
    steps: what a run at this plan spends, known before it starts."""
    return _rdp_curve(float(noise_multiplier), float(sample_rate)) * int(steps)


def _rdp_to_eps(rdp: np.ndarray, delta: float, orders=DEFAULT_ORDERS) -> float:
    if not np.any(rdp):
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, _ = _rdp_analysis().get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


def rdp_to_epsilon(rdp, delta: float, orders=DEFAULT_ORDERS) -> float:
    """(eps, delta) of an RDP curve over ``orders``: the conversion every ledger uses."""
    return _rdp_to_eps(np.asarray(rdp, dtype=np.float64), delta, orders)


@dataclass
class PrivacyLedger:
    """Composes the per-step cost of a training run and enforces its budget.

    Args:
        delta: target delta.
        accountant: ``"rdp"`` or ``"prv"``.
        budget: target epsilon; :meth:`can_step` refuses a step that would exceed it.
        plan: the :class:`PrivacyPlan` the run follows; with ``prv`` a step that keeps the
            history a prefix of this plan is answered without a PRV query, from how many of
            the plan's steps fit the budget (found once).
    """

    delta: float
    accountant: str = "rdp"
    budget: float = math.inf
    plan: PrivacyPlan | None = None
    eps_error: float = 0.01
    history: list[tuple[float, float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.method = accountant_for(self.accountant, self.eps_error)  # ValueError if unknown
        self._rdp = np.zeros(len(DEFAULT_ORDERS))
        self._cache: tuple[int, float] | None = None  # (steps, PRV epsilon)
        self._rdp_eps: tuple[int, float] | None = None  # (steps, RDP epsilon)
        self._pending: tuple[tuple[float, float], float] | None = None  # can_step's answer
        self._fits: int | None = None  # _plan_steps_within_budget
        for z, q, n in self.history:
            if math.isfinite(z):
                self._rdp += _rdp_curve(z, q) * n

    # ------------------------------------------------------------------ steps
    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self.history)

    def step(self, noise_multiplier: float, sample_rate: float) -> None:
        """Record one step of a Poisson-subsampled Gaussian mechanism."""
        z, q = float(noise_multiplier), float(sample_rate)
        if not (z > 0):
            raise ValueError(f"effective noise multiplier must be > 0, got {z}")
        if self.history and self.history[-1][:2] == (z, q):
            self.history[-1] = (z, q, self.history[-1][2] + 1)
        else:
            self.history.append((z, q, 1))
        if math.isfinite(z):
            self._rdp += _rdp_curve(z, q)
        self._cache = None
        # can_step already computed the RDP epsilon after this very step: reuse it
        pending, self._pending = self._pending, None
        self._rdp_eps = (self.steps, pending[1]) if pending and pending[0] == (z, q) else None

    def can_step(self, noise_multiplier: float, sample_rate: float) -> bool:
        """Would one more step with (z, q) keep epsilon within the budget?"""
        z, q = float(noise_multiplier), float(sample_rate)
        if not math.isfinite(self.budget) or not math.isfinite(z):
            return True
        if self.method.rdp_exact:  # the running RDP curve answers exactly
            eps = _rdp_to_eps(self._rdp + _rdp_curve(z, q), self.delta)
            self._pending = ((z, q), eps)
            return eps <= self.budget + 1e-9
        # another accountant (slow): on the plan the answer is known (how many of its steps
        # fit the budget was found once); off the plan, ask it
        if self.plan is not None and _is_prefix(self.history + [(z, q, 1)], self.plan.phases):
            return self.steps + 1 <= self._plan_steps_within_budget()
        hist = _private(list(self.history) + [(z, q, 1)])
        return self.method.epsilon(hist, self.delta) <= self.budget + 1e-9

    def _plan_steps_within_budget(self) -> int:
        """How many first steps of the plan fit the budget, found once with the ledger's
        accountant: all of a calibrated plan (one query); of a fixed one
        (``privacy.noise_multiplier``, never calibrated to the budget) maybe fewer, or none."""
        if self._fits is None:
            self._fits = _steps_within(self.plan.phases, self.budget, self.delta, self.method)
        return self._fits

    # ---------------------------------------------------------------- queries
    def rdp(self) -> np.ndarray:
        """The RDP curve of the steps so far, over ``DEFAULT_ORDERS`` (a copy)."""
        return self._rdp.copy()

    def epsilon(self, exact: bool = True) -> float:
        """Epsilon spent so far (cached per step count): with the ledger's accountant, or
        with ``exact=False`` the running RDP estimate (microseconds; the same number
        when the accountant is RDP)."""
        if not exact or self.method.rdp_exact:
            if self._rdp_eps is None or self._rdp_eps[0] != self.steps:
                self._rdp_eps = (self.steps, _rdp_to_eps(self._rdp, self.delta))
            return self._rdp_eps[1]
        if self._cache is not None and self._cache[0] == self.steps:
            return self._cache[1]
        hist = _private(self.history)
        eps = self.method.epsilon(hist, self.delta) if hist else 0.0
        self._cache = (self.steps, eps)
        return eps

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict:
        return {
            "delta": self.delta,
            "accountant": self.accountant,
            "budget": self.budget,
            "plan": None if self.plan is None else [list(p) for p in self.plan.phases],
            "eps_error": self.eps_error,
            "history": [list(h) for h in self.history],
        }

    def save(self, path: Path, sync: bool = False) -> None:
        """Write the ledger atomically (``sync``: durably: fsync the file, rename it, fsync
        the directory; a crash or power loss cannot lose it or bring back an older one)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.state_dict(), f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync:
            fsync_dir(path.parent)

    @classmethod
    def load(cls, path: Path) -> PrivacyLedger:
        return cls.from_state_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_state_dict(cls, state: dict) -> PrivacyLedger:
        plan = state.get("plan")
        return cls(
            delta=state["delta"],
            accountant=state["accountant"],
            budget=state["budget"],
            plan=None
            if plan is None
            else PrivacyPlan(tuple((float(z), float(q), int(n)) for z, q, n in plan)),
            eps_error=state.get("eps_error", 0.01),
            history=[(float(z), float(q), int(n)) for z, q, n in state["history"]],
        )


def fsync_dir(directory: Path) -> None:
    """fsync a directory, making a rename inside it durable (POSIX; skipped where a
    directory cannot be opened or synced, e.g. on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cut(phases, steps: int) -> list[tuple[float, float, int]]:
    """The first ``steps`` steps of ``phases``."""
    out = []
    for z, q, n in phases:
        if steps <= 0:
            break
        out.append((z, q, min(n, steps)))
        steps -= n
    return out


def _steps_within(phases, budget: float, delta: float, method) -> int:
    """The most first steps of ``phases`` whose epsilon (``method``) is at most ``budget``."""

    def fits(steps: int) -> bool:
        hist = _private(_cut(phases, steps))
        return not hist or method.epsilon(hist, delta) <= budget + 1e-9

    low, high = 0, sum(n for _, _, n in phases)
    if fits(high):
        return high
    while high - low > 1:  # fits(low), not fits(high): epsilon grows with the steps
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _is_prefix(history, phases) -> bool:
    """Is the step sequence of ``history`` a prefix of that of ``phases``? (both compressed)"""
    left = [list(p) for p in phases]
    j = 0
    for z, q, n in history:
        while n > 0:
            if j >= len(left) or (left[j][0], left[j][1]) != (z, q):
                return False
            take = min(n, left[j][2])
            n -= take
            left[j][2] -= take
            if left[j][2] == 0:
                j += 1
    return True
