"""Privacy accounting: calibration of the noise multiplier and the per-run ledger."""

from dpsub.privacy.accountant import (
    ACCOUNTANTS,
    PrivacyLedger,
    calibrate_noise,
    epsilon_for,
)

__all__ = ["ACCOUNTANTS", "PrivacyLedger", "calibrate_noise", "epsilon_for"]
