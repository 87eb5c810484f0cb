"""IFCA's round and the IFCA-preconditioned methods' (`ifca.ClusteredAlgorithm`) for
the stacked silos, and their runner (`VectorizedClusteredProcess`)."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys, runner
from tff_silo.algorithms import ifca
from tff_silo.backends.vectorized import training
from tff_silo.backends.vectorized.family import unsupported_reason
from tff_silo.backends.vectorized.programs import StackedRunner, round_program
from tff_silo.backends.vectorized.stacking import StackedSilos, rows, tiled, unstacked
from tff_silo.backends.vectorized.training import train_silos
from tff_silo.privacy.selection import gumbel_of


def _program_key(algorithm: ifca.ClusteredAlgorithm) -> tuple:
  return (algorithm.model.computation_key, algorithm.config, algorithm.cluster_spec,
          algorithm.aggregation, training.MEMORY_BUDGET_FLOATS)


def _cluster_round(algorithm: ifca.ClusteredAlgorithm):
  """A round of IFCA or an IFCA-preconditioned method (`ifca.cluster_client_round`,
  `ifca.choose`, `ifca.cluster_server_step`); each cluster's delta is the mean of
  its members' deltas weighted by their public sizes."""
  model, config, spec = algorithm.model, algorithm.config, algorithm.cluster_spec
  num_clusters = algorithm.num_clusters

  def round_fn(clusters, round_num, personal_w, cluster, silos: StackedSilos):
    round_keys = br.fold_in(silos.key, round_num)
    size = silos.public_size

    def select():
      mask = tf.cast(tf.range(tf.shape(silos.y)[1])[None] < silos.n[:, None],
                     tf.float32)
      scores, sensitivity = tf.vectorized_map(
          lambda a: ifca.selection_scores(model, clusters, a[0], a[1], spec.loss_clip,
                                          a[2], a[3]),
          (silos.x, silos.y, size, mask))
      noise = gumbel_of(br.uniform64(br.derive(round_keys, keys.SELECTION, 0),
                                     num_clusters))
      return ifca.choose(config.private, scores, silos.selection_epsilon, sensitivity,
                         noise)

    train = lambda begin, anchor, lam: train_silos(model, config, begin, anchor, lam,
                                                   silos, round_keys, 0)
    personal, cluster, delta = ifca.cluster_client_round(
        spec, clusters, personal_w, cluster, round_num, select, train)
    member = tf.one_hot(cluster, num_clusters)   # [K, G]
    mean_deltas = []
    for g in range(num_clusters):
      weight, inside = size * member[:, g], tf.equal(cluster, g)
      mean_deltas.append(tuple(
          tf.math.divide_no_nan(
              tf.reduce_sum(rows(weight, d) * tf.where(rows(inside, d), d, 0.0), 0),
              tf.reduce_sum(weight))
          for d in delta))
    new_clusters = ifca.cluster_server_step(clusters, mean_deltas,
                                            tf.reduce_sum(member, axis=0))
    return new_clusters, round_num + 1, tuple(personal), cluster

  return round_fn


class ClusteredState(NamedTuple):
  cluster_weights: tuple   # G models
  round_num: tf.Tensor


class ClusteredClients(NamedTuple):
  personal: tuple          # [K, ...] each
  cluster: tf.Tensor       # int32 [K]


class VectorizedClusteredProcess(StackedRunner):
  """An `ifca.ClusteredAlgorithm` (or its TFF process) with all silos in one TF
  program per round."""

  unsupported_reason = staticmethod(unsupported_reason)

  def __init__(self, process):
    algorithm = runner.definition_of(process)
    super().__init__(process, round_program(
        _program_key(algorithm), lambda: _cluster_round(algorithm)))

  def initialize(self) -> ClusteredState:
    models = self.algorithm.initial_weights
    return ClusteredState(tuple(tuple(tf.constant(w) for w in m) for m in models),
                          tf.constant(0, tf.int32))

  def initial_client_states(self, state, num_silos: int) -> ClusteredClients:
    return ClusteredClients(tiled(state.cluster_weights[0], num_silos),
                            tf.zeros([num_silos], tf.int32))

  def next(self, state: ClusteredState, client_states, silos: StackedSilos):
    clusters, new_round, personal, cluster = self._round(
        state.cluster_weights, state.round_num, client_states.personal,
        client_states.cluster, silos)
    return (ClusteredState(tuple(tuple(c) for c in clusters), new_round),
            ClusteredClients(personal, cluster), {})

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    if self.algorithm.uses_client_state(rounds_done):
      return unstacked(client_states.personal)
    models = [tuple(w.numpy() for w in model) for model in state.cluster_weights]
    return [models[g] for g in self.cluster_assignments(client_states)]

  def cluster_assignments(self, client_states):
    return client_states.cluster.numpy()

  def server_models(self, state) -> list:
    """Per run (one here), the server's models: the G cluster models."""
    return [tuple(tuple(w.numpy() for w in model) for model in state.cluster_weights)]
