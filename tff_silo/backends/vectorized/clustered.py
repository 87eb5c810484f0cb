"""IFCA's round and the IFCA-preconditioned methods' (`ifca.ClusteredAlgorithm`) for
the stacked silos of one or more runs, and their runner (`VectorizedClusteredProcess`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys, runner
from tff_silo.algorithms import ifca
from tff_silo.backends.vectorized import training
from tff_silo.backends.vectorized.family import unsupported_reason
from tff_silo.backends.vectorized.programs import RunStackingRunner, round_program
from tff_silo.backends.vectorized.stacking import RunStack, StackedSilos, rows
from tff_silo.backends.vectorized.training import train_silos
from tff_silo.privacy.selection import gumbel_of


def stack_key(algorithm: ifca.ClusteredAlgorithm) -> tuple:
  """What the round's program depends on besides its tensors: runs of one method with
  equal keys stack (they differ in data, noise, keys, initial clusters and
  `hyperparameters`)."""
  return ("clustered", algorithm.name, algorithm.model.computation_key,
          algorithm.config.program_settings(),
          dataclasses.replace(algorithm.cluster_spec, lam=0.0), algorithm.aggregation,
          training.MEMORY_BUDGET_FLOATS)


def hyperparameters(algorithm: ifca.ClusteredAlgorithm) -> tuple:
  """(learning rate, lambda): what a run feeds its stacked program as tensors."""
  return algorithm.config.learning_rate, algorithm.cluster_spec.lam


def selection_silos_per_call(model, num_clusters: int, rows_per_silo) -> int:
  """Silos whose G cluster scores are computed at once
  (`training.forward_items_per_call`); all of them when rows are unknown."""
  if rows_per_silo is None:
    return np.iinfo(np.int32).max
  return training.forward_items_per_call(model, rows_per_silo, num_clusters)


def _cluster_client_part(algorithm: ifca.ClusteredAlgorithm):
  """The silos' half of a round of IFCA or an IFCA-preconditioned method
  (`ifca.cluster_client_round`, `ifca.choose`) for the stacked silos of one or more
  runs: `clusters` per layer [R, G, ...] (each run's G models), `run` (int32 [K])
  each silo's run. Returns (new personal models, new clusters, the contribution):
  per (run, cluster) the public-size-weighted sums of its members' deltas, of their
  sizes and the member counts, which add up across shards of the silos
  (`tff_silo.sharding`); a silo of a run not `active` (bool [R]) keeps its state."""
  model, config, spec = algorithm.model, algorithm.config, algorithm.cluster_spec
  num_clusters = algorithm.num_clusters

  def client_fn(clusters, round_num, personal_w, cluster, silos: StackedSilos, run,
                learning_rate, lam, active):
    num_runs = tf.shape(active)[0]
    mine = [tf.gather(layer, run) for layer in clusters]   # [K, G, ...]
    round_keys = br.fold_in(silos.key, round_num)
    size = silos.public_size

    def select():
      mask = silos.row_mask
      scores, sensitivity = training.map_in_chunks(
          lambda a: ifca.selection_scores(
              model, tuple(tuple(layer[g] for layer in a[4]) for g in range(num_clusters)),
              a[0], a[1], spec.loss_clip, a[2], a[3]),
          (silos.x, silos.y, size, mask, mine),
          selection_silos_per_call(model, num_clusters, silos.y.shape[1]),
          (tf.TensorSpec([num_clusters], tf.float32), tf.TensorSpec([], tf.float32)))
      noise = gumbel_of(br.uniform64(br.derive(round_keys, keys.SELECTION, 0),
                                     num_clusters))
      return ifca.choose(config.private, scores, silos.selection_epsilon, sensitivity,
                         noise)

    centre = lambda chosen: [tf.gather(layer, chosen, batch_dims=1) for layer in mine]
    train = lambda begin, anchor, lam_: train_silos(model, config, begin, anchor, lam_,
                                                    silos, round_keys, 0, learning_rate)
    personal, new_cluster, delta = ifca.cluster_client_round(
        spec, centre, personal_w, cluster, round_num, select, train, lam)
    segment = run * num_clusters + new_cluster   # (run, cluster) of each silo
    segments = num_runs * num_clusters
    sums = tuple(tf.math.unsorted_segment_sum(rows(size, d) * d, segment, segments)
                 for d in delta)
    contribution = (sums, tf.math.unsorted_segment_sum(size, segment, segments),
                    tf.math.unsorted_segment_sum(tf.ones_like(size), segment, segments))
    silo_active = tf.gather(active, run)
    return (tuple(tf.where(rows(silo_active, n), n, p) for n, p in zip(personal, personal_w)),
            tf.where(silo_active, new_cluster, cluster), contribution)

  return client_fn


def _cluster_server_part(algorithm: ifca.ClusteredAlgorithm):
  """The server's half: each cluster moves by its members' mean delta, one without
  members keeping its model (`ifca.cluster_server_step`); a run not `active` keeps
  its models."""
  num_clusters = algorithm.num_clusters

  def server_fn(clusters, round_num, contribution, active):
    sums, total, count = contribution
    num_runs = tf.shape(active)[0]
    grid = lambda t: tf.reshape(t, tf.concat([[num_runs, num_clusters], tf.shape(t)[1:]],
                                              0))
    members = grid(count)
    new_clusters = []
    for layer, summed in zip(clusters, sums):
      mean = grid(tf.math.divide_no_nan(summed, rows(total, summed[:1])))
      moved = tf.where(tf.reshape(members > 0.0, tf.concat(   # [R, G, 1, ...]
          [tf.shape(members), tf.ones([len(layer.shape) - 2], tf.int32)], 0)),
                       layer + mean, layer)
      new_clusters.append(tf.where(rows(active, layer), moved, layer))
    return tuple(new_clusters), round_num + 1

  return server_fn


def _cluster_round(algorithm: ifca.ClusteredAlgorithm):
  """A whole round: the silos' half, then the server's, in one program."""
  client_fn = _cluster_client_part(algorithm)
  server_fn = _cluster_server_part(algorithm)

  def round_fn(clusters, round_num, personal_w, cluster, silos: StackedSilos, run,
               learning_rate, lam, active):
    personal, new_cluster, contribution = client_fn(
        clusters, round_num, personal_w, cluster, silos, run, learning_rate, lam, active)
    return (*server_fn(clusters, round_num, contribution, active), personal, new_cluster)

  return round_fn


def _program(algorithm: ifca.ClusteredAlgorithm, part: str = "round"):
  make = dict(round=_cluster_round, client=_cluster_client_part,
              server=_cluster_server_part)[part]
  return round_program((stack_key(algorithm), part), lambda: make(algorithm))


class ClusteredState(NamedTuple):
  cluster_weights: tuple   # per layer [R, G, ...]: each stacked run's G models
  round_num: tf.Tensor


class ClusteredClients(NamedTuple):
  personal: tuple          # [K, ...] each
  cluster: tf.Tensor       # int32 [K]


class VectorizedClusteredProcess(RunStackingRunner):
  """An `ifca.ClusteredAlgorithm` (or its TFF process) with all silos in one TF
  program per round; runs of one `stack_key` stack (`prepare_runs`), each with its
  own G cluster models."""

  unsupported_reason = staticmethod(unsupported_reason)
  stack_key = staticmethod(stack_key)
  hyperparameters = staticmethod(hyperparameters)

  def __init__(self, process):
    super().__init__(process, _program(runner.definition_of(process)))

  def initialize(self) -> ClusteredState:
    runs = self._initial   # per run, G models
    return ClusteredState(
        tuple(tf.constant(np.stack([np.stack([m[i] for m in models]) for models in runs]))
              for i in range(len(runs[0][0]))),
        tf.constant(0, tf.int32))

  def initial_client_states(self, state, num_silos: int) -> ClusteredClients:
    run = self.silo_runs(num_silos)
    return ClusteredClients(tuple(tf.gather(layer[:, 0], run)
                                  for layer in state.cluster_weights),
                            tf.zeros([num_silos], tf.int32))

  def next(self, state: ClusteredState, client_states, data: RunStack, active=None):
    clusters, new_round, personal, cluster = self._round(
        state.cluster_weights, state.round_num, client_states.personal,
        client_states.cluster, data.silos, data.run, data.learning_rate, data.lam,
        self.active_runs(active))
    return (ClusteredState(tuple(clusters), new_round),
            ClusteredClients(personal, cluster), {})

  def shard_round(self, state: ClusteredState, client_states, data: RunStack,
                  active=None):
    """The silos' half of `next` on a shard of the silos (`tff_silo.sharding`): (the
    new client states, the contribution: per (run, cluster) the weighted delta sums,
    the size total and the member count)."""
    personal, cluster, contribution = _program(self.algorithm, "client")(
        state.cluster_weights, state.round_num, client_states.personal,
        client_states.cluster, data.silos, data.run, data.learning_rate, data.lam,
        self.active_runs(active))
    return ClusteredClients(personal, cluster), contribution

  def server_round(self, state: ClusteredState, contribution, active=None):
    """The server's half of `next`, on the contributions of every shard summed."""
    clusters, new_round = _program(self.algorithm, "server")(
        state.cluster_weights, state.round_num, contribution, self.active_runs(active))
    return ClusteredState(tuple(clusters), new_round)

  def evaluation_weights(self, state, client_states, rounds_done: int) -> runner.SiloModels:
    num_silos = int(client_states.cluster.shape[0])
    if self.algorithm.uses_client_state(rounds_done):
      return runner.SiloModels(tuple(client_states.personal),
                               (np.arange(num_silos, dtype=np.int32),))
    return runner.SiloModels(tuple(state.cluster_weights),
                             (self.silo_runs(num_silos), client_states.cluster))

  def cluster_assignments(self, client_states):
    return client_states.cluster.numpy()

  def server_models(self, state) -> list:
    """Per stacked run, the server's models: its G cluster models."""
    layers = [layer.numpy() for layer in state.cluster_weights]
    return [tuple(tuple(layer[r, g] for layer in layers)
                  for g in range(layers[0].shape[1])) for r in range(layers[0].shape[0])]
