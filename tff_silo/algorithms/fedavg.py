"""FedAvg (McMahan et al. 2017): every round each silo starts from the global model,
trains locally, and the server adds the weighted mean of the updates. Every silo is
evaluated with the global model.

Privacy: under silo-specific example-level DP each silo runs DP-SGD on its own data;
the global model is post-processing, so the cost equals local training's (thesis
sec. 1.3).
"""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import make_config
from tff_silo.algorithms.rounds import SiloAlgorithm, silo_algorithm


def fedavg_algorithm(model, feature_shape, *, client_learning_rate: float,
                     batch_size: int, local_epochs: int = 1,
                     l2_norm_clip: Optional[float] = None, sampling: str = "poisson",
                     aggregator=None, init_seed: int = 0) -> SiloAlgorithm:
  config = make_config(client_learning_rate, batch_size, local_epochs,
                       l2_norm_clip, sampling)
  return silo_algorithm(model, feature_shape, config, name="fedavg", lam=0.0,
                        start="global", personal_from_round=None,
                        aggregator=aggregator, init_seed=init_seed)
