"""The TFF iterative process shared by the MR-MTL family (stateful clients).

TFF's `LearningProcess` cannot return client-placed values, so, as in TFF's
`examples/stateful_clients`, the process is a `tff.templates.IterativeProcess` whose

    next(server_state@SERVER, client_states@CLIENTS, client_data@CLIENTS)
        -> (server_state@SERVER, client_states@CLIENTS, metrics@SERVER)

Client state: the silo's personalized weights w_k. Server state: the global (mean)
model w_bar, the round number and the aggregator's state. Client data: the silo's
tensors plus its own DP noise multiplier and seed (`SiloInput`).

Every round (thesis app. C.1, Algorithm 1): the server broadcasts w_bar; each silo
picks its start point (its w_k, or w_bar), runs `train_locally` regularized towards
w_bar, and returns delta = w_new - w_start with the weight of its public size m_k
(n_k when sizes are public, the same for every silo otherwise: see
`tff_silo.privacy.protocol`); the aggregator (weighted mean by default, any
`tff.aggregators` factory) averages the deltas and the server adds the result to
w_bar. The methods differ only in the start point, lambda, and
which model is evaluated; Ditto also trains w_bar's copy for one more epoch.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally

START_POINTS = ("personal", "global", "switch")


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


class ServerState(NamedTuple):
  global_weights: tuple
  round_num: np.int32
  aggregator: object


class ClientOutput(NamedTuple):
  personal: tuple
  delta: tuple
  weight: np.float32


@dataclasses.dataclass(frozen=True)
class RoundSpec:
  """What a silo and the server do in one round of the MR-MTL family, whatever runs
  it (`client_round`, `server_step`; the TFF process and `tff_silo.vectorized`).

  Attributes: see `build_silo_process`.
  """

  lam: float = 0.0
  start: str = "personal"
  switch_round: Optional[int] = None
  ditto: bool = False
  global_update_rounds: Optional[int] = None


def client_round(spec: RoundSpec, global_w, personal_w, round_num, train):
  """(personal weights, delta) of a silo's round: `train(start, lam, pass_)` runs its
  local training regularized towards `global_w`. Tensors may carry a leading silo
  axis (the vectorized backend) or not (one TFF client)."""
  global_w, personal_w = list(global_w), list(personal_w)
  if spec.ditto:
    new_global = train(global_w, 0.0, 0)
    personal = train(personal_w, np.float32(spec.lam), 1)
    return personal, [a - b for a, b in zip(new_global, global_w)]
  if spec.start == "personal":
    begin = personal_w
  elif spec.start == "global":
    begin = global_w
  else:
    use_global = round_num <= spec.switch_round
    begin = [tf.where(use_global, g, p) for g, p in zip(global_w, personal_w)]
  personal = train(begin, np.float32(spec.lam), 0)
  return personal, [a - b for a, b in zip(personal, begin)]


def server_step(spec: RoundSpec, global_w, round_num, mean_delta):
  """(new global weights, round + 1): w_bar += mean delta, until
  `global_update_rounds`."""
  apply = tf.constant(True) if spec.global_update_rounds is None else (
      round_num < spec.global_update_rounds)
  scale = tf.cast(apply, tf.float32)
  return tuple(g + scale * d for g, d in zip(global_w, mean_delta)), round_num + 1


class SiloProcess(tff.templates.IterativeProcess):
  """An `IterativeProcess` with stateful clients and what the driver needs to know.

  Attributes (beyond `initialize` / `next`):
    name: algorithm name.
    model: the `SiloModel` trained.
    config: the `LocalTrainingConfig`.
    epochs_per_round: local epochs each silo's data is queried for per round (the
      accounting uses it: Ditto queries twice as many as MR-MTL).
    personal_from_round: rounds completed after which a silo's personalized model is
      its client state; before that (or when None) it is the global model.
    round_spec: the `RoundSpec` of the MR-MTL family (None for other processes).
    initial_weights: the global model's initial weights (numpy).
    aggregation: `weighted_mean` or `unweighted_mean` when the aggregator is TFF's
      plain mean (what `tff_silo.vectorized` computes natively), else None.
  """

  round_spec: Optional[RoundSpec] = None
  initial_weights: Optional[tuple] = None
  aggregation: Optional[str] = None

  selection_budget_share = 0.0  # epsilon share of one private selection (IFCA)
  num_clusters = 1

  def __init__(self, initialize_fn, next_fn, *, name, model, config, epochs_per_round,
               personal_from_round: Optional[int]):
    super().__init__(initialize_fn, next_fn, next_is_multi_arg=True)
    self.name = name
    self.model = model
    self.config = config
    self.epochs_per_round = epochs_per_round
    self.personal_from_round = personal_from_round

  def prepare(self, inputs: list) -> list:
    """The client data `next` takes: the list of `SiloInput`s itself."""
    return inputs

  def uses_client_state(self, rounds_done: int) -> bool:
    return self.personal_from_round is not None and rounds_done > self.personal_from_round

  def num_selections(self, rounds: int) -> int:
    """Private cluster selections per silo in `rounds` rounds (none here)."""
    del rounds
    return 0

  def initial_client_states(self, state, num_silos: int) -> list:
    return [state.global_weights] * num_silos

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    """The model each silo is evaluated with after `rounds_done` rounds."""
    if self.uses_client_state(rounds_done):
      return list(client_states)
    return [state.global_weights] * len(client_states)

  def cluster_assignments(self, client_states):
    """Each silo's cluster index, or None for a process without clusters."""
    del client_states
    return None


def weights_type(model) -> tff.Type:
  return tff.StructWithPythonType(
      [tff.TensorType(np.float32, shape) for shape in model.weight_shapes], tuple)


