"""Argument handling shared by the `<algo>_algorithm` functions, and their TFF
processes."""

from __future__ import annotations

from typing import Optional

from tff_silo.algorithms.local_training import LocalTrainingConfig


def make_config(client_learning_rate: float, batch_size: int, local_epochs: int,
                l2_norm_clip: Optional[float], sampling: str) -> LocalTrainingConfig:
  return LocalTrainingConfig(learning_rate=client_learning_rate, batch_size=batch_size,
                             epochs=local_epochs, l2_norm_clip=l2_norm_clip,
                             sampling=sampling)


def tff_process_of(algorithm_fn):
  """`build_<algo>_process`: the TFF process (`process.process_for`) of what
  `algorithm_fn` defines; TFF is imported only when it is called."""
  def build(model, feature_shape, **kwargs):
    from tff_silo.algorithms import process  # pylint: disable=g-import-not-at-top
    return process.process_for(algorithm_fn(model, feature_shape, **kwargs))
  build.__name__ = "build_" + algorithm_fn.__name__.replace("_algorithm", "_process")
  build.__doc__ = (f"The TFF process of `{algorithm_fn.__name__}(model, feature_shape, "
                   "**kwargs)`.")
  return build
