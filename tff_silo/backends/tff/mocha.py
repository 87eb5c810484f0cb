"""The TFF iterative process of Mocha (`tff_silo.algorithms.mocha`).

Server state: W (every silo's model, K rows per layer), Omega (K x K) and the round
number. Client state: the silo's model w_k and its row k. Every round the server
computes each silo's regularizer input (`mocha.pulls`) and broadcasts it; each silo
reads its own row, trains with `train_locally` on its penalty (`mocha.regularizer`)
and sends its new model in its row of a K-row zero tensor; the sum of those is the
new W, from which the server sets Omega (`mocha.relationship`).
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import keys
from tff_silo.runner import SiloModels
from tff_silo.algorithms import mocha
from tff_silo.algorithms.local_training import train_locally
from tff_silo.backends.tff.silo import SiloProcess, silo_input_type


class MochaServerState(NamedTuple):
  models: tuple         # per layer [K, ...]: W
  relationship: object  # [K, K]: Omega
  round_num: np.int32


class MochaClientState(NamedTuple):
  personal: tuple
  index: np.int32       # the silo's row of W and Omega


class MochaProcess(SiloProcess):
  """The `SiloProcess` of a `MochaAlgorithm` (each silo evaluated with its own
  model; no server model)."""

  def __init__(self, initialize_fn, next_fn, *, algorithm: mocha.MochaAlgorithm):
    super().__init__(initialize_fn, next_fn, name=algorithm.name, model=algorithm.model,
                     config=algorithm.config, epochs_per_round=algorithm.epochs_per_round,
                     personal_from_round=0)
    self.algorithm = algorithm

  def prepare(self, inputs: list) -> list:
    self.algorithm.check_silos(len(inputs))
    return inputs

  def initial_client_states(self, state, num_silos: int) -> list:
    return [MochaClientState(tuple(w[k] for w in state.models), np.int32(k))
            for k in range(num_silos)]

  def evaluation_weights(self, state, client_states, rounds_done: int) -> SiloModels:
    del state, rounds_done
    return SiloModels.of([tuple(s.personal) for s in client_states])

  def server_models(self, state) -> list:
    """Per run (one here): no server model (see `MochaServerState`)."""
    del state
    return [()]


def runner(process) -> MochaProcess:
  return process if isinstance(process, MochaProcess) else process_for(process)


def process_for(algorithm: mocha.MochaAlgorithm) -> MochaProcess:
  """The TFF process running `algorithm` on its `num_silos` silos."""
  model, config, lam = algorithm.model, algorithm.config, algorithm.lam
  num_silos = algorithm.num_silos
  layer_types = [tff.TensorType(np.float32, shape) for shape in model.weight_shapes]
  w_type = tff.StructWithPythonType(layer_types, tuple)
  rows_type = tff.StructWithPythonType(
      [tff.TensorType(np.float32, [num_silos, *shape]) for shape in model.weight_shapes],
      tuple)
  omega_type = tff.TensorType(np.float32, [num_silos, num_silos])
  data_type = silo_input_type(algorithm.feature_shape)
  client_state_type = tff.StructWithPythonType(
      [("personal", w_type), ("index", tff.TensorType(np.int32))], MochaClientState)
  initial = algorithm.initial_weights

  @tff.tensorflow.computation
  def initial_server():
    return (tuple(tf.tile(tf.constant(w)[None], [num_silos] + [1] * w.ndim)
                  for w in initial),
            tf.constant(mocha.initial_relationship(num_silos)))

  @tff.federated_computation
  def initialize_fn():
    models, omega = tff.federated_eval(initial_server, tff.SERVER)
    return tff.federated_zip(MochaServerState(
        models, omega, tff.federated_value(np.int32(0), tff.SERVER)))

  @tff.tensorflow.computation(rows_type, omega_type)
  def server_pulls(models, omega):
    diag, pull = mocha.pulls(omega[None], [w[None] for w in models])
    return diag[0], tuple(p[0] for p in pull)

  broadcast_type = tff.StructWithPythonType(
      [tff.TensorType(np.float32, [num_silos]), rows_type, tff.TensorType(np.int32)],
      tuple)

  @tff.tensorflow.computation(broadcast_type, client_state_type, data_type)
  def client_update(broadcast, client_state, data):
    diag, pull, round_num = broadcast
    k = client_state.index
    strength, anchor = mocha.regularizer(lam, diag[k], [p[k] for p in pull])
    new = train_locally(model, config, list(client_state.personal), anchor, strength,
                        data.x, data.y, data.noise_multiplier,
                        keys.fold_in(data.seed, round_num), 0, data.size)
    placed = tuple(tf.scatter_nd([[k]], w[None], [num_silos, *w.shape]) for w in new)
    return MochaClientState(tuple(new), k), placed

  @tff.tensorflow.computation(rows_type, np.int32)
  def server_update(models, round_num):
    omega = mocha.relationship([w[None] for w in models], [num_silos])[0]
    return MochaServerState(models, omega, round_num + 1)

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(client_state_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_states, client_data):
    diag, pull = tff.federated_map(server_pulls, tff.federated_zip(
        (state.models, state.relationship)))
    broadcast = tff.federated_broadcast(tff.federated_zip((diag, pull, state.round_num)))
    new_states, placed = tff.federated_map(client_update, tff.federated_zip(
        (broadcast, client_states, client_data)))
    new_state = tff.federated_map(server_update, tff.federated_zip(
        (tff.federated_sum(placed), state.round_num)))
    return new_state, new_states, tff.federated_value(collections.OrderedDict(),
                                                      tff.SERVER)

  return MochaProcess(initialize_fn, next_fn, algorithm=algorithm)
