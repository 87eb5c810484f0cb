"""The integer Gaussian mechanism in TensorFlow: contributions rounded to an integer
grid, summed in integers, rounded-Gaussian noise (its law and why it is as private
as the Gaussian mechanism: `integer_law`; issue 53, item 1).

- `noise(keys, n)`: int64[K, n], row k drawn with int32[2] key k: four 32-bit Philox
  words a coordinate (`batched_random`), 126 of them a uniform fixed-point u, one the
  sign; |noise| is the number of table entries at or below u, found by a branchless
  binary search over `integer_law.table` (18 steps of two int64 gathers). Integer
  ops only: it compiles under XLA and runs where XLA runs, TPUs included.
- `grid_and_bound(z, C, d)`: the grid z C / SIGMA and the integer norm bound, in
  float32 from the silo's noise multiplier (never above `integer_law.bound_sq`,
  which the accountants charge); `step_noise`: a step's draws with them.
- `rounded(contributions, grid, bound_sq)`: each contribution (leading axes) divided
  by the grid and rounded to int64, zero where its integer norm exceeds the bound.
- `integer_sums(contributions, grid, bound_sq, segment_ids, num_segments)`: the
  rounded contributions summed (per segment: a silo's examples), in int64.
- `release(sums, draws, grid)`: grid (integer sums + noise), float32.
- `sum_release(contributions, C, z, key)`: the whole mechanism on one sum, for the
  releases outside DP-SGD (standardization, validation scores, user-level means).
"""

from __future__ import annotations

import collections
import functools

import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo.privacy import integer_law as law

_LOW31 = 0x7FFF_FFFF
_OFFSET = 1 << 30           # |r| <= 2^30 (bounds at most 2^60): r + 2^30 >= 0

_TABLE_SPECS = [tf.TensorSpec([law.HALF_WIDTH], tf.int64)] * 2

IntegerNoise = collections.namedtuple("IntegerNoise", ["draws", "grid", "bound"])
IntegerNoise.__doc__ = """One step's integer noise: `draws` (int64 [D], or [K, D] for
K silos), and the `grid` and norm `bound` (`grid_and_bound`) its sums round to."""


def _table():
  """The table as constants of the graph being built (its arrays are cached),
  passed to the compiled search as arguments: XLA compiling them in as constants
  took the memory of a Ray worker (LLVM on 3 MB of constants)."""
  high, low = law.table()
  return tf.constant(high), tf.constant(low)


def noise(keys, n: int):
  """int64[K, n] draws of round(N(0, SIGMA^2)), row k from int32[2] key k (`keys`
  [K, 2]). Coordinate j takes Philox block j of its key, so a longer draw begins
  with a shorter one: n is drawn as its `_bucket` and cut (one compiled program
  serves every n of a bucket; each program holds ~13 MB)."""
  if int(n) != n or n < 0:
    raise ValueError(f"n must be a non-negative integer, got {n}")
  n = int(n)
  drawn = _compiled_noise(_bucket(n))(tf.convert_to_tensor(keys, tf.int32), *_table())
  return drawn[:, :n]


def _bucket(n: int) -> int:
  """n rounded up to 16 or to m 2^e with 8 <= m < 16: at most 12.5% more draws (the
  vectorized backend's chunk buckets, `training._bucket`, in Python)."""
  if n <= 16:
    return 16
  shift = n.bit_length() - 4
  return -(-n >> shift) << shift


@functools.lru_cache(maxsize=64)
def _compiled_noise(n: int):
  """`noise` of n coordinates as one XLA computation, the words' Philox and the
  search fused (a School step's draw, 140 silos x 29: 1.2 ms; 1.8 ms as two)."""

  @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32)] + _TABLE_SPECS,
               autograph=False, jit_compile=True)
  def draw(keys, table_high, table_low):
    words = tf.reshape(br.random_bits(keys, 4 * n), [tf.shape(keys)[0], n, 4])
    return noise_of(words, table_high, table_low)

  return draw


