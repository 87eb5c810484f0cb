"""Privacy: mechanisms (DP-SGD in `dp_sgd`) and accounting (`accounting`)."""

from tff_silo.privacy.accounting import (
    calibrate_noise_multiplier, dp_sgd_event, epsilon_spent, selection_event, silo_event)
