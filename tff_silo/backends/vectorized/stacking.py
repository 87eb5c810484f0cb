"""Silos stacked along a leading axis, padded to the largest (the vectorized
backend's data layout), and the helpers that move between stacked and per-silo."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo.algorithms import local_training
from tff_silo.data.silos import padded_stack


class StackedSilos(NamedTuple):
  """Every silo's `SiloInput`, stacked: x [K, N, ...] and y [K, N] zero-padded to
  the largest n, and per silo its n, public size, noise multiplier, key and
  selection epsilon."""
  x: tf.Tensor
  y: tf.Tensor
  n: tf.Tensor                 # int32 [K]
  size: tf.Tensor              # float32 [K]
  noise_multiplier: tf.Tensor  # float32 [K]
  key: tf.Tensor               # int32 [K, 2]
  selection_epsilon: tf.Tensor  # float32 [K]

  @property
  def row_mask(self):
    """float32 [K, N]: 1 on each silo's real rows, 0 on its padding."""
    return tf.cast(tf.range(tf.shape(self.y)[1])[None] < self.n[:, None], tf.float32)

  @property
  def public_size(self):
    """Each silo's public size m_k (`local_training.public_size`)."""
    return local_training.public_size(self.size, self.n)



def stack_silos(inputs) -> StackedSilos:
  """Stacks a list of `SiloInput`s (padding x and y with zeros)."""
  return StackedSilos(
      x=tf.constant(padded_stack([i.x for i in inputs])),
      y=tf.constant(padded_stack([i.y for i in inputs])),
      n=tf.constant([len(i.y) for i in inputs], tf.int32),
      size=tf.constant([i.size for i in inputs], tf.float32),
      noise_multiplier=tf.constant([i.noise_multiplier for i in inputs], tf.float32),
      key=tf.constant(np.stack([i.seed for i in inputs]), tf.int32),
      selection_epsilon=tf.constant([i.selection_epsilon for i in inputs], tf.float32))


class RunStack(NamedTuple):
  """The silos of one or more runs stacked (`programs.RunStackingRunner.prepare_runs`),
  with each silo's run and its run's numeric hyperparameters."""
  silos: StackedSilos
  run: tf.Tensor             # int32 [K]: each silo's run
  learning_rate: tf.Tensor   # float32 [K]
  lam: tf.Tensor             # float32 [K]: the regularization strength


def rows(mask, like):
  """A [K] boolean broadcast against a [K, ...] tensor."""
  return tf.reshape(mask, [-1] + [1] * (len(like.shape) - 1))


def tiled(weights, num_silos: int) -> tuple:
  return tuple(tf.tile(w[None], [num_silos] + [1] * len(w.shape)) for w in weights)


def unstacked(stacked) -> list:
  arrays = [w.numpy() for w in stacked]
  return [tuple(a[k] for a in arrays) for k in range(arrays[0].shape[0])]
