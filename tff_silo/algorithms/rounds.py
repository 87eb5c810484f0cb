"""What one round of the MR-MTL family does, without TFF (thesis app. C.1, Algorithm 1).

A `SiloAlgorithm` is the definition of local training, FedAvg, finetuning, MR-MTL or
Ditto: the model, the local-training settings and the `RoundSpec` (start point,
lambda, Ditto's second pass, when the server stops). `client_round` and
`server_step` say what a silo and the server compute from it. Two runtimes execute a
definition (registered with `tff_silo.runner`): `tff_silo.backends.tff` builds the
TFF `IterativeProcess` (the reference) and `tff_silo.backends.vectorized` runs all
silos as one TensorFlow program; neither has its own copy of the round, and a
vectorized run never imports TFF.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tff_silo import runner
from tff_silo.algorithms import local_training
from tff_silo.algorithms.local_training import LocalTrainingConfig

START_POINTS = ("personal", "global", "switch")
AGGREGATOR_NAMES = ("mean", "unweighted_mean")


class SiloInput(NamedTuple):
  """A silo's client data: its training tensors, DP noise multiplier and key (the
  silo's int32[2] key, `tff_silo.keys.unit_key`), the epsilon of each private
  cluster selection (0: exact selection; IFCA only), and the silo's public size: what
  its Poisson sampling and its weight in the server mean use (0: its n; see
  `tff_silo.privacy.protocol`)."""
  x: np.ndarray
  y: np.ndarray
  noise_multiplier: np.float32
  seed: np.ndarray  # int32[2]
  selection_epsilon: np.float32 = np.float32(0.0)
  size: np.float32 = np.float32(0.0)


@dataclasses.dataclass(frozen=True)
class RoundSpec:
  """What a silo and the server do in one round of the MR-MTL family, whatever runs
  it (`client_round`, `server_step`; the TFF process and the vectorized round).

  Attributes: see `silo_algorithm`.
  """

  lam: float = 0.0
  start: str = "personal"
  switch_round: Optional[int] = None
  ditto: bool = False
  global_update_rounds: Optional[int] = None


def client_round(spec: RoundSpec, global_w, personal_w, round_num, train, lam=None):
  """(personal weights, delta) of a silo's round: `train(start, lam, pass_)` runs its
  local training regularized towards `global_w`, with `lam` (default `spec.lam`; the
  vectorized backend's stacked runs give one per silo). Tensors may carry a leading
  silo axis (the vectorized backend) or not (one TFF client)."""
  global_w, personal_w = list(global_w), list(personal_w)
  lam = np.float32(spec.lam) if lam is None else lam
  if spec.ditto:
    new_global = train(global_w, 0.0, 0)
    personal = train(personal_w, lam, 1)
    return personal, [a - b for a, b in zip(new_global, global_w)]
  if spec.start == "personal":
    begin = personal_w
  elif spec.start == "global":
    begin = global_w
  else:
    use_global = round_num <= spec.switch_round
    begin = [tf.where(use_global, g, p) for g, p in zip(global_w, personal_w)]
  personal = train(begin, lam, 0)
  return personal, [a - b for a, b in zip(personal, begin)]


def server_step(spec: RoundSpec, global_w, round_num, mean_delta):
  """(new global weights, round + 1): w_bar += mean delta, until
  `global_update_rounds`."""
  apply = tf.constant(True) if spec.global_update_rounds is None else (
      round_num < spec.global_update_rounds)
  scale = tf.cast(apply, tf.float32)
  return tuple(g + scale * d for g, d in zip(global_w, mean_delta)), round_num + 1


def public_size(data):
  """The silo's public size m (`local_training.public_size` of its `SiloInput`)."""
  return local_training.public_size(data.size, tf.shape(data.y)[0])


def check_lambda(lam: float) -> float:
  if not (lam >= 0 and np.isfinite(lam)):
    raise ValueError(f"lam (the mean-regularization strength) must be a finite "
                     f"number >= 0, got {lam}")
  return float(lam)


def plain_mean(aggregator) -> Optional[str]:
  """`weighted_mean` / `unweighted_mean` for the plain means (None or "mean", or
  "unweighted_mean", or TFF's mean factories with plain sums inside); None for any
  other `tff.aggregators` factory."""
  if aggregator is None or aggregator == "mean":
    return "weighted_mean"
  if aggregator == "unweighted_mean":
    return "unweighted_mean"
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  sums = lambda *fs: all(type(f) is tff.aggregators.SumFactory for f in fs)
  if type(aggregator) is tff.aggregators.MeanFactory and sums(
      aggregator._value_sum_factory, aggregator._weight_sum_factory):
    return "weighted_mean"
  if type(aggregator) is tff.aggregators.UnweightedMeanFactory and sums(
      aggregator._value_sum_factory, aggregator._count_sum_factory):
    return "unweighted_mean"
  return None


@dataclasses.dataclass(frozen=True)
class SiloAlgorithm:
  """A method of the MR-MTL family as data (see `silo_algorithm`).

  Attributes: name, model (`SiloModel`), feature_shape, config
  (`LocalTrainingConfig`), round_spec (`RoundSpec`), personal_from_round (rounds
  completed after which a silo is evaluated with its own model; None: always the
  global one), aggregator (None or "mean": the mean weighted by public sizes;
  "unweighted_mean"; or a `tff.aggregators` factory, which only the TFF runtime
  runs) and init_seed (of the initial weights).
  """

  name: str
  model: object
  feature_shape: tuple
  config: LocalTrainingConfig
  round_spec: RoundSpec
  personal_from_round: Optional[int] = 0
  aggregator: object = None
  init_seed: int = 0

  selection_budget_share = 0.0   # no private selections in this family
  num_clusters = 1

  @property
  def epochs_per_round(self) -> int:
    """Epochs each silo's data is queried for per round (Ditto: twice)."""
    return self.config.epochs * (2 if self.round_spec.ditto else 1)

  @property
  def initial_weights(self) -> tuple:
    return self.model.initial_weights(self.init_seed)

  @property
  def aggregation(self) -> Optional[str]:
    return plain_mean(self.aggregator)

  def uses_client_state(self, rounds_done: int) -> bool:
    return self.personal_from_round is not None and rounds_done > self.personal_from_round

  def num_selections(self, rounds: int) -> int:
    del rounds
    return 0


runner.register(SiloAlgorithm, tff="tff_silo.backends.tff.silo:runner",
                vectorized="tff_silo.backends.vectorized.family:VectorizedProcess")


def silo_algorithm(model, feature_shape, config: LocalTrainingConfig, *, name: str,
                   lam: float = 0.0, start: str = "personal",
                   switch_round: Optional[int] = None, ditto: bool = False,
                   global_update_rounds: Optional[int] = None,
                   personal_from_round: Optional[int] = 0, aggregator=None,
                   init_seed: int = 0) -> SiloAlgorithm:
  """A checked `SiloAlgorithm`.

  Args:
    model, feature_shape: the `SiloModel` and the silo features' shape.
    config: local training settings (DP when `config.l2_norm_clip` is set).
    name: algorithm name.
    lam: mean-regularization strength towards the broadcast global model.
    start: `personal` (continue w_k), `global` (restart from w_bar each round), or
      `switch` (w_bar while round <= switch_round, then w_k: local finetuning).
    ditto: also train a copy of w_bar without regularization (Ditto's global solver),
      whose delta is the one aggregated.
    global_update_rounds: the server stops updating w_bar after this many rounds.
    personal_from_round: see `SiloAlgorithm`.
    aggregator: None / "mean", "unweighted_mean" or a `tff.aggregators` factory.
    init_seed: seed of the initial weights.
  """
  lam = check_lambda(lam)
  if start not in START_POINTS:
    raise ValueError(f"start must be one of {START_POINTS}, got {start!r}")
  if start == "switch" and switch_round is None:
    raise ValueError("start='switch' needs switch_round")
  if isinstance(aggregator, str) and aggregator not in AGGREGATOR_NAMES:
    raise ValueError(f"aggregator must be one of {AGGREGATOR_NAMES} or a "
                     f"tff.aggregators factory, got {aggregator!r}")
  return SiloAlgorithm(name, model, tuple(feature_shape), config,
                       RoundSpec(lam, start, switch_round, ditto, global_update_rounds),
                       personal_from_round, aggregator, init_seed)
