"""The integer Gaussian mechanism in TensorFlow: contributions rounded to an integer
grid, summed in integers, rounded-Gaussian noise (its law and why it is as private
as the Gaussian mechanism: `integer_law`; issue 53, item 1).

- `noise(keys, n)`: int64[K, n], row k drawn with int32[2] key k: four 32-bit Philox
  words a coordinate (`batched_random`), 126 of them a uniform fixed-point u, one the
  sign; |noise| is the number of table entries at or below u, found by a branchless
  binary search over `integer_law.table` (18 steps of two int64 gathers). Integer
  ops only: it compiles under XLA and runs where XLA runs, TPUs included.
- `rounded(contributions, grid, bound_sq)`: each contribution (leading axes) divided
  by the grid and rounded to int64, zero where its integer norm exceeds the bound.
- `release(sums, grid, keys)`: grid (integer sums + noise), float32.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo.privacy import integer_law as law

_LOW31 = 0x7FFF_FFFF


@functools.lru_cache(maxsize=1)
def _table():
  high, low = law.table()
  return tf.constant(high), tf.constant(low)


def noise(keys, n: int):
  """int64[K, n] draws of round(N(0, SIGMA^2)), row k from int32[2] key k (`keys` [K, 2])."""
  if int(n) != n or n < 0:
    raise ValueError(f"n must be a non-negative integer, got {n}")
  keys = tf.convert_to_tensor(keys, tf.int32)
  words = tf.reshape(br.random_bits(keys, 4 * int(n)), [tf.shape(keys)[0], int(n), 4])
  return noise_of(words)


def noise_of(words):
  """The draws of uint32[..., 4] words: (w0 without its top bit, w1) the high 63 bits
  of u, (w2 without its top bit, w3) the low 63, w0's top bit the sign."""
  w = tf.cast(words, tf.int64)
  high = tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.bitwise.bitwise_and(w[..., 0], _LOW31), 32), w[..., 1])
  low = tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.bitwise.bitwise_and(w[..., 2], _LOW31), 32), w[..., 3])
  negative = w[..., 0] > _LOW31
  table_high, table_low = _table()
  size = law.HALF_WIDTH                      # entries 0..HALF_WIDTH - 1 are compared
  position = tf.zeros_like(high)
  step = 1 << (size.bit_length() - 1)
  while step:
    candidate = position + step
    index = tf.minimum(candidate, size) - 1
    t_high, t_low = tf.gather(table_high, index), tf.gather(table_low, index)
    at_or_below = tf.logical_or(
        t_high < high, tf.logical_and(tf.equal(t_high, high), t_low <= low))
    position = tf.where(tf.logical_and(candidate <= size, at_or_below), candidate,
                        position)
    step >>= 1
  return tf.where(negative, -position, position)


def rounded(contributions, grid, bound_sq):
  """int64 contributions on the grid: round(x / grid) per coordinate of each
  contribution (the last axis), a contribution set to zero where its integer
  squared norm exceeds `bound_sq` (or where x is not finite). `grid` broadcasts
  against the contributions' leading axes ([...] or scalar)."""
  x = tf.convert_to_tensor(contributions, tf.float32)
  grid = tf.cast(grid, tf.float32)
  scaled = x / tf.expand_dims(grid, -1) if grid.shape.rank else x / grid
  finite = tf.reduce_all(tf.math.is_finite(scaled), -1, keepdims=True)
  # |x / grid| < 2^62 wherever the norm check can pass; clamp before the cast
  limit = tf.constant(2.0 ** 62, tf.float32)
  integer = tf.cast(tf.round(tf.clip_by_value(tf.where(finite, scaled, 0.0), -limit,
                                              limit)), tf.int64)
  sq = tf.reduce_sum(tf.square(tf.minimum(tf.abs(integer), 2 ** 31)), -1, keepdims=True)
  keep = tf.logical_and(finite, sq <= tf.cast(bound_sq, tf.int64))
  return tf.where(keep, integer, tf.zeros_like(integer))


def release(sums, grid, keys):
  """float32 grid (sums + noise): `sums` int64[K, n] (each row's integer sum),
  `grid` [K], `keys` int32[K, 2] (one fresh key per release)."""
  total = sums + noise(keys, int(sums.shape[-1]))
  return tf.cast(total, tf.float32) * tf.cast(grid, tf.float32)[:, None]
