"""IFCA with private cluster selection and the IFCA-preconditioned methods.

IFCA (Ghosh et al. 2020; thesis app. B.3): the server holds G cluster models; in a
selection round every silo scores each cluster model on its training data, selects
one, trains it with (DP-)SGD and returns the update with its cluster index; the
server averages each cluster's updates (weighted by the silos' public sizes). Under silo-specific
example-level DP the selection is a query of the silo's data: it is made with the
exponential mechanism (`report_noisy_min`) on the error rate, sensitivity 1 / (m - 1)
(thesis eq. B.1), or for regression on the mean loss clipped to `loss_clip`,
sensitivity loss_clip / (m - 1), with both means taken over the silo's public size
m (its n when sizes are public: `tff_silo.privacy.protocol`); its cost (epsilon_select = share * epsilon per
selection) is composed with DP-SGD's in the driver's calibration.

Selection runs in the first `selection_rounds` rounds; afterwards each silo keeps its
last cluster and the method named by `after` runs within the clusters (thesis app.
C.2, Algorithm 2):
- `fedavg`: keep training the cluster model (IFCA with truncated selection, i.e.
  "IFCA (10%)"; with selection in every round this is plain IFCA);
- `local`: each silo trains its own copy of its cluster model, alone;
- `mrmtl`: each silo trains its own model regularized towards its cluster's centroid,
  which the cluster's updates keep moving (Algorithm 2, lines 13-21);
- `finetune`: FedAvg within the cluster until `switch_round`, then local training.
Updates are w_new - w_start as in MR-MTL's Algorithm 1 (the centroid stays the
weighted mean of its members' models either way).

Client state: the silo's personalized weights and its cluster index.
"""

from __future__ import annotations

import collections
import math
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.algorithms import _common
from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
from tff_silo.algorithms.process import (
    SiloProcess, create_aggregator, silo_input_type, weights_type)
from tff_silo.algorithms.rounds import check_lambda, public_size
from tff_silo.privacy.selection import report_noisy_min

AFTER_SELECTION = ("fedavg", "local", "mrmtl", "finetune")
DEFAULT_NUM_CLUSTERS = 4
DEFAULT_SELECTION_FRACTION = 0.1
DEFAULT_SELECTION_BUDGET_SHARE = 0.03
DEFAULT_LOSS_CLIP = 1.0
DEFAULT_CLUSTER_INIT_STD = 0.01


class ClusterServerState(NamedTuple):
  cluster_weights: tuple   # G models, each a tuple of tensors
  round_num: np.int32
  aggregator: tuple        # one aggregator state per cluster


class ClusterClientState(NamedTuple):
  personal: tuple
  cluster: np.int32


def selection_rounds(total_rounds: int, selection_fraction: float) -> int:
  """ceil(fraction * T), at least 1: the rounds (from the first) that select."""
  if not 0.0 < selection_fraction <= 1.0:
    raise ValueError(f"selection_fraction must be in (0, 1], got {selection_fraction}")
  if int(total_rounds) != total_rounds or total_rounds < 1:
    raise ValueError(f"total_rounds must be a positive integer, got {total_rounds}")
  return max(1, math.ceil(selection_fraction * total_rounds - 1e-9))


def selection_scores(model, clusters, x, y, loss_clip: float, size=None):
  """(scores [G], sensitivity): error counts over `size` m (default n) with
  sensitivity 1 / (m - 1) for classification, else per-example losses clipped to
  `loss_clip` summed over m, sensitivity loss_clip / (m - 1) (thesis eq. B.1). With
  a public m the sensitivity does not depend on the silo's true size."""
  m = tf.cast(tf.shape(y)[0], tf.float32) if size is None else size
  scores = []
  for w in clusters:
    if model.metric == "accuracy":
      errors = 1.0 - model.metric_values(list(w), x, y)
    else:
      errors = tf.minimum(model.per_example_loss(list(w), x, y), loss_clip)
    scores.append(tf.reduce_sum(errors) / m)
  bound = 1.0 if model.metric == "accuracy" else loss_clip
  return tf.stack(scores), bound / tf.maximum(m - 1.0, 1.0)


class ClusteredProcess(SiloProcess):
  """A `SiloProcess` over G cluster models (see module docstring).

  Extra attributes: num_clusters, selection_rounds, selection_budget_share.
  """

  def __init__(self, initialize_fn, next_fn, *, num_clusters, selection_rounds,
               selection_budget_share, evaluate_personal_from, **kwargs):
    super().__init__(initialize_fn, next_fn, **kwargs)
    self.num_clusters = num_clusters
    self.selection_rounds = selection_rounds
    self.selection_budget_share = selection_budget_share
    self._evaluate_personal_from = evaluate_personal_from

  def num_selections(self, rounds: int) -> int:
    return min(rounds, self.selection_rounds)

  def initial_client_states(self, state, num_silos: int) -> list:
    return [ClusterClientState(state.cluster_weights[0], np.int32(0))] * num_silos

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    if (self._evaluate_personal_from is not None
        and rounds_done > self._evaluate_personal_from):
      return [c.personal for c in client_states]
    return [state.cluster_weights[int(c.cluster)] for c in client_states]

  def cluster_assignments(self, client_states):
    return np.array([int(c.cluster) for c in client_states])


