"""MR-MTL: mean-regularized multi-task learning with stateful clients.

Thesis app. C.1, Algorithm 1 (Smith et al. 2017; Liu et al., NeurIPS'22): silo k keeps
w_k across rounds and minimizes loss + (lam / 2) ||w_k - w_bar||^2 with (DP-)SGD; the
server sets w_bar += weighted mean of Delta_k. lam = 0 is local training, lam -> inf
approaches FedAvg.

Privacy: each silo runs DP-SGD with its own noise multiplier (silo-specific
example-level DP, thesis Def. 1.3.1); w_bar is post-processing of DP outputs, so the
regularization costs no privacy beyond local training. The server mean is weighted by
each silo's public size (`tff_silo.privacy.protocol`): n_k under replace-one or with
sizes declared public, equal weights when sizes are private (add/remove-one).
"""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import make_config
from tff_silo.algorithms.rounds import SiloAlgorithm, silo_algorithm

DEFAULT_LAMBDA = 1.0


def mrmtl_algorithm(model, feature_shape, *, client_learning_rate: float,
                    batch_size: int, lam: float = DEFAULT_LAMBDA, local_epochs: int = 1,
                    l2_norm_clip: Optional[float] = None, sampling: str = "poisson",
                    aggregator=None, init_seed: int = 0) -> SiloAlgorithm:
  """MR-MTL; DP-SGD in every silo when `l2_norm_clip` is set."""
  config = make_config(client_learning_rate, batch_size, local_epochs,
                       l2_norm_clip, sampling)
  return silo_algorithm(model, feature_shape, config, name="mrmtl", lam=lam,
                        start="personal", aggregator=aggregator, init_seed=init_seed)
