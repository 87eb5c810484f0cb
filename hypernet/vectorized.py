"""HyperNetFL / UDP-Alg on the vectorized backend: a round over all sampled users as
one TensorFlow program, on whatever device TensorFlow has
(`tff_silo.backends.vectorized`).

It computes what `hypernet.process.process_for` computes, from the same pieces:
theta_u for all sampled users at once (`Hypernetwork.generate_many`), their K local
steps through `tff_silo.backends.vectorized.training.train_silos` (the users' keys, shuffled batches
and step gradients of `train_locally`), each user's vector-Jacobian products
(`Hypernetwork.vjp`, mapped over users), and the user-level DP mean
(`user_level.flat_contributions` rounded and summed in integers, `integer_mean`:
the same clip, weights, grid, q W and noise key of the round as the TFF factory).
Only the default aggregator runs here; another `tff.aggregators` factory is a
one-line error naming backend=tff. Parity with the TFF process:
tests/hypernet/test_hypernet.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hypernet.algorithm import HypernetAlgorithm, server_update
from tff_silo import batched_random as br
from tff_silo import keys, xla
from tff_silo.algorithms.rounds import SiloInput
from tff_silo.privacy import integer_gaussian
from tff_silo.privacy.user_level import (flat_contributions, integer_mean,
                                         weighted_clipped_sum)
from tff_silo import runner
from tff_silo.backends.vectorized.programs import compiling_rounds, padded_ids, round_program
from tff_silo.backends.vectorized.stacking import StackedSilos, stack_silos
from tff_silo.backends.vectorized.training import train_silos


class HypernetState(NamedTuple):
  phi: tuple
  embeddings: tf.Tensor
  round_num: tf.Tensor


class StackedUsers(NamedTuple):
  """Every user's training data stacked (padded like `tff_silo.backends.vectorized`), keys
  and w_u."""
  silos: StackedSilos
  weight: tf.Tensor   # float32 [N]


def unsupported_reason(algorithm: HypernetAlgorithm) -> str | None:
  """Why `algorithm` cannot run here, or None if it can."""
  if algorithm.aggregator is not None:
    return ("the vectorized backend computes the user-level DP mean only; other "
            "tff.aggregators factories run on backend=tff")
  return None


def _program_key(algorithm: HypernetAlgorithm) -> tuple:
  """What the round's program depends on besides tensors: the noise's constants (S,
  its grid and bound, q W, root key) are tensors, so a grid over (q, S, z) and
  seeds traces it once per clip-or-not and noise-or-not."""
  return ("hypernet", algorithm.hypernetwork.computation_key, algorithm.config,
          algorithm.hypernet_learning_rate, algorithm.embedding_learning_rate,
          algorithm.mean.l2_norm_clip is not None, algorithm.mean.noise_multiplier > 0)


def _round_fn(algorithm: HypernetAlgorithm):
  """The round of `algorithm` (traced by `round_program`)."""
  hn, config = algorithm.hypernetwork, algorithm.config
  clipped = algorithm.mean.l2_norm_clip is not None
  integer = algorithm.mean.noise_multiplier > 0

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

  def round_fn(phi, embeddings, round_num, users, real, data: StackedUsers, clip,
               grid, bound, normalizer, root):
    """`users` the sampled ids, `real` (float32 [U]) 0 for padding (XLA: `next`)."""
    phi = list(phi)
    if xla.compiling():   # padded: at least one user
      phi_parts, v_parts = contributions(phi, embeddings, round_num, users, data)
    else:
      # How many users a round samples is data (Poisson): traced with a static
      # count, a first round that samples none would build the users' convolutions
      # with 0 groups, which TensorFlow refuses, although that branch never runs.
      users = tf.raw_ops.PlaceholderWithDefault(input=users, shape=[None])
      phi_parts, v_parts = tf.cond(
          tf.size(users) > 0,
          lambda: contributions(phi, embeddings, round_num, users, data),
          lambda: ([tf.zeros([0, *p.shape]) for p in phi],
                   tf.zeros([0, hn.embedding_dim])))
    kept = real > 0
    phi_parts = [tf.where(tf.reshape(kept, [-1] + [1] * (len(p.shape) - 1)), p, 0.0)
                 for p in phi_parts]
    v_parts = tf.where(kept[:, None], v_parts, 0.0)
    weights = tf.gather(data.weight, users) * real
    if integer:
      flat = flat_contributions(phi_parts, weights, clip)
      phi_step = integer_mean(integer_gaussian.integer_sums(flat, grid, bound), grid,
                              normalizer, root, round_num, phi,
                              integer_gaussian.eager_table())
    else:
      total = weighted_clipped_sum(phi_parts, weights, clip if clipped else None)
      phi_step = [t / normalizer for t in total]
    embedding_steps = tf.scatter_nd(users[:, None], v_parts, tf.shape(embeddings))
    new_phi, new_embeddings = server_update(algorithm, phi, embeddings, phi_step,
                                            embedding_steps)
    return tuple(new_phi), new_embeddings, round_num + 1

  return round_fn


class VectorizedHypernet:
  """A `HypernetAlgorithm` (or its TFF process) with a round as one TF program;
  `hypernet.run_hypernet(backend="vectorized")` drives it."""

  unsupported_reason = staticmethod(unsupported_reason)

  def __init__(self, process):
    self.algorithm = algorithm = runner.definition_of(process)
    reason = unsupported_reason(algorithm)
    if reason is not None:
      raise ValueError(reason)
    self.hypernetwork, self.settings = algorithm.hypernetwork, algorithm.settings
    self.user_weights = np.array(algorithm.user_weights)
    mean = algorithm.mean
    grid, bound = (mean.integer_grid(self.hypernetwork.num_parameters)
                   if mean.noise_multiplier > 0 else (0.0, 0))
    self._constants = (tf.constant(mean.l2_norm_clip or 0.0, tf.float32),
                       tf.constant(grid, tf.float32), tf.constant(bound, tf.int64),
                       tf.constant(mean.normalizer, tf.float32),
                       tf.constant(keys.root_key(mean.seed), tf.int32))
    self._round = round_program(_program_key(algorithm), lambda: _round_fn(algorithm))
    self._padded = compiling_rounds()

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
    """One round for the users `sampled` (ids; XLA-compiled, padded: `padded_ids`,
    the padding masked out)."""
    phi, embeddings, round_num = self._round(
        state.phi, state.embeddings, state.round_num,
        *padded_ids(sampled, self._padded), data, *self._constants)
    return HypernetState(phi, embeddings, round_num)
