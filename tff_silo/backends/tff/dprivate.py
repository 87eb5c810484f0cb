"""The TFF iterative process of d-private clustered FL (`dprivate_clustering`).

`next(state, client_data)` runs over the sampled users' data: the server broadcasts
the k hypotheses, each user returns `dprivate_clustering.user_update`, and k-means
runs as `kmeans_iterations` Lloyd iterations, each a broadcast of the centres and a
federated sum of the models assigned to each centre (`kmeans_members`, `recentre`):
the same computation as k-means on the collected models, with federated operators.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.backends.tff.clustered import initial_cluster_models
from tff_silo.algorithms.dprivate_clustering import (
    DPrivateClusteringAlgorithm, kmeans_members, recentre, user_update)
from tff_silo.backends.tff.silo import silo_input_type, weights_type


class HypothesesState(NamedTuple):
  hypotheses: tuple   # k models, each a tuple of tensors
  round_num: np.int32


class DPrivateClusteringProcess(tff.templates.IterativeProcess):
  """`next(state, client_data) -> (state, metrics)` over the sampled users' data.

  Attributes: algorithm (the definition) and its name, model, config, num_clusters,
  nu (None: no sanitization), layer_leakage (n_l / nu per layer per participation)
  and leakage_per_participation (their sum, n / nu; inf without sanitization).
  """

  def __init__(self, initialize_fn, next_fn, *, algorithm: DPrivateClusteringAlgorithm):
    super().__init__(initialize_fn, next_fn, next_is_multi_arg=True)
    self.algorithm = algorithm
    self.name, self.model, self.config = algorithm.name, algorithm.model, algorithm.config
    self.num_clusters, self.nu = algorithm.num_clusters, algorithm.nu
    self.layer_leakage = algorithm.layer_leakage
    self.leakage_per_participation = algorithm.leakage_per_participation

  def prepare(self, inputs: list) -> list:
    return inputs

  def sampled(self, inputs: list, users) -> list:
    """The client data of `next` for the sampled users."""
    return [inputs[k] for k in users]


def runner(process) -> DPrivateClusteringProcess:
  """The registered TFF runner of a `DPrivateClusteringAlgorithm`: `process` itself
  when it is one already built, else `process_for_dprivate(process)`."""
  return (process if isinstance(process, DPrivateClusteringProcess)
          else process_for_dprivate(process))


def process_for_dprivate(algorithm: DPrivateClusteringAlgorithm
                         ) -> DPrivateClusteringProcess:
  """The TFF `IterativeProcess` running `algorithm` (the reference runtime)."""
  k = algorithm.num_clusters
  w_type = weights_type(algorithm.model)
  data_type = silo_input_type(algorithm.feature_shape)
  hyp_type = tff.StructWithPythonType([w_type] * k, tuple)
  initial_hypotheses = initial_cluster_models(algorithm.model, k, algorithm.init_seed,
                                              algorithm.init_std)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(HypothesesState(
        hypotheses=tff.federated_eval(initial_hypotheses, tff.SERVER),
        round_num=tff.federated_value(np.int32(0), tff.SERVER)))

  @tff.tensorflow.computation(
      tff.StructWithPythonType([hyp_type, tff.TensorType(np.int32)], tuple), data_type)
  def client_update(broadcast, data):
    hypotheses, round_num = broadcast
    return tuple(user_update(algorithm, hypotheses, data.x, data.y,
                             keys.fold_in(data.seed, round_num)))

  @tff.tensorflow.computation(hyp_type, w_type)
  def assign(centres, released):
    member = kmeans_members(centres, [w[None] for w in released])[0]
    masked = tuple(tuple(member[j] * w for w in released) for j in range(k))
    return masked, member

  @tff.tensorflow.computation(hyp_type, hyp_type, tff.TensorType(np.float32, [k]))
  def recentre_fn(centres, sums, counts):
    return recentre(centres, sums, counts)

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_data):
    broadcast = tff.federated_broadcast(
        tff.federated_zip((state.hypotheses, state.round_num)))
    released = tff.federated_map(client_update, tff.federated_zip((broadcast, client_data)))
    centres = state.hypotheses
    for _ in range(algorithm.kmeans_iterations):
      masked, members = tff.federated_map(assign, tff.federated_zip(
          (tff.federated_broadcast(centres), released)))
      counts = tff.federated_sum(members)
      centres = tff.federated_map(recentre_fn, tff.federated_zip(
          (centres, tff.federated_sum(masked), counts)))
    new_state = tff.federated_zip(HypothesesState(
        centres, tff.federated_map(increment, state.round_num)))
    return new_state, tff.federated_zip(collections.OrderedDict(cluster_sizes=counts))

  return DPrivateClusteringProcess(initialize_fn, next_fn, algorithm=algorithm)
