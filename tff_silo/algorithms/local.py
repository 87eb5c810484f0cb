"""Local training: every silo trains its own model alone (MR-MTL with lam = 0).

The endpoint of the personalization spectrum with no federation (thesis sec. 1.5).
Privacy: one DP-SGD run per silo; same cost as FedAvg and MR-MTL.
"""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import make_config
from tff_silo.algorithms.rounds import SiloAlgorithm, silo_algorithm


def local_algorithm(model, feature_shape, *, client_learning_rate: float,
                    batch_size: int, local_epochs: int = 1,
                    l2_norm_clip: Optional[float] = None, sampling: str = "poisson",
                    aggregator=None, init_seed: int = 0) -> SiloAlgorithm:
  config = make_config(client_learning_rate, batch_size, local_epochs,
                       l2_norm_clip, sampling)
  return silo_algorithm(model, feature_shape, config, name="local", lam=0.0,
                        start="personal", aggregator=aggregator, init_seed=init_seed)
