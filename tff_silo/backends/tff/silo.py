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
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.runner import SiloModels
from tff_silo.algorithms.local_training import train_locally
from tff_silo.algorithms.rounds import (
    SiloAlgorithm, SiloInput, client_round, public_size, server_step)


class ServerState(NamedTuple):
  global_weights: tuple
  round_num: np.int32
  aggregator: object


class ClientOutput(NamedTuple):
  personal: tuple
  delta: tuple
  weight: np.float32


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
    algorithm: the definition it runs (`SiloAlgorithm`, `ifca.ClusteredAlgorithm`).
  """

  algorithm: Optional[SiloAlgorithm] = None

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

  def evaluation_weights(self, state, client_states, rounds_done: int) -> SiloModels:
    """The model each silo is evaluated with after `rounds_done` rounds."""
    if self.uses_client_state(rounds_done):
      return SiloModels.of(list(client_states))
    return SiloModels(tuple(np.asarray(w, np.float32)[None] for w in state.global_weights),
                      (np.zeros(len(client_states), np.int32),))

  def cluster_assignments(self, client_states):
    """Each silo's cluster index, or None for a process without clusters."""
    del client_states
    return None

  def server_models(self, state) -> list:
    """Per run (one here), the server's models: (the global model,)."""
    return [(tuple(np.asarray(w) for w in state.global_weights),)]


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


def create_aggregator(aggregator, w_type):
  """(aggregation process, weighted?) for a factory or name; default (None, "mean")
  the weighted `MeanFactory`."""
  if aggregator is None or aggregator == "mean":
    aggregator = tff.aggregators.MeanFactory()
  elif aggregator == "unweighted_mean":
    aggregator = tff.aggregators.UnweightedMeanFactory()
  if isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    return aggregator.create(w_type, tff.TensorType(np.float32)), True
  if isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    return aggregator.create(w_type), False
  raise TypeError("aggregator must be a tff.aggregators.WeightedAggregationFactory or "
                  f"UnweightedAggregationFactory, got {type(aggregator).__name__}")


def runner(process) -> SiloProcess:
  """The registered TFF runner of a `SiloAlgorithm`: `process` itself when it is one
  already built, else `process_for(process)`."""
  return process if isinstance(process, SiloProcess) else process_for(process)


def process_for(algorithm: SiloAlgorithm) -> SiloProcess:
  """The TFF `IterativeProcess` running `algorithm` (the reference runtime): every
  round (Algorithm 1) the server broadcasts w_bar, each silo runs `client_round`,
  the aggregator averages the deltas and the server applies `server_step`."""
  model, config, spec = algorithm.model, algorithm.config, algorithm.round_spec
  w_type = weights_type(model)
  data_type = silo_input_type(algorithm.feature_shape)
  agg_process, weighted = create_aggregator(algorithm.aggregator, w_type)
  initial = algorithm.initial_weights

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

  process = SiloProcess(initialize_fn, next_fn, name=algorithm.name, model=model,
                        config=config, epochs_per_round=algorithm.epochs_per_round,
                        personal_from_round=algorithm.personal_from_round)
  process.algorithm = algorithm
  return process
