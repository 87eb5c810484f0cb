"""d-private clustered FL (Galli et al., "Group privacy for personalized federated
learning", Algorithm 1) as a TFF iterative process.

Each round the driver samples U users (`run_dprivate_clustering`). The server
broadcasts the k hypotheses; each sampled user picks the hypothesis with the lowest
loss on its data (the model's batch objective, e.g. RMSE), trains it for E local epochs (SGD), sanitizes the update per
layer with the Euclidean Laplace mechanism (Algorithm 2, `sanitize_update`) and
sends the full sanitized model: no cluster index and no sample count. The server runs
k-means on the sanitized models, initialized at the current hypotheses, and each
hypothesis becomes the unweighted mean of its cluster (a hypothesis whose cluster is
empty is kept).

k-means runs as `kmeans_iterations` Lloyd iterations, each a broadcast of the centres
and a federated sum of the models assigned to each centre: the same computation as
k-means on the collected models, expressed with federated operators.

Leakage: a participation costs n_l / nu per layer with n_l parameters, n / nu for
the whole model (n parameters); participations add up (Theorem 1). It does not
depend on the data, so the driver keeps each user's ledger and a user declines a
round that would take it past its cap.
"""

from __future__ import annotations

import collections
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.algorithms.clustered_process import initial_cluster_models
from tff_silo.algorithms.ifca import select_model
from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
from tff_silo.algorithms.process import silo_input_type, weights_type
from tff_silo.privacy.d_privacy import sanitize_update

DEFAULT_KMEANS_ITERATIONS = 10
DEFAULT_INIT_STD = 1.0   # Galli et al. 5.1: hypotheses drawn from N(0, 1)


class HypothesesState(NamedTuple):
  hypotheses: tuple   # k models, each a tuple of tensors
  round_num: np.int32


class DPrivateClusteringProcess(tff.templates.IterativeProcess):
  """`next(state, client_data) -> (state, metrics)` over the sampled users' data.

  Attributes: name, model, config, num_clusters, nu (None: no sanitization),
  layer_leakage (n_l / nu per layer per participation) and leakage_per_participation
  (their sum, n / nu; inf without sanitization).
  """

  def __init__(self, initialize_fn, next_fn, *, model, config, num_clusters, nu):
    super().__init__(initialize_fn, next_fn, next_is_multi_arg=True)
    self.name = "dprivate_clustering"
    self.model = model
    self.config = config
    self.num_clusters = num_clusters
    self.nu = nu
    sizes = [int(np.prod(s, dtype=np.int64)) for s in model.weight_shapes]
    self.layer_leakage = tuple(
        (n / nu if nu is not None else np.inf) for n in sizes)
    self.leakage_per_participation = float(sum(self.layer_leakage))


def lowest_loss_hypothesis(model, hypotheses, x, y):
  """Index of the hypothesis with the lowest loss F_c on (x, y) (Algorithm 1)."""
  losses = tf.stack([model.batch_loss(list(h), x, y) for h in hypotheses])
  return tf.argmin(losses, output_type=tf.int32)


def _flat(weights):
  return tf.concat([tf.reshape(w, [-1]) for w in weights], 0)


def build_dprivate_clustering_process(
    model, feature_shape, *, client_learning_rate: float, batch_size: int,
    num_clusters: int, nu: Optional[float], local_epochs: int = 1,
    kmeans_iterations: int = DEFAULT_KMEANS_ITERATIONS,
    init_std: float = DEFAULT_INIT_STD, init_seed: int = 0) -> DPrivateClusteringProcess:
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
  k = int(num_clusters)
  w_type = weights_type(model)
  data_type = silo_input_type(feature_shape)
  hyp_type = tff.StructWithPythonType([w_type] * k, tuple)
  initial_hypotheses = initial_cluster_models(model, k, init_seed, init_std)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(HypothesesState(
        hypotheses=tff.federated_eval(initial_hypotheses, tff.SERVER),
        round_num=tff.federated_value(np.int32(0), tff.SERVER)))

  @tff.tensorflow.computation(
      tff.StructWithPythonType([hyp_type, tff.TensorType(np.int32)], tuple), data_type)
  def client_update(broadcast, data):
    hypotheses, round_num = broadcast
    key = keys.fold_in(data.seed, round_num)
    j = lowest_loss_hypothesis(model, hypotheses, data.x, data.y)
    start = select_model(hypotheses, j)
    new = train_locally(model, config, start, start, 0.0, data.x, data.y, 0.0,
                        key)
    if nu is None:
      return tuple(new)
    delta = [a - b for a, b in zip(new, start)]
    sanitized, _ = sanitize_update(delta, nu,
                                   keys.derive(key, keys.D_PRIVACY, 0))
    return tuple(s + d for s, d in zip(start, sanitized))

  @tff.tensorflow.computation(hyp_type, w_type)
  def assign(centres, released):
    distances = tf.stack([tf.reduce_sum(tf.square(_flat(c) - _flat(released)))
                          for c in centres])
    member = tf.one_hot(tf.argmin(distances, output_type=tf.int32), k)
    masked = tuple(tuple(member[j] * w for w in released) for j in range(k))
    return masked, member

  @tff.tensorflow.computation(hyp_type, hyp_type, tff.TensorType(np.float32, [k]))
  def recentre(centres, sums, counts):
    return tuple(
        tuple(tf.where(counts[j] > 0.0, s / tf.maximum(counts[j], 1.0), c)
              for c, s in zip(centres[j], sums[j])) for j in range(k))

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
    for _ in range(kmeans_iterations):
      masked, members = tff.federated_map(assign, tff.federated_zip(
          (tff.federated_broadcast(centres), released)))
      counts = tff.federated_sum(members)
      centres = tff.federated_map(recentre, tff.federated_zip(
          (centres, tff.federated_sum(masked), counts)))
    new_state = tff.federated_zip(HypothesesState(
        centres, tff.federated_map(increment, state.round_num)))
    return new_state, tff.federated_zip(collections.OrderedDict(cluster_sizes=counts))

  return DPrivateClusteringProcess(initialize_fn, next_fn, model=model, config=config,
                                   num_clusters=k, nu=nu)
