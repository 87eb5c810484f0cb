"""UDP-Alg's user-level DP weighted mean (`user_level.UserLevelMean`, eq. 3 and 4 of
Nemala et al., CIKM'23) as a `tff.aggregators` factory, for the TFF backend; the
same process unweighted over a fixed number of clients is `DPMeanFactory`, the
silo-level `dp_fixed` aggregator (`tff_silo.aggregators`)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.privacy import dp_sgd, integer_gaussian
from tff_silo.privacy.user_level import (
    UserDPSettings, UserLevelMean, flat_contributions, integer_mean, weighted_clipped_sum)


class UserLevelDPMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Clipped, weighted, noised mean of user contributions (`user_level.UserLevelMean`:
  its arguments, its noise keys). With noise, each client sends its contribution
  rounded to the integer grid (int64, the structure's tensors), the sum is exact
  and the server adds integer noise (`user_level.integer_mean`). Measurements:
  `sigma` (public)."""

  def __init__(self, *, l2_norm_clip: Optional[float], noise_multiplier: float,
               sampling_rate: float, total_weight: float, max_weight: float = 1.0,
               seed: Optional[int] = None):
    self.mean = UserLevelMean(
        l2_norm_clip, float(noise_multiplier), float(sampling_rate), float(total_weight),
        float(max_weight), None if seed is None else int(seed))

  @classmethod
  def of(cls, mean: UserLevelMean) -> "UserLevelDPMeanFactory":
    return cls(**dataclasses.asdict(mean))

  @classmethod
  def for_settings(cls, settings: UserDPSettings, num_examples: Sequence[int],
                   seed: Optional[int] = None) -> "UserLevelDPMeanFactory":
    """`settings.mean(num_examples, seed)` (UDP-Alg's settings for a population with
    these per-user example counts) as a factory."""
    return cls.of(settings.mean(num_examples, seed))

  @property
  def sigma(self) -> float:
    return self.mean.sigma

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    _check_values(value_type)
    if not (isinstance(weight_type, tff.TensorType) and weight_type.dtype == np.float32
            and weight_type.shape == ()):
      raise TypeError(f"weights must be float32 scalars, got {weight_type}")
    return _mean_process(self.mean, value_type, weight_type)


class DPMeanFactory(tff.aggregators.UnweightedAggregationFactory):
  """TFF's `DifferentiallyPrivateFactory.gaussian_fixed` on the integer mechanism:
  each client's update clipped to `clip`, summed, noise of std z clip added, divided
  by `clients_per_round` (`UserLevelMean` with q = 1, W = clients_per_round and
  every weight 1: the same rounding, integer sum and noise). Measurements: `sigma`
  (z clip / clients_per_round). `seed` None draws the noise root from OS entropy."""

  def __init__(self, *, noise_multiplier: float, clients_per_round: int, clip: float,
               seed: Optional[int] = None):
    self.mean = UserLevelMean(float(clip), float(noise_multiplier), 1.0,
                              float(clients_per_round), 1.0,
                              None if seed is None else int(seed))

  def create(self, value_type) -> tff.templates.AggregationProcess:
    _check_values(value_type)
    return _mean_process(self.mean, value_type)


def _check_values(value_type):
  if not tff.types.is_structure_of_floats(value_type):
    raise TypeError(f"values must be a structure of float tensors, got {value_type}")


def _mean_process(mean: UserLevelMean, value_type, weight_type=None):
  """The process of `mean` (eq. 3 and 4, integer noise when z > 0) over the clients'
  values, weighted by float32 scalars of `weight_type`, or each by 1 without it."""
  root = keys.root_key(mean.seed)
  integer = mean.noise_multiplier > 0   # clients round, the server adds the noise
  weighted = weight_type is not None

  @tff.tensorflow.computation
  def initial_round():
    return tf.constant(0, tf.int32)

  def contribution(value, weight):
    tensors = [t[None] for t in tf.nest.flatten(value)]
    if not integer:
      return tf.nest.pack_sequence_as(
          value, weighted_clipped_sum(tensors, weight[None], mean.l2_norm_clip))
    flat = flat_contributions(tensors, weight[None], mean.l2_norm_clip)
    grid, bound = mean.integer_grid(flat.shape[1])
    rounded = integer_gaussian.rounded(flat, grid, bound)[0]
    return tf.nest.pack_sequence_as(
        value, dp_sgd.split_flat(rounded, [t.shape[1:] for t in tensors]))

  if weighted:
    weigh = tff.tensorflow.computation(contribution, value_type, weight_type)
  else:
    weigh = tff.tensorflow.computation(
        lambda value: contribution(value, tf.constant(1.0)), value_type)

  @tff.tensorflow.computation(np.int32, weigh.type_signature.result)
  def release(round_num, total):
    parts = tf.nest.flatten(total)
    if integer:
      flat = dp_sgd.flat_examples([t[None] for t in parts])[0]
      grid, _ = mean.integer_grid(flat.shape[0])
      tensors = integer_mean(flat, grid, mean.normalizer, root, round_num, parts)
    else:
      tensors = [t / mean.normalizer for t in parts]
    return (tf.nest.pack_sequence_as(total, tensors), round_num + 1,
            tf.constant(mean.sigma, tf.float32))

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_round, tff.SERVER)

  def finish(state, contributions):
    total = tff.federated_sum(contributions)
    result, new_state, stddev = tff.federated_map(
        release, tff.federated_zip((state, total)))
    return tff.templates.MeasuredProcessOutput(
        state=new_state, result=result,
        measurements=tff.federated_zip(collections.OrderedDict(sigma=stddev)))

  if weighted:
    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      return finish(state, tff.federated_map(weigh, tff.federated_zip((value, weight))))
  else:
    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      return finish(state, tff.federated_map(weigh, value))

  return tff.templates.AggregationProcess(init_fn, next_fn)
