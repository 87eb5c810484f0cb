"""UDP-Alg's user-level DP weighted mean (`user_level.UserLevelMean`, eq. 3 and 4 of
Nemala et al., CIKM'23) as a `tff.aggregators` factory, for the TFF backend."""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.privacy import integer_gaussian
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
    if not tff.types.is_structure_of_floats(value_type):
      raise TypeError(f"values must be a structure of float tensors, got {value_type}")
    if not (isinstance(weight_type, tff.TensorType) and weight_type.dtype == np.float32
            and weight_type.shape == ()):
      raise TypeError(f"weights must be float32 scalars, got {weight_type}")
    mean = self.mean
    root = keys.root_key(mean.seed)
    integer = mean.noise_multiplier > 0   # clients round, the server adds the noise

    @tff.tensorflow.computation
    def initial_round():
      return tf.constant(0, tf.int32)

    @tff.tensorflow.computation(value_type, weight_type)
    def weigh(value, weight):
      tensors = [t[None] for t in tf.nest.flatten(value)]
      if not integer:
        return tf.nest.pack_sequence_as(
            value, weighted_clipped_sum(tensors, weight[None], mean.l2_norm_clip))
      flat = flat_contributions(tensors, weight[None], mean.l2_norm_clip)
      grid, bound = mean.integer_grid(flat.shape[1])
      rounded = integer_gaussian.rounded(flat, grid, bound)[0]
      sizes = [int(np.prod(t.shape[1:])) for t in tensors]
      return tf.nest.pack_sequence_as(value, [
          tf.reshape(r, t.shape[1:]) for r, t in zip(tf.split(rounded, sizes), tensors)])

    @tff.tensorflow.computation(np.int32, weigh.type_signature.result)
    def release(round_num, total):
      parts = tf.nest.flatten(total)
      if integer:
        flat = tf.concat([tf.reshape(t, [-1]) for t in parts], 0)
        grid, _ = mean.integer_grid(flat.shape[0])
        tensors = integer_mean(flat, grid, mean.normalizer, root, round_num, parts)
      else:
        tensors = [t / mean.normalizer for t in parts]
      return (tf.nest.pack_sequence_as(total, tensors), round_num + 1,
              tf.constant(mean.sigma, tf.float32))

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(initial_round, tff.SERVER)

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      total = tff.federated_sum(tff.federated_map(weigh, tff.federated_zip((value, weight))))
      result, new_state, stddev = tff.federated_map(
          release, tff.federated_zip((state, total)))
      return tff.templates.MeasuredProcessOutput(
          state=new_state, result=result,
          measurements=tff.federated_zip(collections.OrderedDict(sigma=stddev)))

    return tff.templates.AggregationProcess(init_fn, next_fn)
