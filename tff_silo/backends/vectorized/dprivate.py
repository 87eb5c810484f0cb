"""d-private clustered FL's round (`dprivate_clustering.DPrivateClusteringAlgorithm`,
Galli et al. Algorithm 1) over the sampled users, and its runner
(`VectorizedDPrivateClustering`: users are mapped one by one, so any model and any
objective run here)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo import keys, runner
from tff_silo.algorithms import dprivate_clustering as dpc
from tff_silo.backends.vectorized.programs import round_program
from tff_silo.backends.vectorized.stacking import StackedSilos, rows, stack_silos


def _dprivate_round(algorithm: dpc.DPrivateClusteringAlgorithm):
  """A round of d-private clustered FL over the sampled users (`users`, int32
  [U]): each user's `dprivate_clustering.user_update` on its own rows (a `map_fn`
  over users, independent iterations run in parallel), then k-means on the
  released models as one stacked computation (`kmeans_members`, `recentre`)."""
  signature = tuple(tf.TensorSpec(s, tf.float32) for s in algorithm.model.weight_shapes)

  def round_fn(hypotheses, round_num, silos: StackedSilos, users):
    def one(k):
      n = silos.n[k]
      return tuple(dpc.user_update(algorithm, hypotheses, silos.x[k][:n],
                                   silos.y[k][:n], keys.fold_in(silos.key[k], round_num)))
    released = tf.map_fn(one, users, fn_output_signature=signature)   # [U, ...]
    centres = hypotheses
    for _ in range(algorithm.kmeans_iterations):
      member = dpc.kmeans_members(centres, released)   # [U, k]
      sums = tuple(tuple(tf.reduce_sum(rows(member[:, j], w) * w, axis=0)
                         for w in released) for j in range(algorithm.num_clusters))
      centres = dpc.recentre(centres, sums, tf.reduce_sum(member, axis=0))
    return centres, round_num + 1

  return round_fn


class HypothesesState(NamedTuple):
  hypotheses: tuple        # k models
  round_num: tf.Tensor


class VectorizedDPrivateClustering:
  """d-private clustered FL (a `DPrivateClusteringAlgorithm` or its TFF process) with
  a round as one TF program; `run_dprivate_clustering` drives it as it drives the TFF
  process (`prepare`, `sampled`, `initialize`, `next`)."""

  def __init__(self, process):
    self.algorithm = algorithm = runner.definition_of(process)
    self.name, self.model, self.config = algorithm.name, algorithm.model, algorithm.config
    self.num_clusters, self.nu = algorithm.num_clusters, algorithm.nu
    self.layer_leakage = algorithm.layer_leakage
    self.leakage_per_participation = algorithm.leakage_per_participation
    self._round = round_program(
        (algorithm.model.computation_key, algorithm.config, "dprivate",
         algorithm.num_clusters, algorithm.nu, algorithm.kmeans_iterations),
        lambda: _dprivate_round(algorithm),
        xla_blocker="d-private clustering's round does not compile (its Laplace radius "
                    "is a Gamma draw, which XLA has no kernel for)")

  def prepare(self, inputs) -> StackedSilos:
    return stack_silos(inputs)

  def sampled(self, silos: StackedSilos, users):
    return silos, tf.constant(np.asarray(users, np.int32))

  def initialize(self) -> HypothesesState:
    return HypothesesState(
        tuple(tuple(tf.constant(w) for w in h) for h in self.algorithm.initial_weights),
        tf.constant(0, tf.int32))

  def next(self, state: HypothesesState, data):
    silos, users = data
    hypotheses, new_round = self._round(state.hypotheses, state.round_num, silos, users)
    return HypothesesState(tuple(tuple(h) for h in hypotheses), new_round), {}
