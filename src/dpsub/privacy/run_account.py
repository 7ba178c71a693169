"""The privacy account of a run: everything its epsilon rests on, in one object.

:class:`PrivacyAccount` holds the sampler (which examples a step sees: Poisson with rate
``q = B / N`` by default), the plan (the multiplier each step is charged, calibrated
over the mechanism's schedule), the honest ledger (what the noise drawn gives), the
nominal ledger (the planned multipliers, for mechanisms whose noise is measured) and
the accounting *policy* of the mechanism:

* ``planned`` (the default): a step is admitted only if the ledger affords the planned
  multiplier z, and charged z; a release whose noise records give less is refused
  (:class:`~dpsub.errors.PrivacyError`).
* ``measured``: charged the multiplier its records give (noise shaped by the weights,
  DP-Hero); the budget is enforced on that honest epsilon, the nominal one is logged.
* ``nominal``: as ``measured``, but the budget is enforced on the nominal epsilon (to
  reproduce a paper); the run is then not covered by its epsilon.

It takes numbers and noise records, never a training run; the training loop asks it
:meth:`~PrivacyAccount.admit` before a step and :meth:`~PrivacyAccount.charge` after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpsub.errors import ConfigError, PrivacyError
from dpsub.privacy.accountants import PrivacyLedger, PrivacyPlan, calibrate_plan, fixed_plan
from dpsub.privacy.noise import NoiseRecord, effective_multiplier
from dpsub.privacy.sampling import PoissonSampler, ShuffleSampler, build_sampler, sample_rate
from dpsub.privacy.simulate import Simulation

__all__ = ["POLICIES", "REL_TOL", "PrivacyAccount"]

from dpsub.choices import POLICIES  # noqa: E402  (Mechanism.accounting)

#: Relative slack when comparing the records' multiplier with the plan (float rounding).
REL_TOL = 1e-9


@dataclass
class PrivacyAccount:
    """Sampler, plan, honest and nominal ledgers and policy of one run (see the module doc).

    ``z`` is the calibrated base multiplier (``inf``: a non-private mechanism, which has
    no plan and no ledger); ``q = batch_size / n``.
    """

    policy: str
    n: int  # N: private training examples
    batch_size: int  # B: the expected batch size (every noisy sum is divided by it)
    q: float
    z: float
    plan: PrivacyPlan | None
    ledger: PrivacyLedger | None  # what the run is charged (honest)
    nominal: PrivacyLedger | None  # measured / nominal policies: the planned multipliers
    sampler: PoissonSampler | ShuffleSampler | None = None
    #: a noise-matched simulation (NOT a guarantee): z is its z_run, no budget is enforced
    simulation: Simulation | None = None

    @classmethod
    def open(
        cls,
        *,
        n: int,
        batch_size: int,
        steps: int,
        phases: Sequence | None,
        policy: str = "planned",
        epsilon: float = math.inf,
        delta: float = 1e-5,
        accountant: str = "rdp",
        noise_multiplier: float | None = None,
        sampling: str = "poisson",
        uniform=None,
        device=None,
        simulation: Simulation | None = None,
    ) -> PrivacyAccount:
        """The account of a run of ``steps`` steps over ``n`` examples.

        ``phases``: the mechanism's privacy schedule (None: a non-private mechanism).
        The base multiplier is ``noise_multiplier`` if given, else calibrated to spend
        ``epsilon`` at ``delta``. ``uniform`` (n -> uniforms in [0, 1)) drives the sampler.
        ``simulation``: the run draws (and is charged) its ``z_run`` instead, with no budget:
        its own epsilon is recorded, the reference's is not a guarantee.
        """
        if policy not in POLICIES:
            raise ValueError(f"accounting must be one of {POLICIES}, got {policy!r}")
        q = sample_rate(batch_size, n)
        sampler = (
            None if uniform is None else build_sampler(sampling, n, batch_size, uniform, device)
        )
        if phases is None:
            return cls(policy, n, batch_size, q, math.inf, None, None, None, sampler)
        if simulation is not None:  # the noise drawn is z_run; privacy.epsilon is the reference's
            if policy != "planned":
                raise ConfigError(
                    f"privacy.simulate.batch_size: a mechanism with {policy} accounting "
                    "cannot simulate a noise level (only one charged its planned multiplier)"
                )
            noise_multiplier, epsilon = simulation.noise_multiplier, math.inf
        if noise_multiplier is not None:
            z, plan = float(noise_multiplier), fixed_plan(float(noise_multiplier), q, phases)
        else:
            z, plan = calibrate_plan(epsilon, delta, q, phases, accountant)
        honest_budget = math.inf if policy == "nominal" else epsilon
        ledger = PrivacyLedger(delta, accountant, honest_budget, plan)
        nominal = None
        if policy != "planned":
            nominal_budget = epsilon if policy == "nominal" else math.inf
            nominal = PrivacyLedger(delta, accountant, nominal_budget, plan)
        return cls(policy, n, batch_size, q, z, plan, ledger, nominal, sampler, simulation)

    # ----------------------------------------------------------------- policy
    @property
    def private(self) -> bool:
        return self.plan is not None

    @property
    def charges_plan(self) -> bool:
        """A step is charged the plan's multiplier (planned policy), not its records'."""
        return self.policy == "planned"

    @property
    def covered_by_epsilon(self) -> bool:
        """False when the budget is enforced on the nominal epsilon (no guarantee)."""
        return self.policy != "nominal"

    @property
    def budget_ledger(self) -> PrivacyLedger | None:
        """The ledger the budget is enforced on."""
        return self.nominal if self.policy == "nominal" else self.ledger

    def multiplier(self, step: int) -> float:
        """The multiplier the plan charges at ``step`` (inf: non-private)."""
        return self.plan.multiplier_at(step) if self.plan is not None else math.inf

    # ------------------------------------------------------------------ steps
    def admit(self, step: int) -> bool:
        """Whether ``step`` may run: with the planned policy, the budget affords its z."""
        if not self.private or not self.charges_plan:
            return True
        return self.ledger.can_step(self.multiplier(step), self.q)

    def charge(
        self, records: Sequence[NoiseRecord], z: float, who: str = "a release"
    ) -> float | None:
        """Charge one step whose releases left ``records``; the plan's multiplier was ``z``.

        Returns the multiplier charged (``inf`` for a non-private step), or None when
        the budget refuses the step (measured / nominal policies: nothing charged).
        Raises :class:`~dpsub.errors.PrivacyError` for a release without noise records
        or with less noise than the policy allows. ``who`` names the step in messages.
        """
        if not self.private:
            return math.inf
        if not records:
            raise PrivacyError(
                f"{who}: released a gradient without drawing noise through ctx.noise"
            )
        z_rec = effective_multiplier(records)
        if self.charges_plan:
            charged = self._planned(z, z_rec, who)
        else:
            if not z_rec > 0:
                raise PrivacyError(f"{who}: some direction of the release got no noise")
            z_budget = z if self.policy == "nominal" else z_rec
            if not self.budget_ledger.can_step(z_budget, self.q):
                return None
            charged = z_rec
        self.ledger.step(charged, self.q)
        if self.nominal is not None:
            self.nominal.step(z, self.q)
        return charged

    @staticmethod
    def _planned(z: float, z_rec: float, who: str) -> float:
        if not z_rec >= z * (1 - REL_TOL):
            raise PrivacyError(
                f"{who}: the noise drawn gives multiplier {z_rec:.6g}, less than the "
                f"{z:.6g} the privacy plan charges; nothing was released"
            )
        return z

    # ---------------------------------------------------------------- queries
    def epsilons(self, exact: bool = True) -> dict[str, float]:
        """Epsilon spent (honest) and, with a nominal ledger, the nominal one.

        ``exact``: with the configured accountant (PRV is slow: evaluations only); else
        RDP, under ``epsilon_rdp`` when the accountant is another.
        """
        if self.ledger is None:
            return {"epsilon": math.inf}
        key = "epsilon" if exact or self.ledger.method.rdp_exact else "epsilon_rdp"
        out = {key: self.ledger.epsilon(exact)}
        if self.nominal is not None:
            out[key.replace("epsilon", "epsilon_nominal")] = self.nominal.epsilon(exact)
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
            "nominal": None if self.nominal is None else self.nominal.state_dict(),
            "sampler": None if self.sampler is None else self.sampler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("ledger") is not None:
            self.ledger = PrivacyLedger.from_state_dict(state["ledger"])
        if state.get("nominal") is not None:
            self.nominal = PrivacyLedger.from_state_dict(state["nominal"])
        if self.sampler is not None and state.get("sampler") is not None:
            self.sampler.load_state_dict(state["sampler"])
