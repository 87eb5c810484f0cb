"""Ditto (Li et al. 2021), as benchmarked in thesis app. B.3: each round a silo runs
one epoch of FedAvg's client work on the global model (whose update is aggregated)
and one epoch on its personal model regularized towards the (old) global model with
strength lam.

Privacy: the silo's data is queried for two epochs per round, so its DP-SGD
calibration covers twice the steps of MR-MTL at the same budget (thesis Fig. 1.4).
"""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import make_config
from tff_silo.algorithms.rounds import SiloAlgorithm, silo_algorithm

DEFAULT_LAMBDA = 1.0


def ditto_algorithm(model, feature_shape, *, client_learning_rate: float,
                    batch_size: int, lam: float = DEFAULT_LAMBDA, local_epochs: int = 1,
                    l2_norm_clip: Optional[float] = None, sampling: str = "poisson",
                    aggregator=None, init_seed: int = 0) -> SiloAlgorithm:
  config = make_config(client_learning_rate, batch_size, local_epochs,
                       l2_norm_clip, sampling)
  return silo_algorithm(model, feature_shape, config, name="ditto", lam=lam,
                        ditto=True, aggregator=aggregator, init_seed=init_seed)
