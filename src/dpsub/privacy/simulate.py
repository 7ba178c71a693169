"""Noise-matched simulation: a run at batch b with the per-step noise of a reference batch.

**Not a privacy guarantee.** A run at expected batch ``b`` can be given the noise that a
*reference* run at batch ``B_ref`` would draw on its mean gradient: the noisy sum is
divided by the expected batch, so the noise std on the mean is ``z C / b`` for a run and
``z_ref C / B_ref`` for the reference; they are equal when

    z_run = z_ref * b / B_ref.

At a fixed number of steps and a fixed per-step noise on the mean, accuracy barely depends
on the batch (Sander et al., "TAN without a burn", ICML 2023), so a small batch simulates
a large one at a fraction of its cost. ``z_ref`` is either given or calibrated for the
reference's own (epsilon, delta, q_ref = B_ref / N_ref, steps). The run's own epsilon, from
the noise it actually draws (``z_run`` at its own ``q = b / N``), is far larger than the
reference's and is what the ledger records; the reference's epsilon only names the noise
level. A simulated run is therefore marked ``covered_by_epsilon: false``
(``not_covered: simulated_noise``) and its budget is not enforced (it would stop the run
within its first steps). Configured by ``privacy.simulate.*`` (docs/privacy.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from dpsub.errors import ConfigError
from dpsub.privacy.accountants import calibrate_plan, epsilon_for, fixed_plan

__all__ = ["NOT_A_GUARANTEE", "Simulation", "reference", "run_multiplier"]

NOT_A_GUARANTEE = "simulated noise level, not a privacy guarantee"


def run_multiplier(z_ref: float, batch_size: int, reference_batch_size: int) -> float:
    """The run's multiplier whose noise std on the mean gradient is the reference's."""
    return float(z_ref) * int(batch_size) / int(reference_batch_size)


@dataclass(frozen=True)
class Simulation:
    """The reference a simulated run matches, and the multiplier the run draws."""

    batch_size: int  # B_ref
    noise_multiplier_ref: float  # z_ref
    epsilon_ref: float  # what the reference spends (its target when z_ref was calibrated)
    delta_ref: float
    dataset_size_ref: int  # N_ref
    steps_ref: int
    calibrated: bool  # z_ref calibrated for epsilon_ref (else given)
    run_batch_size: int  # b

    @property
    def sample_rate_ref(self) -> float:
        return self.batch_size / self.dataset_size_ref

    @property
    def noise_multiplier(self) -> float:
        """z_run, the multiplier the run draws and is charged."""
        return run_multiplier(self.noise_multiplier_ref, self.run_batch_size, self.batch_size)

    def as_dict(self) -> dict:
        """``summary.json``'s ``simulated`` entry."""
        return {
            **asdict(self),
            "sample_rate_ref": self.sample_rate_ref,
            "noise_multiplier_run": self.noise_multiplier,
            "what": NOT_A_GUARANTEE,
        }

    def describe(self) -> str:
        how = "calibrated for" if self.calibrated else "given; it spends"
        return (
            f"SIMULATED ({NOT_A_GUARANTEE}): batch {self.run_batch_size} at noise multiplier "
            f"{self.noise_multiplier:.4g} draws the mean-gradient noise of batch "
            f"{self.batch_size} at z_ref {self.noise_multiplier_ref:.4g} ({how} epsilon "
            f"{self.epsilon_ref:.4g}, delta {self.delta_ref:g}, N {self.dataset_size_ref}, "
            f"{self.steps_ref} steps)"
        )


def reference(
    opts,
    *,
    batch_size: int,
    n: int,
    steps: int,
    phases_of: Callable[[int], Sequence],
    epsilon: float,
    delta: float,
    accountant: str,
) -> Simulation | None:
    """The simulation ``opts`` (``privacy.simulate``) asks for, or None.

    ``batch_size``, ``n``, ``steps``: the run's; ``epsilon``, ``delta``: the run's privacy
    settings, the reference's unless ``opts`` gives its own; ``phases_of(steps)``: the
    mechanism's privacy schedule over that many steps. Raises ConfigError when the
    reference batch exceeds its dataset.
    """
    if opts is None or opts.batch_size is None:
        return None
    n_ref = int(opts.dataset_size or n)
    steps_ref = int(opts.steps or steps)
    b_ref = int(opts.batch_size)
    if b_ref > n_ref:
        raise ConfigError(
            f"privacy.simulate.batch_size: {b_ref} exceeds the reference's dataset "
            f"({n_ref} examples; privacy.simulate.dataset_size)"
        )
    delta_ref = float(opts.delta or delta)
    q_ref, phases = b_ref / n_ref, phases_of(steps_ref)
    if opts.noise_multiplier is not None:
        z_ref = float(opts.noise_multiplier)
        eps_ref = epsilon_for(fixed_plan(z_ref, q_ref, phases).history(), delta_ref, accountant)
    else:
        eps_ref = float(opts.epsilon or epsilon)
        if not math.isfinite(eps_ref):
            raise ConfigError("privacy.simulate.epsilon: the reference needs a finite epsilon")
        z_ref, _ = calibrate_plan(eps_ref, delta_ref, q_ref, phases, accountant)
    return Simulation(
        b_ref, z_ref, eps_ref, delta_ref, n_ref, steps_ref, opts.noise_multiplier is None,
        int(batch_size),
    )  # fmt: skip