def noise_of(words, table_high=None, table_low=None):
  """The draws of uint32[..., 4] words (`_search`); the table from `integer_law`
  unless given (as `noise` passes it)."""
  if table_high is None:
    table_high, table_low = _table()
  return _search(tf.convert_to_tensor(words, tf.uint32), table_high, table_low)


@tf.function(input_signature=[tf.TensorSpec(None, tf.uint32)] + _TABLE_SPECS,
             autograph=False, jit_compile=True)
def _search(words, table_high, table_low):
  """The draws of uint32[..., 4] words: (w0 without its top bit, w1) the high 63 bits
  of u, (w2 without its top bit, w3) the low 63, w0's top bit the sign. One traced
  function for every shape, XLA-compiled (the 18 steps' ~150 ops fused into one
  loop: a School step's draw took 3.3 ms as separate ops)."""
  w = tf.cast(words, tf.int64)
  high = tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.bitwise.bitwise_and(w[..., 0], _LOW31), 32), w[..., 1])
  low = tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.bitwise.bitwise_and(w[..., 2], _LOW31), 32), w[..., 3])
  negative = w[..., 0] > _LOW31
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


def grid_and_bound(noise_multiplier, l2_norm_clip, dimension: int):
  """(grid z C / SIGMA, bound) for noise multipliers z (float32, any shape): the
  bound floor((SIGMA / z (1 + slack) + sqrt(d) / 2)^2) in float32, as int64, at
  most MAX_BOUND_SQ; its relative error is below 2^-21, and `integer_law.bound_sq`,
  which the accountants charge, is the float64 value times 1 + 2^-18, plus 1
  (tested). z = 0 (training without noise, epsilon inf): the grid C 2^-24, no bound
  that binds."""
  z = tf.cast(noise_multiplier, tf.float32)
  noisy = z > 0
  safe = tf.where(noisy, z, 1.0)
  radius = (law.SIGMA / safe * (1.0 + law.FLOAT_SLACK)
            + tf.sqrt(tf.constant(float(dimension), tf.float32)) / 2.0)
  bound = tf.where(noisy, tf.minimum(tf.floor(radius * radius), law.MAX_BOUND_SQ),
                   law.MAX_BOUND_SQ)
  grid = tf.where(noisy, z * l2_norm_clip / law.SIGMA, l2_norm_clip * 2.0 ** -24)
  return grid, tf.cast(bound, tf.int64)


def step_noise(keys, dimension: int, noise_multiplier, l2_norm_clip) -> IntegerNoise:
  """One step's `IntegerNoise` for K silos: `noise` of their step keys ([K, 2]), the
  draws of a silo with z = 0 set to 0, and their grids and bounds."""
  grid, bound = grid_and_bound(noise_multiplier, l2_norm_clip, dimension)
  draws = noise(keys, dimension)
  noisy = tf.cast(tf.convert_to_tensor(noise_multiplier, tf.float32) > 0, tf.int64)
  return IntegerNoise(draws * (noisy[..., None] if noisy.shape.rank else noisy),
                      grid, bound)


def rounded(contributions, grid, bound_sq):
  """int64 contributions on the grid: round(x / grid) per coordinate of each
  contribution (the last axis), a contribution set to zero where its integer
  squared norm exceeds `bound_sq` (or where x is not finite). `grid` broadcasts
  against the contributions' leading axes ([...] or scalar)."""
  x = tf.convert_to_tensor(contributions, tf.float32)
  # x times the grid's reciprocal: the same two IEEE operations compiled or not (XLA
  # turns a division by a constant into that product, rounding differently)
  scale = 1.0 / tf.cast(grid, tf.float32)
  scaled = x * (tf.expand_dims(scale, -1) if scale.shape.rank else scale)
  finite = tf.reduce_all(tf.math.is_finite(scaled), -1, keepdims=True)
  # |x / grid| < 2^62 wherever the norm check can pass; clamp before the cast
  limit = tf.constant(2.0 ** 62, tf.float32)
  integer = tf.cast(tf.round(tf.clip_by_value(tf.where(finite, scaled, 0.0), -limit,
                                              limit)), tf.int64)
  sq = tf.reduce_sum(tf.square(tf.minimum(tf.abs(integer), 2 ** 31)), -1, keepdims=True)
  keep = tf.logical_and(finite, sq <= tf.cast(bound_sq, tf.int64))
  return tf.where(keep, integer, tf.zeros_like(integer))


