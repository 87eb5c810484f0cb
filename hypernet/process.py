"""HyperNetFL training as a TFF iterative process (Nemala et al., CIKM'23, Algorithm 1;
pFedHN, Shamsian et al., ICML'21).

The server holds phi and the embedding table. One round, for the sampled users:
1. `tff.federated_select` sends each user its own generated weights
   theta_u = h(phi, v_u) (keyed by the user's id);
2. the user runs K local SGD steps and returns Delta theta_u = theta_K - theta_u
   (`hypernet.algorithm.local_delta`, lines 8-11);
3. Delta theta_u is mapped to the hypernetwork's space by the vector-Jacobian product
   (grad_phi theta_u)^T Delta theta_u (line 12). This is server work on one user's
   update; TFF aggregators consume CLIENTS-placed values, so the product runs in the
   per-user map with phi and v_u sent along (phi is the mechanism's released output,
   and v_u the user's own row), before any aggregation;
4. the aggregator (any weighted `tff.aggregators` factory; UDP-Alg uses
   `UserLevelDPMeanFactory`: clip to S, weight w_u, divide by q W, add noise) gives the
   phi step f, and phi <- phi + lambda f (lines 13-15);
5. each sampled embedding moves by its own product: v_u <- v_u + zeta (grad_v theta_u)^T
   Delta theta_u (line 16), summed on the server from per-user rows of a dense table.

Signs: Delta theta_u points downhill for user u, so adding the products descends the
users' losses (the paper writes the step with the opposite sign convention for Delta).
Privacy: phi is user-level DP when the aggregator is (see
`tff_silo.privacy.user_level`); v_u depends on user u's own data without noise, so it
is user u's private descriptor and should be kept by the server for u only.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from hypernet.algorithm import HypernetAlgorithm, local_delta, server_update
from tff_silo import keys
from tff_silo.privacy.user_level_factory import UserLevelDPMeanFactory


class HypernetState(NamedTuple):
  phi: tuple
  embeddings: np.ndarray
  round_num: np.int32
  aggregator: object


class UserInput(NamedTuple):
  """One user's round input: data, id (row of the embedding table), aggregation
  weight w_u, and the user's key for the round (`tff_silo.keys`: fold_in(user key,
  round)) its local sampling is keyed by."""
  x: np.ndarray
  y: np.ndarray
  user_id: np.int32
  weight: np.float32
  seed: np.ndarray


class HypernetProcess(tff.templates.IterativeProcess):
  """`next(state, user_inputs) -> (state, metrics)`; `algorithm` is its definition."""

  def __init__(self, initialize_fn, next_fn, *, algorithm, aggregator):
    super().__init__(initialize_fn, next_fn)
    self.algorithm = algorithm
    self.aggregator = aggregator
    self.hypernetwork = algorithm.hypernetwork
    self.config = algorithm.config
    self.settings = algorithm.settings
    self.user_weights = np.array(algorithm.user_weights)


def _tensors(shapes) -> tff.Type:
  return tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in shapes], tuple)


def process_for(algorithm: HypernetAlgorithm) -> HypernetProcess:
  """The TFF process of a `HypernetAlgorithm`: its `aggregator`, or the user-level DP
  mean (`user_level_factory.UserLevelDPMeanFactory` of `algorithm.mean`)."""
  aggregator = algorithm.aggregator
  if aggregator is None:
    aggregator = UserLevelDPMeanFactory.of(algorithm.mean)
  hn, target = algorithm.hypernetwork, algorithm.hypernetwork.target
  init_seed = algorithm.init_seed
  phi_type = _tensors(hn.phi_shapes)
  theta_type = _tensors(target.weight_shapes)
  embedding_type = tff.TensorType(np.float32, [hn.embedding_dim])
  table_type = tff.TensorType(np.float32, [hn.num_users, hn.embedding_dim])
  input_type = tff.StructWithPythonType(
      [("x", tff.TensorType(np.float32, [None, *algorithm.feature_shape])),
       ("y", tff.TensorType(np.float32, [None])),
       ("user_id", tff.TensorType(np.int32)),
       ("weight", tff.TensorType(np.float32)),
       ("seed", tff.TensorType(np.int32, [2]))], UserInput)
  agg_process = aggregator.create(phi_type, tff.TensorType(np.float32))

  @tff.tensorflow.computation
  def initial_values():
    phi, embeddings = hn.init(init_seed)
    return tuple(tf.constant(p) for p in phi), tf.constant(embeddings)

  @tff.federated_computation
  def initialize_fn():
    phi, embeddings = tff.federated_eval(initial_values, tff.SERVER)
    return tff.federated_zip(HypernetState(
        phi=phi, embeddings=embeddings,
        round_num=tff.federated_value(np.int32(0), tff.SERVER),
        aggregator=agg_process.initialize()))

  @tff.tensorflow.computation(input_type)
  def user_key(data):
    return tf.reshape(data.user_id, [1])

  @tff.tensorflow.computation(tff.StructType([phi_type, table_type]), np.int32)
  def generate_for(server_values, key):
    phi, embeddings = server_values
    return tuple(hn.generate(list(phi), embeddings[key])), embeddings[key]

  selected_type = tff.StructType([theta_type, embedding_type])

  @tff.tensorflow.computation(tff.SequenceType(selected_type))
  def only_element(sequence):
    zeros = (tuple(tf.zeros(s) for s in target.weight_shapes),
             tf.zeros([hn.embedding_dim]))
    return sequence.reduce(zeros, lambda _, element: element)

  @tff.tensorflow.computation(selected_type, input_type)
  def user_update(selected, data):
    theta, _ = selected
    return tuple(local_delta(algorithm, theta, data.x, data.y, data.seed))

  @tff.tensorflow.computation(phi_type, selected_type, theta_type, input_type)
  def to_hypernet_space(phi, selected, delta, data):
    _, embedding = selected
    phi_part, embedding_part = hn.vjp(list(phi), embedding, list(delta))
    rows = tf.scatter_nd(tf.reshape(data.user_id, [1, 1]), embedding_part[None],
                         [hn.num_users, hn.embedding_dim])
    return tuple(phi_part), rows, data.weight

  @tff.tensorflow.computation(phi_type, table_type, np.int32, phi_type, table_type)
  def apply_steps(phi, embeddings, round_num, phi_step, embedding_steps):
    new_phi, new_embeddings = server_update(algorithm, phi, embeddings, phi_step,
                                            embedding_steps)
    return tuple(new_phi), new_embeddings, round_num + 1

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(input_type, tff.CLIENTS))
  def next_fn(state, users):
    keys = tff.federated_map(user_key, users)
    num_keys = tff.federated_value(np.int32(hn.num_users), tff.SERVER)
    selected = tff.federated_map(only_element, tff.federated_select(
        keys, num_keys, tff.federated_zip((state.phi, state.embeddings)), generate_for))
    deltas = tff.federated_map(user_update, tff.federated_zip((selected, users)))
    phi_at_users = tff.federated_broadcast(state.phi)
    phi_parts, embedding_rows, weights = tff.federated_map(
        to_hypernet_space, tff.federated_zip((phi_at_users, selected, deltas, users)))
    agg = agg_process.next(state.aggregator, phi_parts, weights)
    embedding_steps = tff.federated_sum(embedding_rows)
    new_phi, new_embeddings, new_round = tff.federated_map(apply_steps, tff.federated_zip(
        (state.phi, state.embeddings, state.round_num, agg.result, embedding_steps)))
    new_state = tff.federated_zip(HypernetState(new_phi, new_embeddings, new_round,
                                                agg.state))
    metrics = tff.federated_zip(collections.OrderedDict(aggregator=agg.measurements))
    return new_state, metrics

  return HypernetProcess(initialize_fn, next_fn, algorithm=algorithm,
                         aggregator=aggregator)


class TffHypernetRunner:
  """The hypernetwork's TFF runner (registered for `HypernetAlgorithm`): its TFF
  process driven as `hypernet.vectorized.VectorizedHypernet` is (`prepare`,
  `initialize`, `next(state, sampled, data)`)."""

  def __init__(self, process):
    self.process = (process if isinstance(process, HypernetProcess)
                    else process_for(process))
    self.algorithm = self.process.algorithm

  def prepare(self, x_train, y_train, user_keys):
    return x_train, y_train, user_keys

  def initialize(self):
    return self.process.initialize()

  def next(self, state, sampled, data):
    x_train, y_train, user_keys = data
    weights = self.process.user_weights.astype(np.float32)
    inputs = [UserInput(x_train[u], y_train[u], np.int32(u), weights[u],
                        keys.fold_in(user_keys[u], state.round_num).numpy())
              for u in sampled]
    return self.process.next(state, inputs)[0]
