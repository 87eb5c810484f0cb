"""HyperNetFL training as a TFF iterative process (Nemala et al., CIKM'23, Algorithm 1;
pFedHN, Shamsian et al., ICML'21).

The server holds phi and the embedding table. One round, for the sampled users:
1. `tff.federated_select` sends each user its own generated weights
   theta_u = h(phi, v_u) (keyed by the user's id);
2. the user runs K local SGD steps (`tff_silo`'s local-training routine) and returns
   Delta theta_u = theta_K - theta_u (lines 8-11);
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

from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
from tff_silo.privacy.user_level import UserDPSettings


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
  """`next(state, user_inputs) -> (state, metrics)`; keeps the builder's settings."""

  def __init__(self, initialize_fn, next_fn, *, hypernetwork, config, settings,
               user_weights, aggregator):
    super().__init__(initialize_fn, next_fn)
    self.aggregator = aggregator
    self.hypernetwork = hypernetwork
    self.config = config
    self.settings = settings
    self.user_weights = user_weights


def _tensors(shapes) -> tff.Type:
  return tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in shapes], tuple)


def build_hypernet_process(hypernetwork, feature_shape, train_sizes,
                           settings: UserDPSettings, *, client_learning_rate: float,
                           batch_size: int, local_steps: int,
                           hypernet_learning_rate: float, embedding_learning_rate: float,
                           aggregator=None, init_seed: int = 0,
                           noise_seed: int = 0) -> HypernetProcess:
  """Builds UDP-Alg (or, with `settings` without clip and noise, pFedHN).

  Args:
    hypernetwork: a `hypernet.network.Hypernetwork` with one row per user.
    feature_shape: shape of one example.
    train_sizes: |D_u| of every user (for w_u and W).
    settings: q, S, z and w_hat (`tff_silo.privacy.user_level.UserDPSettings`).
    client_learning_rate: eta, the users' SGD step size.
    batch_size: the users' mini-batch size (shuffled batches).
    local_steps: K, SGD steps per user and round.
    hypernet_learning_rate: lambda, the step size of phi.
    embedding_learning_rate: zeta, the step size of the embeddings.
    aggregator: a weighted `tff.aggregators` factory replacing the default
      `settings.factory(train_sizes, noise_seed)`; its weights are the users' w_u.
    init_seed: seeds phi and the embeddings.
    noise_seed: seeds the default aggregator's noise.
  """
  user_weights = settings.weights(train_sizes)
  if len(user_weights) != hypernetwork.num_users:
    raise ValueError(f"train_sizes has {len(user_weights)} users, the hypernetwork "
                     f"has {hypernetwork.num_users} embeddings")
  if aggregator is None:
    aggregator = settings.factory(train_sizes, noise_seed)
  for name, value in (("hypernet_learning_rate", hypernet_learning_rate),
                      ("embedding_learning_rate", embedding_learning_rate)):
    if not value >= 0:
      raise ValueError(f"{name} must be >= 0, got {value}")
  if not isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    raise TypeError("aggregator must be a tff.aggregators.WeightedAggregationFactory, "
                    f"got {type(aggregator).__name__}")
  config = LocalTrainingConfig(learning_rate=client_learning_rate, batch_size=batch_size,
                               steps=local_steps, sampling="shuffle")
  hn, target = hypernetwork, hypernetwork.target
  phi_type = _tensors(hn.phi_shapes)
  theta_type = _tensors(target.weight_shapes)
  embedding_type = tff.TensorType(np.float32, [hn.embedding_dim])
  table_type = tff.TensorType(np.float32, [hn.num_users, hn.embedding_dim])
  input_type = tff.StructWithPythonType(
      [("x", tff.TensorType(np.float32, [None, *feature_shape])),
       ("y", tff.TensorType(np.float32, [None])),
       ("user_id", tff.TensorType(np.int32)),
       ("weight", tff.TensorType(np.float32)),
       ("seed", tff.TensorType(np.int32, [2]))], UserInput)
  agg_process = aggregator.create(phi_type, tff.TensorType(np.float32))
  lam, zeta = float(hypernet_learning_rate), float(embedding_learning_rate)

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
    trained = train_locally(target, config, list(theta), list(theta), 0.0, data.x,
                            data.y, 0.0, data.seed)
    return tuple(t - s for t, s in zip(trained, theta))

  @tff.tensorflow.computation(phi_type, selected_type, theta_type, input_type)
  def to_hypernet_space(phi, selected, delta, data):
    _, embedding = selected
    phi_part, embedding_part = hn.vjp(list(phi), embedding, list(delta))
    rows = tf.scatter_nd(tf.reshape(data.user_id, [1, 1]), embedding_part[None],
                         [hn.num_users, hn.embedding_dim])
    return tuple(phi_part), rows, data.weight

  @tff.tensorflow.computation(phi_type, table_type, np.int32, phi_type, table_type)
  def server_update(phi, embeddings, round_num, phi_step, embedding_steps):
    new_phi = tuple(p + lam * s for p, s in zip(phi, phi_step))
    return new_phi, embeddings + zeta * embedding_steps, round_num + 1

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
    new_phi, new_embeddings, new_round = tff.federated_map(server_update, tff.federated_zip(
        (state.phi, state.embeddings, state.round_num, agg.result, embedding_steps)))
    new_state = tff.federated_zip(HypernetState(new_phi, new_embeddings, new_round,
                                                agg.state))
    metrics = tff.federated_zip(collections.OrderedDict(aggregator=agg.measurements))
    return new_state, metrics

  return HypernetProcess(initialize_fn, next_fn, hypernetwork=hn, config=config,
                         settings=settings, user_weights=user_weights,
                         aggregator=aggregator)
