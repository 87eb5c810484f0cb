"""IFCA with private cluster selection and the IFCA-preconditioned methods (TF only).

IFCA (Ghosh et al. 2020; thesis app. B.3): the server holds G cluster models; in a
selection round every silo scores each cluster model on its training data, selects
one, trains it with (DP-)SGD and returns the update with its cluster index; the
server averages each cluster's updates (weighted by the silos' public sizes). Under
silo-specific example-level DP the selection is a query of the silo's data: it is made
with the exponential mechanism (`report_noisy_min`) on the error rate, sensitivity
1 / (m - 1) (thesis eq. B.1), or for regression on the mean loss clipped to
`loss_clip`, sensitivity loss_clip / (m - 1), with both means taken over the silo's
public size m (its n when sizes are public: `tff_silo.privacy.protocol`); its cost
(epsilon_select = share * epsilon per selection) is composed with DP-SGD's in the
driver's calibration.

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

As for the MR-MTL family (`rounds`), a `ClusteredAlgorithm` is the definition and
`cluster_client_round`, `select_cluster` and `cluster_server_step` what a silo and the
server compute; `tff_silo.backends.tff.clustered` builds the TFF process (the
reference) and `tff_silo.backends.vectorized.clustered` runs all silos as one TF
program. Client state:
the silo's personalized weights and its cluster index.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_silo import runner
from tff_silo.algorithms.local_training import (
    LocalTrainingConfig, check_trainable, make_config)
from tff_silo.algorithms.rounds import check_lambda, plain_mean
from tff_silo.privacy.selection import noisy_argmin

AFTER_SELECTION = ("fedavg", "local", "mrmtl", "finetune")
DEFAULT_NUM_CLUSTERS = 4
DEFAULT_SELECTION_FRACTION = 0.1
DEFAULT_SELECTION_BUDGET_SHARE = 0.03
DEFAULT_LOSS_CLIP = 1.0
DEFAULT_CLUSTER_INIT_STD = 0.01


def selection_rounds(total_rounds: int, selection_fraction: float) -> int:
  """ceil(fraction * T), at least 1: the rounds (from the first) that select."""
  if not 0.0 < selection_fraction <= 1.0:
    raise ValueError(f"selection_fraction must be in (0, 1], got {selection_fraction}")
  if int(total_rounds) != total_rounds or total_rounds < 1:
    raise ValueError(f"total_rounds must be a positive integer, got {total_rounds}")
  return max(1, math.ceil(selection_fraction * total_rounds - 1e-9))


def selection_scores(model, clusters, x, y, loss_clip: float, size=None, mask=None):
  """(scores [G], sensitivity): error counts over `size` m (default n) with
  sensitivity 1 / (m - 1) for classification, else per-example losses clipped to
  `loss_clip` summed over m, sensitivity loss_clip / (m - 1) (thesis eq. B.1). With
  a public m the sensitivity does not depend on the silo's true size. `mask` ([n]
  in {0, 1}) marks the real rows of a padded silo."""
  m = tf.cast(tf.shape(y)[0], tf.float32) if size is None else size
  scores = []
  for w in clusters:
    if model.metric == "accuracy":
      errors = 1.0 - model.metric_values(list(w), x, y)
    else:
      errors = tf.minimum(model.per_example_loss(list(w), x, y), loss_clip)
    if mask is not None:
      errors = errors * mask
    scores.append(tf.reduce_sum(errors) / m)
  bound = 1.0 if model.metric == "accuracy" else loss_clip
  return tf.stack(scores), bound / tf.maximum(m - 1.0, 1.0)


def choose(private: bool, scores, selection_epsilon, sensitivity, gumbel):
  """The selected cluster from `scores` ([..., G]): report-noisy-min with the given
  standard Gumbel noise where selection_epsilon > 0, the exact argmin where it is 0
  (never under DP: `private` asserts every epsilon is positive)."""
  eps = tf.convert_to_tensor(selection_epsilon, tf.float32)
  if private:
    with tf.control_dependencies([tf.debugging.assert_positive(
        eps, message="DP training needs a positive selection_epsilon")]):
      eps = tf.identity(eps)
  expand = lambda t: tf.expand_dims(t, -1)
  noisy = noisy_argmin(scores, expand(tf.where(eps > 0, eps, 1.0)), expand(sensitivity),
                       gumbel)
  if private:
    return noisy
  return tf.where(eps > 0, noisy, tf.argmin(scores, axis=-1, output_type=tf.int32))


def select_model(models, index):
  """Model `index` (an int32 tensor, or one per silo) of a tuple of models, as a list
  of tensors."""
  return [tf.gather(tf.stack(layer), index) for layer in zip(*models)]


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """What a silo and the server do in one round of a clustered method (see
  `clustered_algorithm` for the attributes)."""

  num_clusters: int
  selection_rounds: int
  after: str = "fedavg"
  lam: float = 0.0
  switch_round: Optional[int] = None
  loss_clip: float = DEFAULT_LOSS_CLIP

  @property
  def personal_from_round(self) -> Optional[int]:
    """Rounds completed after which silos are evaluated with their own model."""
    return {"fedavg": None, "local": self.selection_rounds,
            "mrmtl": self.selection_rounds,
            "finetune": None if self.switch_round is None else self.switch_round + 1
            }[self.after]


def cluster_client_round(spec: ClusterSpec, clusters, personal_w, cluster, round_num,
                         select, train, lam=None):
  """(personal weights, cluster, delta) of a silo's round. `clusters`: the G models,
  or a function of the clusters selected giving each silo's centre (the vectorized
  backend's stacked runs); `select()` returns the privately selected cluster;
  `train(begin, anchor, lam)` runs local training from `begin` regularized towards
  `anchor` with `lam` (default `spec.lam`; one per silo when stacked). Tensors may
  carry a leading silo axis (the vectorized backend; `cluster` then [K]) or not (one
  TFF client)."""
  selecting = round_num < spec.selection_rounds
  cluster = tf.cond(selecting, select, lambda: tf.identity(cluster))
  center = clusters(cluster) if callable(clusters) else select_model(clusters, cluster)
  if spec.after == "fedavg":
    train_center = tf.constant(True)
  elif spec.after == "finetune":
    train_center = round_num <= spec.switch_round
  else:
    train_center = selecting
  begin = [tf.where(train_center, c, p) for c, p in zip(center, personal_w)]
  lam = tf.where(selecting, 0.0, np.float32(spec.lam) if lam is None else lam)
  new = train(begin, center, lam)
  return new, cluster, [a - b for a, b in zip(new, begin)]


def cluster_server_step(clusters, mean_deltas, counts):
  """New cluster models: each moves by its members' mean delta; a cluster without
  members (count 0) keeps its model."""
  return tuple(tuple(tf.where(counts[g] > 0.0, w + d, w) for w, d in zip(c, md))
               for g, (c, md) in enumerate(zip(clusters, mean_deltas)))


def initial_cluster_weights(model, num_clusters: int, init_seed: int,
                            init_std: float) -> tuple:
  """The G initial models (numpy): model g is the model's initialization for seed
  init_seed + g plus N(0, std^2) noise."""
  rng = np.random.default_rng(init_seed)
  return tuple(
      tuple((w + init_std * rng.standard_normal(w.shape)).astype(np.float32)
            for w in model.initial_weights(init_seed + g))
      for g in range(num_clusters))


@dataclasses.dataclass(frozen=True)
class ClusteredAlgorithm:
  """IFCA or an IFCA-preconditioned method as data (see `clustered_algorithm`)."""

  name: str
  model: object
  feature_shape: tuple
  config: LocalTrainingConfig
  cluster_spec: ClusterSpec
  selection_budget_share: float = DEFAULT_SELECTION_BUDGET_SHARE
  cluster_init_std: float = DEFAULT_CLUSTER_INIT_STD
  aggregator: object = None
  init_seed: int = 0

  @property
  def num_clusters(self) -> int:
    return self.cluster_spec.num_clusters

  @property
  def epochs_per_round(self) -> int:
    return self.config.epochs

  @property
  def aggregation(self) -> Optional[str]:
    return plain_mean(self.aggregator)

  @property
  def initial_weights(self) -> tuple:
    """The G cluster models' initial weights."""
    return initial_cluster_weights(self.model, self.num_clusters, self.init_seed,
                                   self.cluster_init_std)

  def num_selections(self, rounds: int) -> int:
    return min(rounds, self.cluster_spec.selection_rounds)

  def uses_client_state(self, rounds_done: int) -> bool:
    start = self.cluster_spec.personal_from_round
    return start is not None and rounds_done > start


