"""d-private clustered FL's round (`dprivate_clustering.DPrivateClusteringAlgorithm`,
Galli et al. Algorithm 1) over the sampled users as one TF program, and its runner
(`VectorizedDPrivateClustering`)."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys, runner
from tff_silo.algorithms import dprivate_clustering as dpc
from tff_silo.backends.vectorized.programs import (compiling_rounds, padded_ids,
                                                   round_program)
from tff_silo.backends.vectorized.stacking import StackedSilos, rows, stack_silos
from tff_silo.backends.vectorized.training import train_silos


def _dprivate_round(algorithm: dpc.DPrivateClusteringAlgorithm):
  """A round of d-private clustered FL over the sampled users (`users`, int32 [U];
  `real` [U] in {0, 1}, 0 for padding): every user's lowest-loss hypothesis
  (`lowest_loss_hypothesis` over its real rows) trained as stacked silos
  (`train_silos`), the updates sanitized (`released_models`), then k-means on the
  released models of the real users (`kmeans_members`, `recentre`)."""
  model = algorithm.model

  def round_fn(hypotheses, round_num, silos: StackedSilos, users, real):
    mine = StackedSilos(*(tf.gather(t, users) for t in silos))
    chosen = dpc.lowest_loss_hypothesis(model, hypotheses, mine.x, mine.y,
                                        mine.row_mask)
    start = [tf.gather(tf.stack(layer), chosen) for layer in zip(*hypotheses)]
    round_keys = br.fold_in(mine.key, round_num)
    new = train_silos(model, algorithm.config, start, start, 0.0, mine, round_keys, 0)
    released = dpc.released_models(algorithm, start, new,
                                   br.derive(round_keys, keys.D_PRIVACY, 0))
    centres = hypotheses
    for _ in range(algorithm.kmeans_iterations):
      member = dpc.kmeans_members(centres, released) * real[:, None]   # [U, k]
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
        lambda: _dprivate_round(algorithm))
    self._padded = compiling_rounds()

  def prepare(self, inputs) -> StackedSilos:
    return stack_silos(inputs)

  def sampled(self, silos: StackedSilos, users):
    """The stacked users, the ids sampled and which are real (`padded_ids`: padding
    is left out of k-means)."""
    return (silos, *padded_ids(users, self._padded))

  def initialize(self) -> HypothesesState:
    return HypothesesState(
        tuple(tuple(tf.constant(w) for w in h) for h in self.algorithm.initial_weights),
        tf.constant(0, tf.int32))

  def next(self, state: HypothesesState, data):
    hypotheses, new_round = self._round(state.hypotheses, state.round_num, *data)
    return HypothesesState(tuple(tuple(h) for h in hypotheses), new_round), {}
