"""The TFF iterative process of IFCA and the IFCA-preconditioned methods (`ifca`).

Server state: the G cluster models, the round number and one aggregator state per
cluster. Client state: the silo's personalized weights and its cluster index. Every
round the server broadcasts the cluster models; each silo runs
`ifca.cluster_client_round` (selecting with `ifca.choose` in selection rounds) and
sends its delta to its cluster's aggregator with weight m_k (0 to the others); the
server applies `ifca.cluster_server_step`.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.runner import SiloModels
from tff_silo.algorithms.ifca import (
    ClusteredAlgorithm, choose, cluster_client_round, cluster_server_step,
    initial_cluster_weights, selection_scores)
from tff_silo.algorithms.local_training import train_locally
from tff_silo.backends.tff.silo import (
    SiloProcess, create_aggregator, silo_input_type, weights_type)
from tff_silo.algorithms.rounds import public_size
from tff_silo.privacy.selection import gumbel


class ClusterServerState(NamedTuple):
  cluster_weights: tuple   # G models, each a tuple of tensors
  round_num: np.int32
  aggregator: tuple        # one aggregator state per cluster


class ClusterClientState(NamedTuple):
  personal: tuple
  cluster: np.int32


class ClusteredProcess(SiloProcess):
  """A `SiloProcess` over G cluster models.

  Extra attributes: num_clusters, selection_rounds, selection_budget_share.
  """

  def __init__(self, initialize_fn, next_fn, *, algorithm: ClusteredAlgorithm):
    super().__init__(initialize_fn, next_fn, name=algorithm.name, model=algorithm.model,
                     config=algorithm.config, epochs_per_round=algorithm.epochs_per_round,
                     personal_from_round=None)
    self.algorithm = algorithm
    self.num_clusters = algorithm.num_clusters
    self.selection_rounds = algorithm.cluster_spec.selection_rounds
    self.selection_budget_share = algorithm.selection_budget_share

  def num_selections(self, rounds: int) -> int:
    return self.algorithm.num_selections(rounds)

  def initial_client_states(self, state, num_silos: int) -> list:
    return [ClusterClientState(state.cluster_weights[0], np.int32(0))] * num_silos

  def evaluation_weights(self, state, client_states, rounds_done: int) -> SiloModels:
    if self.algorithm.uses_client_state(rounds_done):
      return SiloModels.of([c.personal for c in client_states])
    return SiloModels.of([state.cluster_weights[int(c.cluster)] for c in client_states])

  def cluster_assignments(self, client_states):
    return np.array([int(c.cluster) for c in client_states])

  def server_models(self, state) -> list:
    """Per run (one here), the server's models: the G cluster models."""
    return [tuple(tuple(np.asarray(w) for w in model) for model in state.cluster_weights)]


def initial_cluster_models(model, num_clusters: int, init_seed: int, init_std: float):
  """A TF computation of `ifca.initial_cluster_weights`."""
  initial = initial_cluster_weights(model, num_clusters, init_seed, init_std)

  @tff.tensorflow.computation
  def initial_models():
    return tuple(tuple(tf.constant(w) for w in m) for m in initial)

  return initial_models


def runner(process) -> ClusteredProcess:
  """The registered TFF runner of a `ClusteredAlgorithm`: `process` itself when it
  is one already built, else `process_for_clusters(process)`."""
  return process if isinstance(process, ClusteredProcess) else process_for_clusters(
      process)


def process_for_clusters(algorithm: ClusteredAlgorithm) -> ClusteredProcess:
  """The TFF `IterativeProcess` running `algorithm` (the reference runtime)."""
  model, config, spec = algorithm.model, algorithm.config, algorithm.cluster_spec
  num_clusters = algorithm.num_clusters
  w_type = weights_type(model)
  data_type = silo_input_type(algorithm.feature_shape)
  agg_process, weighted = create_aggregator(algorithm.aggregator, w_type)
  if not weighted:
    raise TypeError("clustered processes need a weighted aggregation factory "
                    "(non-members of a cluster contribute with weight 0)")
  clusters_type = tff.StructWithPythonType([w_type] * num_clusters, tuple)
  client_state_type = tff.StructWithPythonType(
      [("personal", w_type), ("cluster", tff.TensorType(np.int32))], ClusterClientState)
  initial_clusters = initial_cluster_models(model, num_clusters, algorithm.init_seed,
                                            algorithm.cluster_init_std)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(ClusterServerState(
        cluster_weights=tff.federated_eval(initial_clusters, tff.SERVER),
        round_num=tff.federated_value(np.int32(0), tff.SERVER),
        aggregator=tff.federated_zip(tuple(
            agg_process.initialize() for _ in range(num_clusters)))))

  @tff.tensorflow.computation(
      tff.StructWithPythonType([clusters_type, tff.TensorType(np.int32)], tuple),
      client_state_type, data_type)
  def client_update(broadcast, client_state, data):
    clusters, round_num = broadcast
    key = keys.fold_in(data.seed, round_num)
    n = public_size(data)

    def select():
      scores, sensitivity = selection_scores(model, clusters, data.x, data.y,
                                             spec.loss_clip, n)
      noise = gumbel([num_clusters], keys.derive(key, keys.SELECTION, 0))
      return choose(config.private, scores, data.selection_epsilon, sensitivity, noise)

    train = lambda begin, anchor, lam: train_locally(
        model, config, begin, anchor, lam, data.x, data.y, data.noise_multiplier, key,
        0, data.size)
    new, cluster, delta = cluster_client_round(
        spec, clusters, client_state.personal, client_state.cluster, round_num, select,
        train)
    member = tf.one_hot(cluster, num_clusters)
    deltas = tuple(tuple(tf.where(tf.equal(cluster, g), d, tf.zeros_like(d))
                         for d in delta) for g in range(num_clusters))
    weights = tuple(n * member[g] for g in range(num_clusters))
    return (ClusterClientState(tuple(new), cluster), deltas, weights, member)

  @tff.tensorflow.computation(clusters_type, np.int32, clusters_type,
                              tff.TensorType(np.float32, [num_clusters]))
  def server_update(clusters, round_num, mean_deltas, counts):
    return cluster_server_step(clusters, mean_deltas, counts), round_num + 1

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(client_state_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_states, client_data):
    broadcast = tff.federated_broadcast(
        tff.federated_zip((state.cluster_weights, state.round_num)))
    new_states, deltas, weights, members = tff.federated_map(
        client_update, tff.federated_zip((broadcast, client_states, client_data)))
    aggs = [agg_process.next(state.aggregator[g], deltas[g], weights[g])
            for g in range(num_clusters)]
    counts = tff.federated_sum(members)
    new_clusters, new_round = tff.federated_map(server_update, tff.federated_zip((
        state.cluster_weights, state.round_num,
        tff.federated_zip(tuple(a.result for a in aggs)), counts)))
    new_state = tff.federated_zip(ClusterServerState(
        new_clusters, new_round, tff.federated_zip(tuple(a.state for a in aggs))))
    metrics = tff.federated_zip(collections.OrderedDict(cluster_sizes=counts))
    return new_state, new_states, metrics

  return ClusteredProcess(initialize_fn, next_fn, algorithm=algorithm)
