"""d-private clustered FL (Galli et al., "Group privacy for personalized federated
learning", Algorithm 1), TF only.

Each round the driver samples U users (`run_dprivate_clustering`). The server
broadcasts the k hypotheses; each sampled user picks the hypothesis with the lowest
loss on its data (the model's batch objective, e.g. RMSE), trains it for E local
epochs (SGD), sanitizes the update per layer with the Euclidean Laplace mechanism
(Algorithm 2, `sanitize_updates`) and sends the full sanitized model: no cluster index
and no sample count (`user_update`). The server runs k-means on the sanitized models,
initialized at the current hypotheses, and each hypothesis becomes the unweighted
mean of its cluster (a hypothesis whose cluster is empty is kept): `kmeans_members`
and `recentre`, `kmeans_iterations` Lloyd iterations.

Leakage: a participation costs n_l / nu per layer with n_l parameters, n / nu for
the whole model (n parameters); participations add up (Theorem 1). It does not
depend on the data, so the driver keeps each user's ledger and a user declines a
round that would take it past its cap.

A `DPrivateClusteringAlgorithm` is the definition; `tff_silo.backends.tff.dprivate`
builds its TFF process (the reference, k-means as federated sums) and
`tff_silo.backends.vectorized.dprivate` runs a round as one TF program.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_silo import keys, runner
from tff_silo.algorithms.ifca import initial_cluster_weights, select_model
from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
from tff_silo.privacy.d_privacy import sanitize_updates

DEFAULT_KMEANS_ITERATIONS = 10
DEFAULT_INIT_STD = 1.0   # Galli et al. 5.1: hypotheses drawn from N(0, 1)


@dataclasses.dataclass(frozen=True)
class DPrivateClusteringAlgorithm:
  """Algorithm 1 as data (see `dprivate_clustering_algorithm`)."""

  model: object
  feature_shape: tuple
  config: LocalTrainingConfig
  num_clusters: int
  nu: Optional[float]
  kmeans_iterations: int = DEFAULT_KMEANS_ITERATIONS
  init_std: float = DEFAULT_INIT_STD
  init_seed: int = 0

  name = "dprivate_clustering"

  @property
  def layer_leakage(self) -> tuple:
    """n_l / nu per layer per participation (inf without sanitization)."""
    return tuple((int(np.prod(s, dtype=np.int64)) / self.nu if self.nu is not None
                  else np.inf) for s in self.model.weight_shapes)

  @property
  def leakage_per_participation(self) -> float:
    return float(sum(self.layer_leakage))

  @property
  def initial_weights(self) -> tuple:
    """The k hypotheses' initial weights."""
    return initial_cluster_weights(self.model, self.num_clusters, self.init_seed,
                                   self.init_std)


runner.register(DPrivateClusteringAlgorithm, tff="tff_silo.backends.tff.dprivate:runner",
                vectorized="tff_silo.backends.vectorized.dprivate:"
                "VectorizedDPrivateClustering")


def dprivate_clustering_algorithm(
    model, feature_shape, *, client_learning_rate: float, batch_size: int,
    num_clusters: int, nu: Optional[float], local_epochs: int = 1,
    kmeans_iterations: int = DEFAULT_KMEANS_ITERATIONS,
    init_std: float = DEFAULT_INIT_STD, init_seed: int = 0
) -> DPrivateClusteringAlgorithm:
  """Algorithm 1 of Galli et al.

  Args:
    model, feature_shape: the `SiloModel` and the users' feature shape.
    client_learning_rate, batch_size, local_epochs: local SGD (step s, B_s, E).
    num_clusters: k >= 1 hypotheses (k = 1: no personalization).
    nu: the noise multiplier of Algorithm 2 (> 0); None sends unsanitized models.
    kmeans_iterations: Lloyd iterations of the server's k-means.
    init_std: hypothesis j starts at the model's initialization for seed
      init_seed + j plus N(0, init_std^2) noise.
  """
  if int(num_clusters) != num_clusters or num_clusters < 1:
    raise ValueError(f"num_clusters (k) must be a positive integer, got {num_clusters}")
  if nu is not None and not (nu > 0 and np.isfinite(nu)):
    raise ValueError(f"nu must be a positive finite number (or None for no "
                     f"sanitization), got {nu}")
  if int(kmeans_iterations) != kmeans_iterations or kmeans_iterations < 1:
    raise ValueError(f"kmeans_iterations must be a positive integer, got {kmeans_iterations}")
  if not init_std >= 0:
    raise ValueError(f"init_std must be >= 0, got {init_std}")
  config = LocalTrainingConfig(learning_rate=client_learning_rate, batch_size=batch_size,
                               epochs=local_epochs)
  return DPrivateClusteringAlgorithm(model, tuple(feature_shape), config,
                                     int(num_clusters), nu, int(kmeans_iterations),
                                     float(init_std), init_seed)


