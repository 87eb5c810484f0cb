"""Privacy: mechanisms (`dp_sgd`, `selection`, `d_privacy`, `user_level`) apart from accounting
(`accounting`, on dp_accounting's RDP accountant)."""

from tff_silo.privacy.accounting import (
    calibrate_noise_multiplier, dp_sgd_event, epsilon_spent, selection_event, silo_event)
from tff_silo.privacy.d_privacy import euclidean_laplace_noise, sanitize_update
from tff_silo.privacy.selection import report_noisy_min
from tff_silo.privacy.user_level import (
    UserDPSettings, UserLevelDPMeanFactory, noise_stddev, user_weights)