runner.register(ClusteredAlgorithm, tff="tff_silo.backends.tff.clustered:runner",
                vectorized="tff_silo.backends.vectorized.clustered:"
                "VectorizedClusteredProcess")


def clustered_algorithm(model, feature_shape, config: LocalTrainingConfig, *,
                        name: str, num_clusters: int, selection_rounds: int,
                        after: str = "fedavg", lam: float = 0.0,
                        switch_round: Optional[int] = None,
                        selection_budget_share: float = DEFAULT_SELECTION_BUDGET_SHARE,
                        loss_clip: float = DEFAULT_LOSS_CLIP,
                        cluster_init_std: float = DEFAULT_CLUSTER_INIT_STD,
                        aggregator=None, init_seed: int = 0) -> ClusteredAlgorithm:
  """A checked `ClusteredAlgorithm` (see module docstring).

  Args:
    model, feature_shape, config: as for `rounds.silo_algorithm`.
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
    aggregator: None / "mean" (the mean weighted by public sizes; non-members weigh
      0) or a weighted `tff.aggregators` factory, one instance per cluster (which
      only the TFF runtime runs).
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
  if isinstance(aggregator, str) and aggregator != "mean":
    raise ValueError("aggregator of a clustered method must be 'mean' or a weighted "
                     f"tff.aggregators factory, got {aggregator!r}")
  if plain_mean(aggregator) == "unweighted_mean":
    raise TypeError("clustered processes need a weighted aggregation factory "
                    "(non-members of a cluster contribute with weight 0)")
  check_trainable(model, config)
  lam = check_lambda(lam) if after == "mrmtl" else 0.0
  spec = ClusterSpec(int(num_clusters), int(selection_rounds), after, lam, switch_round,
                     float(loss_clip))
  return ClusteredAlgorithm(name, model, tuple(feature_shape), config, spec,
                            float(selection_budget_share), float(cluster_init_std),
                            aggregator, init_seed)


def ifca_algorithm(model, feature_shape, *, client_learning_rate: float,
                   batch_size: int, total_rounds: int,
                   num_clusters: int = DEFAULT_NUM_CLUSTERS,
                   selection_fraction: float = DEFAULT_SELECTION_FRACTION,
                   after: str = "fedavg", lam: float = 0.0,
                   finetune_fraction: float = 0.5,
                   selection_budget_share: float = DEFAULT_SELECTION_BUDGET_SHARE,
                   local_epochs: int = 1, l2_norm_clip: Optional[float] = None,
                   sampling: str = "poisson", aggregator=None,
                   init_seed: int = 0) -> ClusteredAlgorithm:
  """IFCA (`after='fedavg'`) or an IFCA-preconditioned method; selection in the
  first ceil(selection_fraction * total_rounds) rounds (1.0: every round).
  `finetune` switches to local training after floor(finetune_fraction * total)
  rounds (no earlier than the end of selection)."""
  config = make_config(client_learning_rate, batch_size, local_epochs,
                       l2_norm_clip, sampling)
  selecting = selection_rounds(total_rounds, selection_fraction)
  switch = None
  if after == "finetune":
    if not 0.0 <= finetune_fraction <= 1.0:
      raise ValueError(f"finetune_fraction must be in [0, 1], got {finetune_fraction}")
    switch = max(selecting, int(total_rounds * finetune_fraction)) - 1
  name = "ifca" if after == "fedavg" else f"ifca_{after}"
  return clustered_algorithm(
      model, feature_shape, config, name=name, num_clusters=num_clusters,
      selection_rounds=selecting, after=after, lam=lam, switch_round=switch,
      selection_budget_share=selection_budget_share, aggregator=aggregator,
      init_seed=init_seed)