def initial_cluster_models(model, num_clusters: int, init_seed: int, init_std: float):
  """A TF computation of the G initial models: model g is the model's initialization
  for seed init_seed + g plus N(0, std^2) noise."""
  rng = np.random.default_rng(init_seed)
  initial = tuple(
      tuple((w + init_std * rng.standard_normal(w.shape)).astype(np.float32)
            for w in model.initial_weights(init_seed + g))
      for g in range(num_clusters))

  @tff.tensorflow.computation
  def initial_models():
    return tuple(tuple(tf.constant(w) for w in m) for m in initial)

  return initial_models


def select_model(models, index):
  """Model `index` (an int32 tensor) of a tuple of models, as a list of tensors."""
  return [tf.gather(tf.stack(layer), index) for layer in zip(*models)]


def build_clustered_process(model, feature_shape, config: LocalTrainingConfig, *,
                            name: str, num_clusters: int, selection_rounds: int,
                            after: str = "fedavg", lam: float = 0.0,
                            switch_round: Optional[int] = None,
                            selection_budget_share: float = DEFAULT_SELECTION_BUDGET_SHARE,
                            loss_clip: float = DEFAULT_LOSS_CLIP,
                            cluster_init_std: float = DEFAULT_CLUSTER_INIT_STD,
                            aggregator=None, init_seed: int = 0) -> ClusteredProcess:
  """Builds IFCA / an IFCA-preconditioned process (see module docstring).

  Args:
    model, feature_shape, config: as for `build_silo_process`.
    name: algorithm name.
    num_clusters: G >= 1.
    selection_rounds: rounds 0 .. selection_rounds - 1 select a cluster.
    after: what runs within the clusters afterwards, one of `AFTER_SELECTION`.
    lam: MR-MTL's regularization strength towards the cluster centroid (`mrmtl`).
    switch_round: `finetune` trains the cluster model while round <= switch_round.
    selection_budget_share: epsilon of one selection as a share of the silo's total
      epsilon (the driver composes it with DP-SGD's).
    loss_clip: per-example loss clip of the regression selection score.
    cluster_init_std: cluster g starts at the model's initialization for seed
      init_seed + g plus N(0, std^2) noise, so zero-initialized models differ.
    aggregator: a weighted `tff.aggregators` factory, one instance per cluster;
      default `MeanFactory` (weights: the public sizes; non-members weigh 0).
  """
  if int(num_clusters) != num_clusters or num_clusters < 1:
    raise ValueError(f"num_clusters (G) must be a positive integer, got {num_clusters}")
  if int(selection_rounds) != selection_rounds or selection_rounds < 1:
    raise ValueError(f"selection_rounds must be a positive integer, got {selection_rounds}")
  if after not in AFTER_SELECTION:
    raise ValueError(f"after must be one of {AFTER_SELECTION}, got {after!r}")
  if after == "finetune" and switch_round is None:
    raise ValueError("after='finetune' needs switch_round")
  if not 0.0 < selection_budget_share < 1.0:
    raise ValueError("selection_budget_share must be in (0, 1), got "
                     f"{selection_budget_share}")
  if not loss_clip > 0:
    raise ValueError(f"loss_clip must be positive, got {loss_clip}")
  if not cluster_init_std >= 0:
    raise ValueError(f"cluster_init_std must be >= 0, got {cluster_init_std}")
  lam = check_lambda(lam) if after == "mrmtl" else 0.0
  w_type = weights_type(model)
  data_type = silo_input_type(feature_shape)
  agg_process, weighted = create_aggregator(aggregator, w_type)
  if not weighted:
    raise TypeError("clustered processes need a weighted aggregation factory "
                    "(non-members of a cluster contribute with weight 0)")
  clusters_type = tff.StructWithPythonType([w_type] * num_clusters, tuple)
  client_state_type = tff.StructWithPythonType(
      [("personal", w_type), ("cluster", tff.TensorType(np.int32))], ClusterClientState)
  initial_clusters = initial_cluster_models(model, num_clusters, init_seed,
                                            cluster_init_std)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(ClusterServerState(
        cluster_weights=tff.federated_eval(initial_clusters, tff.SERVER),
        round_num=tff.federated_value(np.int32(0), tff.SERVER),
        aggregator=tff.federated_zip(tuple(
            agg_process.initialize() for _ in range(num_clusters)))))

  lam_t = np.float32(lam)

  @tff.tensorflow.computation(
      tff.StructWithPythonType([clusters_type, tff.TensorType(np.int32)], tuple),
      client_state_type, data_type)
  def client_update(broadcast, client_state, data):
    clusters, round_num = broadcast
    key = keys.fold_in(data.seed, round_num)

    def select():
      scores, sensitivity = selection_scores(model, clusters, data.x, data.y, loss_clip,
                                             public_size(data))
      private = lambda: report_noisy_min(
          scores, data.selection_epsilon, sensitivity,
          keys.derive(key, keys.SELECTION, 0))
      if config.private:  # a DP run never selects exactly
        with tf.control_dependencies([tf.debugging.assert_positive(
            data.selection_epsilon,
            message="DP training needs a positive selection_epsilon")]):
          return tf.identity(private())
      return tf.cond(data.selection_epsilon > 0.0, private,
                     lambda: tf.argmin(scores, output_type=tf.int32))

    selecting = round_num < selection_rounds
    cluster = tf.cond(selecting, select, lambda: client_state.cluster)
    center = select_model(clusters, cluster)
    personal = list(client_state.personal)
    if after == "fedavg":
      train_center = tf.constant(True)
    elif after == "finetune":
      train_center = round_num <= switch_round
    else:
      train_center = selecting
    begin = [tf.where(train_center, c, p) for c, p in zip(center, personal)]
    lam_now = tf.where(selecting, 0.0, lam_t)
    new = train_locally(model, config, begin, center, lam_now, data.x, data.y,
                        data.noise_multiplier, key, 0, data.size)
    delta = [a - b for a, b in zip(new, begin)]
    n = public_size(data)
    member = tf.one_hot(cluster, num_clusters)
    deltas = tuple(tuple(tf.where(tf.equal(cluster, g), d, tf.zeros_like(d))
                         for d in delta) for g in range(num_clusters))
    weights = tuple(n * member[g] for g in range(num_clusters))
    return (ClusterClientState(tuple(new), cluster), deltas, weights, member)

  @tff.tensorflow.computation(clusters_type, np.int32, clusters_type,
                              tff.TensorType(np.float32, [num_clusters]))
  def server_update(clusters, round_num, mean_deltas, counts):
    new = tuple(tuple(tf.where(counts[g] > 0.0, w + d, w) for w, d in zip(c, md))
                for g, (c, md) in enumerate(zip(clusters, mean_deltas)))
    return new, round_num + 1

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

  personal_from = {"fedavg": None, "local": selection_rounds,
                   "mrmtl": selection_rounds,
                   "finetune": None if switch_round is None else switch_round + 1}[after]
  return ClusteredProcess(
      initialize_fn, next_fn, name=name, model=model, config=config,
      epochs_per_round=config.epochs, personal_from_round=None,
      num_clusters=int(num_clusters), selection_rounds=int(selection_rounds),
      selection_budget_share=float(selection_budget_share),
      evaluate_personal_from=personal_from)


