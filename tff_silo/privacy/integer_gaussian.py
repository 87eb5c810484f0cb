"""The integer Gaussian mechanism in TensorFlow: contributions rounded to an integer
grid, summed in integers, rounded-Gaussian noise (its law and why it is as private
as the Gaussian mechanism: `integer_law`; issue 53, item 1).

- `noise(keys, n)`: int64[K, n], row k drawn with int32[2] key k: a 126-bit
  uniform fixed-point u and a sign from four 32-bit Philox words a coordinate
  (`batched_random`), the two of u's low half from key k's INTEGER_LOW child,
  computed only where the high half leaves a draw open (`lazy_noise_of`); |noise|
  is the number of table entries at or below u, found by a branchless search over
  `integer_law.table` from its `guide` (one gather, then 3 steps of two int64
  gathers). Integer ops only: it compiles under XLA and runs where XLA runs,
  TPUs included.
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
from tff_silo import keys as keys_lib
from tff_silo.privacy import integer_law as law

_LOW31 = 0x7FFF_FFFF
_OFFSET = 1 << 30           # |r| <= 2^30 (bounds at most 2^60): r + 2^30 >= 0
_MAX63 = (1 << 63) - 1

_TABLE_SPECS = ([tf.TensorSpec([law.HALF_WIDTH], tf.int64)] * 2
                + [tf.TensorSpec([127 << law.GUIDE_BITS], tf.int64)])

IntegerNoise = collections.namedtuple("IntegerNoise", ["draws", "grid", "bound"])
IntegerNoise.__doc__ = """One step's integer noise: `draws` (int64 [D], or [K, D] for
K silos), and the `grid` and norm `bound` (`grid_and_bound`) its sums round to."""


def _table():
  """The table and its guide as constants of the graph being built (their arrays
  are cached), passed to the compiled search as arguments: XLA compiling them in
  as constants took the memory of a Ray worker (LLVM on 3 MB of constants)."""
  high, low = law.table()
  return tf.constant(high), tf.constant(low), tf.constant(law.guide())


_EAGER_TABLE = []


def eager_table() -> tuple:
  """`_table` as eager tensors, made once: a program traced from eager code (the
  vectorized backend's rounds) captures them, so a compiled round takes them as
  three inputs instead of a constant at each use XLA folds them into (13 copies of
  the three, 24 MB of a School DP round's HLO)."""
  if not _EAGER_TABLE:
    from tensorflow.python.eager import context   # pylint: disable=g-direct-tensorflow-import
    with context.eager_mode():
      _EAGER_TABLE.append(_table())
  return _EAGER_TABLE[0]


def noise(keys, n: int, table=None):
  """int64[K, n] draws of round(N(0, SIGMA^2)), row k from int32[2] key k (`keys`
  [K, 2]). Coordinate j takes Philox block j of its key, so a longer draw begins
  with a shorter one: n is drawn as its `_bucket` and cut (one compiled program
  serves every n of a bucket; each program holds ~13 MB). `table`: `_table()`'s
  (default) or `eager_table()`'s tensors."""
  if int(n) != n or n < 0:
    raise ValueError(f"n must be a non-negative integer, got {n}")
  n = int(n)
  keys = tf.convert_to_tensor(keys, tf.int32)
  drawn = _compiled_noise(_bucket(n))(keys, *(table or _table()))
  return tf.ensure_shape(drawn[:, :n], [keys.shape[0], n])


def _bucket(n: int) -> int:
  """n rounded up to 16 or to m 2^e with 8 <= m < 16: at most 12.5% more draws (the
  vectorized backend's chunk buckets, `training._bucket`, in Python)."""
  if n <= 16:
    return 16
  shift = n.bit_length() - 4
  return -(-n >> shift) << shift


_FUSED_MOST = 4096   # coordinates a key up to which one XLA computation draws


@functools.lru_cache(maxsize=64)
def _compiled_noise(n: int):
  """`noise` of n coordinates as one traced function: up to _FUSED_MOST, one XLA
  computation (a School step's draw, 140 silos x 29: 1.2 ms; 1.8 ms as two);
  beyond, the words' Philox (its own XLA computation, `batched_random.philox`) and
  the compiled search apart (one computation took 2x as long for 200 silos x
  34,826: XLA recomputes the Philox rounds for each word it interleaves)."""

  @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32)] + _TABLE_SPECS,
               autograph=False, jit_compile=n <= _FUSED_MOST)
  def draw(keys, *table):
    num_keys = tf.shape(keys)[0]
    words = tf.reshape(br.random_bits(keys, 2 * n), [num_keys, n, 2])
    low_words = lambda: tf.reshape(br.random_bits(
        br.fold_in(keys, keys_lib.INTEGER_LOW), 2 * n), [num_keys, n, 2])
    return lazy_noise_of(words, low_words, table)

  return draw


