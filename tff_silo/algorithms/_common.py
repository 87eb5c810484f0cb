"""Argument handling shared by the `build_<algo>_process` functions."""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import LocalTrainingConfig


def make_config(client_learning_rate: float, batch_size: int, local_epochs: int,
                l2_norm_clip: Optional[float], sampling: str) -> LocalTrainingConfig:
  return LocalTrainingConfig(learning_rate=client_learning_rate, batch_size=batch_size,
                             epochs=local_epochs, l2_norm_clip=l2_norm_clip,
                             sampling=sampling)
