"""TensorFlow's stateless random draws for a batch of keys in one op graph.

A leaf below `tff_silo.keys`, which derives its keys with `fold_in` here (one
definition of the key tree's Philox domain, `KEY_DOMAIN`).

`tf.random.stateless_*` take one seed per op and `tf.vectorized_map` cannot vectorize
them over seeds, so a backend that trains every silo at once could not draw each
silo's own samples and noise. This module recomputes the same numbers for K keys at
once: Philox-4x32-10 (Salmon et al., SC'11) written with uint32/uint64 tensor ops,
TF's seed scrambling (`GenerateKey` in tensorflow/core/kernels/stateless_random_ops.cc)
and its float conversions. Row k of each function equals the TF op with key k
(tests/backends/test_vectorized.py), bit for bit.

- `fold_in(keys, data)`     == `tff_silo.keys.fold_in(keys[k], data[k])`
- `random_bits(keys, n)`    == `tf.random.stateless_uniform([n], seed=keys[k],
                                 minval=None, maxval=None, dtype=tf.uint32)`
- `uniform(keys, n)`        == `tf.random.stateless_uniform([n], seed=keys[k])`
- `uniform64(keys, n)`      == `tf.random.stateless_uniform([n], seed=keys[k],
                                                              dtype=tf.float64)`
- `mantissas(keys, n)`      == `uniform64(keys, n) * 2^52` as int64, exactly: the
                               same order without float64 (which TPUs lack)
- `exponentials(keys, n)`   == -ln(1 - `uniform64(keys, n)`) within 2^-21 relative,
                               in float32 arithmetic (`exponentials_of`)

Gaussian noise is the library's own (`privacy.gaussian`, from `random_bits`), not
TF's normals, whose support stops at 5.68.

A draw of n values is a prefix of a draw of N > n values with the same key (Philox
runs a counter), which is how padded silos draw exactly what they would alone.
"""

from __future__ import annotations

import math

import tensorflow as tf

# The second counter word of every key derivation (`tff_silo.keys.fold_in`): it
# separates the key tree's Philox outputs from any other use of the same keys.
KEY_DOMAIN = 0x7FF5_11D0
_M0, _M1 = 0xD2511F53, 0xCD9E8D57          # Philox-4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85          # key schedule (golden ratio, sqrt(3) - 1)
_SEED_KEY = (0x3EC8F720, 0x02461E29)       # TF's key for scrambling a seed
_MASK32 = 0xFFFF_FFFF
LN2_HIGH = 0.693359375                     # ln 2 to 9 bits (Cody and Waite): exact in
LN2_LOW = math.log(2.0) - LN2_HIGH         # float32 times integers up to 2^15


def _mulhilo(a, b):
  product = tf.cast(a, tf.uint64) * tf.constant(b, tf.uint64)
  return (tf.cast(tf.bitwise.right_shift(product, tf.constant(32, tf.uint64)), tf.uint32),
          tf.cast(product, tf.uint32))   # the cast keeps the low 32 bits


_UINT32_ANY_SHAPE = tf.TensorSpec(None, tf.uint32)


@tf.function(input_signature=[_UINT32_ANY_SHAPE] * 6, autograph=False,
             jit_compile=True)
def philox(key0, key1, c0, c1, c2, c3):
  """Philox-4x32-10 of uint32 tensors (broadcast together); returns 4 uint32 tensors.

  One traced function for every call (any shapes): a round that draws with it 15
  times builds its ~200 ops once, not 15 times. XLA compiles it (one fused loop
  instead of ~200 elementwise ops over the whole draw: School's Poisson draws take
  about half the time, `benchmarks/RESULTS.md`), for each shape it meets."""
  xor = tf.bitwise.bitwise_xor
  for i in range(10):
    if i:
      key0 = key0 + tf.constant(_W0, tf.uint32)
      key1 = key1 + tf.constant(_W1, tf.uint32)
    hi0, lo0 = _mulhilo(c0, _M0)
    hi1, lo1 = _mulhilo(c2, _M1)
    c0, c1, c2, c3 = xor(xor(hi1, c1), key0), lo1, xor(xor(hi0, c3), key1), lo0
  return c0, c1, c2, c3


def _words(keys):
  """int32[K, 2] keys -> the two uint32 words of each."""
  words = tf.bitcast(tf.convert_to_tensor(keys, tf.int32), tf.uint32)
  return words[:, 0], words[:, 1]


def _int64_words(values):
  """Low and high uint32 words of int64 values."""
  words = tf.bitcast(tf.cast(values, tf.int64), tf.uint32)   # [..., 2], little-endian
  return words[..., 0], words[..., 1]


def fold_in(keys, data):
  """Each key's child for `data` (a scalar or one integer per key); int32[K, 2]."""
  k0, k1 = _words(keys)
  d0, d1 = _int64_words(tf.broadcast_to(tf.cast(data, tf.int64), tf.shape(k0)))
  # Constant words as scalars: philox broadcasts them (and uint32 Fill has no GPU
  # kernel).
  out = philox(k0, k1, d0, d1, tf.constant(KEY_DOMAIN, tf.uint32),
               tf.constant(0, tf.uint32))
  return tf.bitcast(tf.stack(out[:2], axis=1), tf.int32)


def derive(keys, *path):
  """`fold_in` along `path`, as `tff_silo.keys.derive`."""
  for data in path:
    keys = fold_in(keys, data)
  return keys