def lazy_noise_of(words, low_words, table=None):
  """`noise_of` the words (words[..., 0], words[..., 1], *low_words()) (uint32[...,
  2] each), calling `low_words` only where u's high 63 bits leave a draw open:
  where they tie with a table entry the search compares, or put u within 2^74 of
  2^126 (its bucket then takes bits of the low word); below 2^-45 a coordinate
  (entries have fewer than 2^18 high words, of 2^63). Elsewhere the Philox words
  of the low halves are not computed (4 words a coordinate took 0.24 s of a
  Fashion-MNIST step's draw for 200 silos)."""
  table = table or _table()
  words = tf.convert_to_tensor(words, tf.uint32)
  draws, open_ = _search_high(words, *table)
  draws = tf.ensure_shape(draws, words.shape[:-1])
  return tf.cond(tf.reduce_any(open_), lambda: tf.ensure_shape(noise_of(
      tf.concat([words, tf.convert_to_tensor(low_words(), tf.uint32)], -1), table),
                                                               draws.shape),
                 lambda: draws)


def noise_of(words, table=None):
  """The draws of uint32[..., 4] words: (w0 without its top bit, w1) the high 63 bits
  of a uniform u, (w2 without its top bit, w3) the low 63, w0's top bit the sign
  (`_search`); the table and guide from `integer_law` unless given."""
  return _search_words(tf.convert_to_tensor(words, tf.uint32), *(table or _table()))


def _word63(words):
  """int64 of (w0 without its top bit, w1) of uint32[..., 2+] words."""
  w = tf.cast(words[..., :2], tf.int64)
  return tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.bitwise.bitwise_and(w[..., 0], _LOW31), 32), w[..., 1])


@tf.function(input_signature=[tf.TensorSpec(None, tf.uint32)] + _TABLE_SPECS,
             autograph=False, jit_compile=True)
def _search_words(words, *table):
  """`noise_of`, XLA-compiled (one traced function for every shape; a School
  step's draw took 3.3 ms as separate ops)."""
  return _search(_word63(words), _word63(words[..., 2:]), words[..., 0] > _LOW31,
                 *table)[0]


@tf.function(input_signature=[tf.TensorSpec(None, tf.uint32)] + _TABLE_SPECS,
             autograph=False, jit_compile=True)
def _search_high(words, *table):
  """`_search` of uint32[..., 2] words with u's low half 0, and where that half
  could change the draw (`lazy_noise_of`)."""
  high = _word63(words)
  return _search(high, tf.zeros_like(high), words[..., 0] > _LOW31, *table)


def _search(high, low, negative, table_high, table_low, guide):
  """The draws of u = high 2^63 + low (int64 63-bit words) with their signs: |noise|
  is the number of table entries at or below u. The `integer_law.guide` entry of
  u's bucket bounds it to at most 7 entries, which GUIDE_STEPS branchless steps of
  two int64 gathers search. Also returns where `low` decided a step or the bucket."""
  entry = tf.gather(guide, _bucket_of(high, low))
  position = tf.bitwise.right_shift(entry, 32)
  end = tf.bitwise.bitwise_and(entry, 0xFFFF_FFFF)
  open_ = _MAX63 - high < (1 << law.GUIDE_BITS)   # the bucket takes bits of low
  for shift in reversed(range(law.GUIDE_STEPS)):
    candidate = position + (1 << shift)
    index = tf.maximum(tf.minimum(candidate, end) - 1, 0)
    t_high, t_low = tf.gather(table_high, index), tf.gather(table_low, index)
    compared = candidate <= end
    tie = tf.equal(t_high, high)
    open_ = tf.logical_or(open_, tf.logical_and(compared, tie))
    at_or_below = tf.logical_or(t_high < high, tf.logical_and(tie, t_low <= low))
    position = tf.where(tf.logical_and(compared, at_or_below), candidate, position)
  return tf.where(negative, -position, position), open_


