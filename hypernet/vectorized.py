"""HyperNetFL / UDP-Alg on the vectorized backend: a round over all sampled users as
one TensorFlow program, on whatever device TensorFlow has (`tff_silo.vectorized`).

It computes what `hypernet.process.process_for` computes, from the same pieces:
theta_u for all sampled users at once (`Hypernetwork.generate_many`), their K local
steps through `tff_silo.vectorized.train_silos` (the users' keys, shuffled batches
and step gradients of `train_locally`), each user's vector-Jacobian products
(`Hypernetwork.vjp`, mapped over users), and the user-level DP mean
(`user_level.weighted_clipped_sum`, `noised_mean`: the same clip, weights, q W and
noise key of the round as the TFF factory). Only the default aggregator runs here;
another `tff.aggregators` factory is a one-line error naming backend=tff. Parity with
the TFF process: tests/test_hypernet.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hypernet.algorithm import HypernetAlgorithm, server_update
from tff_silo import batched_random as br
from tff_silo import keys
from tff_silo.algorithms.rounds import SiloInput
from tff_silo.privacy.user_level import noised_mean, weighted_clipped_sum
from tff_silo.vectorized import StackedSilos, stack_silos, train_silos


class HypernetState(NamedTuple):
  phi: tuple
  embeddings: tf.Tensor
  round_num: tf.Tensor


class StackedUsers(NamedTuple):
  """Every user's training data stacked (padded like `tff_silo.vectorized`), keys
  and w_u."""
  silos: StackedSilos
  weight: tf.Tensor   # float32 [N]


def definition(process) -> HypernetAlgorithm | None:
  if isinstance(process, HypernetAlgorithm):
    return process
  return getattr(process, "algorithm", None)


def unsupported_reason(process) -> str | None:
  """Why `process` (a `HypernetAlgorithm` or its TFF process) cannot run here."""
  algorithm = definition(process)
  if not isinstance(algorithm, HypernetAlgorithm):
    return f"{type(process).__name__} is not a hypernetwork process or definition"
  if algorithm.aggregator is not None:
    return ("the vectorized backend computes the user-level DP mean only; other "
            "tff.aggregators factories run on backend=tff")
  return None


_ROUND_FUNCTIONS = {}   # one traced round per definition, shared by every run


def _round_function(algorithm: HypernetAlgorithm):
  """The traced round. The noise's constants (S, sigma, q W, root key) are tensors,
  so a grid over (q, S, z) and seeds traces it once per clip-or-not."""
  hn, config = algorithm.hypernetwork, algorithm.config
  clipped = algorithm.mean.l2_norm_clip is not None
  key = (hn.computation_key, config, algorithm.hypernet_learning_rate,
         algorithm.embedding_learning_rate, clipped)
  if key in _ROUND_FUNCTIONS:
    return _ROUND_FUNCTIONS[key]

  def contributions(phi, embeddings, round_num, users, data: StackedUsers):
    """Each sampled user's (phi part, embedding part), [U, ...]."""
    v = tf.gather(embeddings, users)
    theta = hn.generate_many(phi, v)
    silos = data.silos
    picked = StackedSilos(*(tf.gather(t, users) for t in silos))
    trained = train_silos(hn.target, config, theta, theta, 0.0, picked,
                          br.fold_in(picked.key, round_num), 0)
    delta = [t - s for t, s in zip(trained, theta)]
    phi_parts, v_parts = tf.vectorized_map(lambda a: hn.vjp(phi, a[0], a[1]),
                                           (v, delta))
    return list(phi_parts), v_parts

  def round_fn(phi, embeddings, round_num, users, data: StackedUsers, clip, sigma,
               normalizer, root):
    phi = list(phi)
    phi_parts, v_parts = tf.cond(
        tf.size(users) > 0,
        lambda: contributions(phi, embeddings, round_num, users, data),
        lambda: ([tf.zeros([0, *p.shape]) for p in phi],
                 tf.zeros([0, hn.embedding_dim])))
    total = weighted_clipped_sum(phi_parts, tf.gather(data.weight, users),
                                 clip if clipped else None)
    phi_step = noised_mean(total, normalizer, sigma, root, round_num)
    embedding_steps = tf.scatter_nd(users[:, None], v_parts, tf.shape(embeddings))
    new_phi, new_embeddings = server_update(algorithm, phi, embeddings, phi_step,
                                            embedding_steps)
    return tuple(new_phi), new_embeddings, round_num + 1

  _ROUND_FUNCTIONS[key] = tf.function(round_fn, autograph=False, reduce_retracing=True)
  return _ROUND_FUNCTIONS[key]


class VectorizedHypernet:
  """A `HypernetAlgorithm` (or its TFF process) with a round as one TF program;
  `hypernet.run_hypernet(backend="vectorized")` drives it."""

  def __init__(self, process):
    reason = unsupported_reason(process)
    if reason is not None:
      raise ValueError(reason)
    self.algorithm = algorithm = definition(process)
    self.hypernetwork, self.settings = algorithm.hypernetwork, algorithm.settings
    self.user_weights = np.array(algorithm.user_weights)
    mean = algorithm.mean
    self._constants = (tf.constant(mean.l2_norm_clip or 0.0, tf.float32),
                       tf.constant(mean.sigma, tf.float32),
                       tf.constant(mean.normalizer, tf.float32),
                       tf.constant(keys.root_key(mean.seed), tf.int32))
    self._round = _round_function(algorithm)

  def prepare(self, x_train, y_train, user_keys) -> StackedUsers:
    """Stacks every user's training data once, with the users' keys and w_u."""
    users = [SiloInput(x, y, np.float32(0.0), np.asarray(key, np.int32))
             for x, y, key in zip(x_train, y_train, user_keys)]
    return StackedUsers(stack_silos(users), tf.constant(self.user_weights, tf.float32))

  def initialize(self) -> HypernetState:
    phi, embeddings = self.hypernetwork.init(self.algorithm.init_seed)
    return HypernetState(tuple(tf.constant(p) for p in phi), tf.constant(embeddings),
                         tf.constant(0, tf.int32))

  def next(self, state: HypernetState, sampled, data: StackedUsers) -> HypernetState:
    """One round for the users `sampled` (ids)."""
    phi, embeddings, round_num = self._round(
        state.phi, state.embeddings, state.round_num,
        tf.constant(np.asarray(sampled, np.int32)), data, *self._constants)
    return HypernetState(phi, embeddings, round_num)