def silo_input_type(feature_shape) -> tff.Type:
  return tff.StructWithPythonType(
      [("x", tff.TensorType(np.float32, [None, *feature_shape])),
       ("y", tff.TensorType(np.float32, [None])),
       ("noise_multiplier", tff.TensorType(np.float32)),
       ("seed", tff.TensorType(np.int32, [2])),
       ("selection_epsilon", tff.TensorType(np.float32)),
       ("size", tff.TensorType(np.float32))], SiloInput)


def public_size(data):
  """The silo's public size m (`SiloInput.size`), or its n when that is 0."""
  return tf.where(data.size > 0, data.size, tf.cast(tf.shape(data.y)[0], tf.float32))


def check_lambda(lam: float) -> float:
  if not (lam >= 0 and np.isfinite(lam)):
    raise ValueError(f"lam (the mean-regularization strength) must be a finite "
                     f"number >= 0, got {lam}")
  return float(lam)


def plain_mean(aggregator) -> Optional[str]:
  """`weighted_mean` / `unweighted_mean` for None or TFF's mean factories with plain
  sums inside; None for any other factory."""
  if aggregator is None:
    return "weighted_mean"
  sums = lambda *fs: all(type(f) is tff.aggregators.SumFactory for f in fs)
  if type(aggregator) is tff.aggregators.MeanFactory and sums(
      aggregator._value_sum_factory, aggregator._weight_sum_factory):
    return "weighted_mean"
  if type(aggregator) is tff.aggregators.UnweightedMeanFactory and sums(
      aggregator._value_sum_factory, aggregator._count_sum_factory):
    return "unweighted_mean"
  return None


def create_aggregator(aggregator, w_type):
  """(aggregation process, weighted?) for a factory; default weighted `MeanFactory`."""
  aggregator = tff.aggregators.MeanFactory() if aggregator is None else aggregator
  if isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    return aggregator.create(w_type, tff.TensorType(np.float32)), True
  if isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    return aggregator.create(w_type), False
  raise TypeError("aggregator must be a tff.aggregators.WeightedAggregationFactory or "
                  f"UnweightedAggregationFactory, got {type(aggregator).__name__}")


def build_silo_process(model, feature_shape, config: LocalTrainingConfig, *,
                       name: str, lam: float = 0.0, start: str = "personal",
                       switch_round: Optional[int] = None, ditto: bool = False,
                       global_update_rounds: Optional[int] = None,
                       personal_from_round: Optional[int] = 0,
                       aggregator=None, init_seed: int = 0) -> SiloProcess:
  """Builds the process; the public `build_<algo>_process` functions call this.

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
    personal_from_round: see `SiloProcess`.
    aggregator: a `tff.aggregators` weighted or unweighted factory; default
      `tff.aggregators.MeanFactory()` (weights: the silos' public sizes).
    init_seed: seed of the initial weights.
  """
  lam = check_lambda(lam)
  if start not in START_POINTS:
    raise ValueError(f"start must be one of {START_POINTS}, got {start!r}")
  if start == "switch" and switch_round is None:
    raise ValueError("start='switch' needs switch_round")
  spec = RoundSpec(lam, start, switch_round, ditto, global_update_rounds)
  w_type = weights_type(model)
  data_type = silo_input_type(feature_shape)
  agg_process, weighted = create_aggregator(aggregator, w_type)
  initial = model.initial_weights(init_seed)

  @tff.tensorflow.computation
  def initial_weights():
    return tuple(tf.constant(w) for w in initial)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(ServerState(
        global_weights=tff.federated_eval(initial_weights, tff.SERVER),
        round_num=tff.federated_value(np.int32(0), tff.SERVER),
        aggregator=agg_process.initialize()))

  @tff.tensorflow.computation(
      tff.StructWithPythonType([w_type, tff.TensorType(np.int32)], tuple), w_type, data_type)
  def client_update(broadcast, personal_w, data):
    global_w, round_num = broadcast
    key = keys.fold_in(data.seed, round_num)
    train = lambda w, lam_value, pass_: train_locally(
        model, config, w, list(global_w), lam_value, data.x, data.y,
        data.noise_multiplier, key, pass_, data.size)
    personal, delta = client_round(spec, global_w, personal_w, round_num, train)
    return ClientOutput(tuple(personal), tuple(delta), public_size(data))

  @tff.tensorflow.computation(w_type, np.int32, w_type)
  def server_update(global_w, round_num, mean_delta):
    return server_step(spec, global_w, round_num, mean_delta)

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(w_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_states, client_data):
    broadcast = tff.federated_broadcast(
        tff.federated_zip((state.global_weights, state.round_num)))
    outputs = tff.federated_map(client_update, tff.federated_zip(
        (broadcast, client_states, client_data)))
    if weighted:
      agg = agg_process.next(state.aggregator, outputs.delta, outputs.weight)
    else:
      agg = agg_process.next(state.aggregator, outputs.delta)
    new_global, new_round = tff.federated_map(server_update, tff.federated_zip(
        (state.global_weights, state.round_num, agg.result)))
    new_state = tff.federated_zip(ServerState(new_global, new_round, agg.state))
    metrics = tff.federated_zip(collections.OrderedDict(aggregator=agg.measurements))
    return new_state, outputs.personal, metrics

  process = SiloProcess(initialize_fn, next_fn, name=name, model=model, config=config,
                        epochs_per_round=config.epochs * (2 if ditto else 1),
                        personal_from_round=personal_from_round)
  process.round_spec, process.initial_weights = spec, initial
  process.aggregation = plain_mean(aggregator)
  return process