def _bucket_of(high, low):
  """u's bucket in `integer_law.guide` (u = high 2^63 + low, int64 words of 63
  bits): L 2^GUIDE_BITS + j, L the bit length of v = 2^126 - 1 - u (words
  2^63 - 1 - high and 2^63 - 1 - low), j = (v - 2^(L-1)) >> max(L - 1 - GUIDE_BITS,
  0), the bits of v after its leading one. Integer ops only."""
  bits = law.GUIDE_BITS
  v_high, v_low = _MAX63 - high, _MAX63 - low
  in_high = v_high > 0
  top_high, top_low = _bit_length(v_high) - 1, _bit_length(v_low) - 1
  below = lambda v, top: v - tf.bitwise.left_shift(tf.ones_like(v), tf.maximum(top, 0))
  # v's leading one in the high word: its next GUIDE_BITS bits, from both words
  # where fewer lie below that one in the high word (v_low's top `spill` bits)
  rest_high = below(v_high, top_high)
  spill = tf.clip_by_value(bits - top_high, 0, bits)
  j_high = tf.where(
      top_high >= bits,
      tf.bitwise.right_shift(rest_high, tf.maximum(top_high - bits, 0)),
      tf.bitwise.bitwise_or(tf.bitwise.left_shift(rest_high, spill),
                            tf.bitwise.right_shift(v_low, 63 - spill)))
  j_low = tf.where(top_low >= 0,
                   tf.bitwise.right_shift(below(v_low, top_low),
                                          tf.maximum(top_low - bits, 0)), 0)
  length = tf.where(in_high, 64 + top_high, top_low + 1)
  return tf.bitwise.left_shift(length, bits) + tf.where(in_high, j_high, j_low)


def _bit_length(v):
  """The bit length of int64 v >= 0 (0 for 0), branchless: six halvings."""
  length = tf.zeros_like(v)
  for shift in (32, 16, 8, 4, 2, 1):
    upper = tf.bitwise.right_shift(v, shift)
    big = upper > 0
    length += tf.where(big, tf.cast(shift, tf.int64), 0)
    v = tf.where(big, upper, v)
  return length + tf.cast(v > 0, tf.int64)


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


def step_noise(keys, dimension: int, noise_multiplier, l2_norm_clip,
               table=None) -> IntegerNoise:
  """One step's `IntegerNoise` for K silos: `noise` of their step keys ([K, 2]) (with
  `table`), the draws of a silo with z = 0 set to 0, and their grids and bounds."""
  grid, bound = grid_and_bound(noise_multiplier, l2_norm_clip, dimension)
  draws = noise(keys, dimension, table)
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
  # turns a division by a constant into that product, rounding differently). The
  # reciprocal as 2 / (grid + grid), the same number: grappler's constant folding
  # turns 1 / grid into a Reciprocal op, whose vectorized CPU kernel is not correctly
  # rounded (1 / 1e-4 gave 9999.999 for 1,284 grids in a graph, 10000 eagerly)
  grid = tf.cast(grid, tf.float32)
  scale = 2.0 / (grid + grid)
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
  if segment_ids is None:
    return tf.reduce_sum(rounded(contributions, grid, bound_sq[:, None]
                                 if bound_sq.shape.rank else bound_sq), 0)
  x = tf.convert_to_tensor(contributions, tf.float32)
  # (XLA drops the check: its chunks are STATIC_CHUNK_EXAMPLES)
  tf.debugging.assert_less_equal(tf.shape(x)[0], MAX_SUMMED, "integer_sums sums at "
                                 "most 2^20 examples a call per segment")
  m = tf.shape(x)[:1]
  return _segment_sums(x, tf.broadcast_to(tf.cast(grid, tf.float32), m),
                       tf.broadcast_to(bound_sq, m), segment_ids,
                       tf.convert_to_tensor(num_segments, tf.int32))


@tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32),
                              tf.TensorSpec([None], tf.float32),
                              tf.TensorSpec([None], tf.int64),
                              tf.TensorSpec([None], tf.int32),
                              tf.TensorSpec([], tf.int32)],
             autograph=False, jit_compile=True)
def _segment_sums(x, grid, bound_sq, segment_ids, num_segments):
  """Per-segment sums of the `rounded` rows of x, one XLA computation: the rounding
  (the same IEEE operations as uncompiled) fused with three int32 limb sums of
  r + 2^30 (|r| <= 2^30; integers: the same numbers compiled or not). Fused, a
  Fashion-MNIST chunk (1,284 x 34,826) took 0.18 s against 0.31 s as graph ops."""
  r = rounded(x, grid, bound_sq[:, None])
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
