"""Privacy: mechanisms (`dp_sgd`, `selection`, `d_privacy`, `user_level`) apart from accounting
(`accounting`, on dp_accounting's RDP accountant and `rdp_curves`, its subsampled
Gaussians vectorized), one `ledger` per protected unit, and
the `protocol` (neighbouring relation, what is public) a guarantee is about.

Names are imported on first use (PEP 562), so that `tff_silo.privacy.protocol` and
`accounting` load without TensorFlow (a benchmark binary checks its flags with them
before importing TF)."""

import importlib

_EXPORTS = {
    "NEIGHBOURING": "accounting", "calibrate_noise_multiplier": "accounting",
    "calibrate_noise_multipliers": "accounting", "silo_setting": "accounting",
    "dp_sgd_event": "accounting", "epsilon_spent": "accounting",
    "selection_event": "accounting", "silo_event": "accounting",
    "PrivacyLedger": "ledger", "PAPER": "protocol", "PrivacyProtocol": "protocol",
    "euclidean_laplace_noise": "d_privacy", "sanitize_update": "d_privacy",
    "report_noisy_min": "selection", "UserDPSettings": "user_level",
    "UserLevelDPMeanFactory": "user_level_factory",
    "UserLevelMean": "user_level", "noise_stddev": "user_level",
    "user_weights": "user_level",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