def _key_counter(keys):
  """TF's scrambling of an int32[2] seed into a Philox key and counter: the seed's
  words, sign-extended to 64 bits, are the counter of one Philox block under a
  fixed key, whose output is the key (words 0, 1) and the counter's high half."""
  s0, s1 = _words(keys)
  ext = lambda w: tf.where(tf.bitcast(w, tf.int32) < 0, tf.constant(_MASK32, tf.uint32),
                           tf.constant(0, tf.uint32))
  return philox(tf.constant(_SEED_KEY[0], tf.uint32),
                tf.constant(_SEED_KEY[1], tf.uint32), s0, ext(s0), s1, ext(s1))


# `_block_counter`'s rows: the widest constant it leaves in a program.
_COUNTER_WIDTH = 1024


def _block_counter(blocks, anchor):
  """int64[blocks]: 0, 1, ..., blocks - 1, added up at run time from two ranges of
  at most ~sqrt(blocks) values. `tf.range(blocks)` alone is a blocks-long constant
  that TensorFlow folds into every lowered program (11 MB of HLO for the default
  hypernetwork's noise); `anchor`, a `run_time_zero`, keeps the sum from being
  folded."""
  rows = (blocks + _COUNTER_WIDTH - 1) // _COUNTER_WIDTH
  low = tf.range(_COUNTER_WIDTH, dtype=tf.int64) + anchor
  high = tf.range(rows, dtype=tf.int64) * _COUNTER_WIDTH + anchor
  return tf.reshape(high[:, None] + low[None, :], [-1])[:blocks]


def run_time_zero(values, dtype=tf.int64):
  """0 as `dtype`, computed from `values`: a range plus it is added up in the program,
  where TensorFlow's XLA bridge folds a range alone (a compile-time constant) into a
  constant of its length at each use."""
  return tf.reduce_sum(tf.cast(values, dtype)) * 0


def random_bits(keys, n):
  """uint32[K, n]: the bits TF's stateless ops draw for a shape of n elements."""
  key0, key1, high0, high1 = _key_counter(keys)
  blocks = (n + 3) // 4
  b0, b1 = _int64_words(_block_counter(blocks, run_time_zero(key0)))
  col = lambda t: t[:, None]
  out = philox(col(key0), col(key1), b0[None], b1[None], col(high0), col(high1))
  bits = tf.reshape(tf.stack(out, axis=2), [tf.shape(key0)[0], blocks * 4])
  return bits[:, :n]


def _unit_float(bits):
  """TF's uint32 -> float32 in [0, 1): 23 random mantissa bits under exponent 0."""
  mantissa = tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(bits, 0x7FFFFF), 0x3F800000)
  return tf.bitcast(mantissa, tf.float32) - 1.0


def uniform(keys, n):
  """float32[K, n] in [0, 1), row k equal to stateless_uniform([n], seed=keys[k])."""
  return _unit_float(random_bits(keys, n))


def _mantissas(keys, n):
  """uint64[K, n]: the 52-bit mantissas of TF's `Uint64ToDouble` on consecutive
  pairs of words (the low 20 bits of the first, then all of the second)."""
  bits = tf.cast(tf.reshape(random_bits(keys, 2 * n), [tf.shape(keys)[0], n, 2]),
                 tf.uint64)
  high = tf.bitwise.bitwise_and(bits[..., 0], tf.constant(0xFFFFF, tf.uint64))
  return tf.bitwise.bitwise_or(tf.bitwise.left_shift(high, tf.constant(32, tf.uint64)),
                               bits[..., 1])


def uniform64(keys, n):
  """float64[K, n] in [0, 1), row k equal to stateless_uniform([n], seed=keys[k],
  dtype=tf.float64): the mantissas under exponent 0."""
  one = tf.constant(1023 << 52, tf.uint64)
  return tf.bitcast(tf.bitwise.bitwise_or(_mantissas(keys, n), one), tf.float64) - 1.0


def exponentials(keys, n):
  """float32[K, n]: Exp(1) draws -ln(1 - u) of row k's `uniform64(keys, n)` draws u,
  computed without float64 (`exponentials_of`)."""
  return exponentials_of(_mantissas(keys, n))


def exponentials_of(mantissas):
  """float32: -ln(1 - u) for u = m 2^-52 (`mantissas` m, uint64 or int64 in
  [0, 2^52)), within 2^-21 relative (8 float32 steps; tested against float64) and
  without float64:
  - u < 1/2: -log1p(-u), u rounded to float32 (24 bits; log1p keeps them);
  - u >= 1/2: 1 - u = N 2^-52 with the integer N = 2^52 - m <= 2^51, so -ln(1 - u)
    = (52 - e) ln 2 - ln f, with float32(N) = f 2^e read from its bits (f in [1, 2),
    an integer e <= 51) and ln 2 in two parts (Cody and Waite), the first exact
    times 52 - e; the result is >= ln 2 and ln f < ln 2, so nothing cancels."""
  m = tf.cast(mantissas, tf.int64)
  half = tf.constant(1 << 51, tf.int64)
  low = -tf.math.log1p(-tf.cast(tf.minimum(m, half), tf.float32) * 2.0 ** -52)
  bits = tf.bitcast(tf.cast(2 * half - tf.maximum(m, half), tf.float32), tf.int32)
  down = 52.0 - tf.cast(tf.bitwise.right_shift(bits, 23) - 127, tf.float32)   # 52 - e
  fraction = tf.bitcast(tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(bits, 0x7FFFFF),
                                              0x3F800000), tf.float32)
  high = (down * LN2_LOW - tf.math.log(fraction)) + down * LN2_HIGH
  return tf.where(m < half, low, high)


def mantissas(keys, n):
  """int64[K, n]: `uniform64(keys, n)` times 2^52, exactly (its values are on the
  2^-52 grid), so ordered as the uniforms are, in integers."""
  return tf.cast(_mantissas(keys, n), tf.int64)