def hypothesis_losses(model, hypotheses, x, y, mask=None):
  """[..., k]: the model's batch objective F_c of each hypothesis on each user's data
  (x [..., n, *features], y [..., n]; `mask` [..., n] in {0, 1}: the real rows of
  zero-padded users)."""
  lead = tf.shape(y)
  flat_x = tf.reshape(x, tf.concat([[-1], tf.shape(x)[len(y.shape):]], 0))
  flat_y = tf.reshape(y, [-1])
  return tf.stack([model.objective(tf.reshape(
      model.per_example_loss(list(h), flat_x, flat_y), lead), mask) for h in hypotheses],
                  axis=-1)


def lowest_loss_hypothesis(model, hypotheses, x, y, mask=None):
  """Each user's hypothesis with the lowest loss F_c (Algorithm 1), as
  `hypothesis_losses`; int32 [...]."""
  return tf.argmin(hypothesis_losses(model, hypotheses, x, y, mask), axis=-1,
                   output_type=tf.int32)


def released_models(algorithm: DPrivateClusteringAlgorithm, start, new, release_keys):
  """What U users send (Algorithm 1, lines 8-9; layers [U, ...]): `start` plus the
  update new - start sanitized per layer (`sanitize_updates`, user u's release with
  int32[2] key `release_keys[u]`), or `new` itself without sanitization."""
  if algorithm.nu is None:
    return list(new)
  delta = [a - b for a, b in zip(new, start)]
  return [s + d for s, d in zip(start, sanitize_updates(delta, algorithm.nu,
                                                        release_keys))]


def user_update(algorithm: DPrivateClusteringAlgorithm, hypotheses, x, y, key) -> list:
  """What a sampled user sends (Algorithm 1, lines 5-9): its lowest-loss hypothesis
  trained on (x, y), sanitized per layer (`key`: the user's key for the round)."""
  start = select_model(hypotheses, lowest_loss_hypothesis(algorithm.model, hypotheses,
                                                          x, y))
  new = train_locally(algorithm.model, algorithm.config, start, start, 0.0, x, y, 0.0,
                      key)
  released = released_models(algorithm, [w[None] for w in start], [w[None] for w in new],
                             keys.derive(key, keys.D_PRIVACY, 0)[None])
  return [w[0] for w in released]


def kmeans_members(centres, released):
  """One-hot [U, k] of each released model's nearest centre (squared Euclidean
  distance over all weights); `released` carries a leading axis of U models."""
  flat = lambda layers, lead: tf.concat(
      [tf.reshape(w, [lead, -1]) for w in layers], axis=1)
  models = flat(released, tf.shape(released[0])[0])                        # [U, P]
  distances = tf.stack([tf.reduce_sum(tf.square(models - flat(c, 1)), axis=1)
                        for c in centres], axis=1)                           # [U, k]
  return tf.one_hot(tf.argmin(distances, axis=1, output_type=tf.int32), len(centres))


def recentre(centres, sums, counts):
  """Each centre becomes the mean of its members (sums / counts); one without
  members is kept."""
  return tuple(
      tuple(tf.where(counts[j] > 0.0, s / tf.maximum(counts[j], 1.0), c)
            for c, s in zip(centres[j], sums[j])) for j in range(len(centres)))
