"""Privacy: noise records (the privatizer), sampling, calibration, the plan, the ledger and
the account that holds them for a run (:class:`~dpsub.privacy.run_account.PrivacyAccount`)."""

from dpsub.privacy.accountants import (
    ACCOUNTANT_CLASSES,
    ACCOUNTANTS,
    Accountant,
    PrivacyLedger,
    PrivacyPlan,
    PRVAccountant,
    RDPAccountant,
    accountant_for,
    calibrate_noise,
    calibrate_plan,
    epsilon_for,
    fixed_plan,
)
from dpsub.privacy.noise import (
    NoiseBlock,
    NoiseRecord,
    Privatizer,
    SecureNoise,
    SeededNoise,
    Sensitive,
    effective_multiplier,
    noise_std,
)
from dpsub.privacy.run_account import PrivacyAccount  # noqa: E402  (after its parts)

__all__ = [
    "PrivacyAccount",
    "ACCOUNTANTS",
    "ACCOUNTANT_CLASSES",
    "Accountant",
    "PRVAccountant",
    "RDPAccountant",
    "accountant_for",
    "NoiseBlock",
    "NoiseRecord",
    "PrivacyLedger",
    "PrivacyPlan",
    "Privatizer",
    "SecureNoise",
    "SeededNoise",
    "Sensitive",
    "calibrate_noise",
    "calibrate_plan",
    "effective_multiplier",
    "epsilon_for",
    "fixed_plan",
    "noise_std",
]
