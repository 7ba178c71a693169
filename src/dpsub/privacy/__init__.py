"""Privacy: noise records (the privatizer), calibration, the privacy plan and the ledger."""

from dpsub.privacy.accountant import (
    ACCOUNTANTS,
    PrivacyLedger,
    PrivacyPlan,
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

__all__ = [
    "ACCOUNTANTS",
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