def build_ifca_process(model, feature_shape, *, client_learning_rate: float,
                       batch_size: int, total_rounds: int,
                       num_clusters: int = DEFAULT_NUM_CLUSTERS,
                       selection_fraction: float = DEFAULT_SELECTION_FRACTION,
                       after: str = "fedavg", lam: float = 0.0,
                       finetune_fraction: float = 0.5,
                       selection_budget_share: float = DEFAULT_SELECTION_BUDGET_SHARE,
                       local_epochs: int = 1, l2_norm_clip: Optional[float] = None,
                       sampling: str = "poisson", aggregator=None,
                       init_seed: int = 0) -> ClusteredProcess:
  """IFCA (`after='fedavg'`) or an IFCA-preconditioned method; selection in the
  first ceil(selection_fraction * total_rounds) rounds (1.0: every round).
  `finetune` switches to local training after floor(finetune_fraction * total)
  rounds (no earlier than the end of selection)."""
  config = _common.make_config(client_learning_rate, batch_size, local_epochs,
                               l2_norm_clip, sampling)
  selecting = selection_rounds(total_rounds, selection_fraction)
  switch = None
  if after == "finetune":
    if not 0.0 <= finetune_fraction <= 1.0:
      raise ValueError(f"finetune_fraction must be in [0, 1], got {finetune_fraction}")
    switch = max(selecting, int(total_rounds * finetune_fraction)) - 1
  name = "ifca" if after == "fedavg" else f"ifca_{after}"
  return build_clustered_process(
      model, feature_shape, config, name=name, num_clusters=num_clusters,
      selection_rounds=selecting, after=after, lam=lam, switch_round=switch,
      selection_budget_share=selection_budget_share, aggregator=aggregator,
      init_seed=init_seed)
