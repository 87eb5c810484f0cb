"""Local finetuning (thesis app. B.3): FedAvg for the first `fedavg_fraction` of the
rounds, then every silo trains its copy of the global model locally.

Privacy: every round is one DP-SGD epoch on the silo's data, as for FedAvg and local
training, so the total number of steps and the cost are the same.
"""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import make_config
from tff_silo.algorithms.rounds import SiloAlgorithm, silo_algorithm

DEFAULT_FEDAVG_FRACTION = 0.5


def fedavg_rounds(total_rounds: int, fedavg_fraction: float) -> int:
  if not 0.0 <= fedavg_fraction <= 1.0:
    raise ValueError(f"fedavg_fraction must be in [0, 1], got {fedavg_fraction}")
  if int(total_rounds) != total_rounds or total_rounds < 1:
    raise ValueError(f"total_rounds must be a positive integer, got {total_rounds}")
  return int(total_rounds * fedavg_fraction)


def finetune_algorithm(model, feature_shape, *, total_rounds: int,
                       client_learning_rate: float, batch_size: int,
                       fedavg_fraction: float = DEFAULT_FEDAVG_FRACTION,
                       local_epochs: int = 1, l2_norm_clip: Optional[float] = None,
                       sampling: str = "poisson", aggregator=None,
                       init_seed: int = 0) -> SiloAlgorithm:
  """Rounds 0 .. R-1 are FedAvg (R = floor(fraction * total)); from round R on, silos
  start from the global model once and then keep training their own copy."""
  switch = fedavg_rounds(total_rounds, fedavg_fraction)
  config = make_config(client_learning_rate, batch_size, local_epochs,
                       l2_norm_clip, sampling)
  return silo_algorithm(model, feature_shape, config, name="finetune", lam=0.0,
                        start="switch", switch_round=switch,
                        global_update_rounds=switch, personal_from_round=switch,
                        aggregator=aggregator, init_seed=init_seed)