MAX_SUMMED = 2 ** 20   # examples one `integer_sums` call sums exactly per segment


def integer_sums(contributions, grid, bound_sq, segment_ids=None, num_segments=None):
  """The sum of the `rounded` contributions ([m, D]; `grid` and `bound_sq` [m] or
  scalars) in int64: [D], an int64 reduction (exact: every |r| <= sqrt(bound) <=
  2^30), or with `segment_ids` ([m] int32, m <= MAX_SUMMED) one sum per segment
  [num_segments, D]: r + 2^30 split into three limbs of at most 11 bits, each summed
  exactly in int32 (the only integer segment sum GPUs have) and joined in int64."""
  bound_sq = tf.convert_to_tensor(bound_sq, tf.int64)
  r = rounded(contributions, grid, bound_sq[:, None] if bound_sq.shape.rank else bound_sq)
  if segment_ids is None:
    return tf.reduce_sum(r, 0)
  # (XLA drops the check: its chunks are STATIC_CHUNK_EXAMPLES)
  tf.debugging.assert_less_equal(tf.shape(r)[0], MAX_SUMMED, "integer_sums sums at "
                                 "most 2^20 examples a call per segment")
  return _limb_sums(r, segment_ids, tf.convert_to_tensor(num_segments, tf.int32))


@tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64),
                              tf.TensorSpec([None], tf.int32),
                              tf.TensorSpec([], tf.int32)],
             autograph=False, jit_compile=True)
def _limb_sums(r, segment_ids, num_segments):
  """Per-segment sums of int64 rows |r| <= 2^30 by three int32 limb sums, one XLA
  computation (integers: the same numbers compiled or not)."""
  shifted = r + _OFFSET
  total = tf.zeros(tf.stack([num_segments, tf.shape(r)[1]]), tf.int64)
  for shift, bits in ((0, 11), (11, 11), (22, 9)):
    limb = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(shifted, shift),
                                          (1 << bits) - 1), tf.int32)
    part = tf.math.unsorted_segment_sum(limb, segment_ids, num_segments)
    total += tf.cast(part, tf.int64) * (1 << shift)
  counts = tf.math.unsorted_segment_sum(tf.ones_like(segment_ids), segment_ids,
                                        num_segments)
  return total - tf.cast(counts, tf.int64)[:, None] * _OFFSET


def release(sums, draws, grid):
  """float32 grid (sums + draws): the release of integer sums [..., D] with their
  noise `draws` (`noise`, int64 [..., D]); `grid` scalar or [...]."""
  grid = tf.cast(grid, tf.float32)
  if grid.shape.rank:
    grid = grid[..., None]
  return tf.cast(sums + draws, tf.float32) * grid


def sum_release(contributions, l2_norm_clip: float, noise_multiplier: float, key):
  """The integer Gaussian mechanism on one sum: float32 [D], as private as the sum of
  `contributions` ([m, D], each of L2 norm at most `l2_norm_clip`)
  plus N(0, (z C)^2 I) with z = `noise_multiplier`, the multiplier the caller's
  accountant charges (drawn at `integer_law.grid_noise_multiplier(z, D)`, whose
  effective multiplier is at least z), beside `events.IntegerNoiseTail(D)`; `key`:
  the release's int32[2] key. A contribution's rounding moves the sum by at most
  grid / 2 = z C / 2^15 a coordinate (systematically at worst: m z C / 2^15 in all)."""
  x = tf.convert_to_tensor(contributions, tf.float32)
  dimension = int(x.shape[-1])
  z = law.grid_noise_multiplier(float(noise_multiplier), dimension)
  grid, bound = grid_and_bound(z, float(l2_norm_clip), dimension)
  sums = integer_sums(x, grid, bound)
  draws = noise(tf.convert_to_tensor(key, tf.int32)[None], dimension)[0]
  return release(sums, draws, grid)
