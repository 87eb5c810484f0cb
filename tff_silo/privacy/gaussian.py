"""Standard normal noise whose support bound costs a negligible, accounted delta.

TensorFlow's normals (Box-Muller on float32 uniforms, the radius's uniform clamped at
1e-7) never exceed 5.68 in absolute value. A Gaussian mechanism drawing them has
outputs that a neighbouring dataset cannot produce: when a neighbour shifts a
release by s (in units of the noise's standard deviation), a noise pair of radius
above 5.68 - s can land where the neighbour's output has no mass, an event no
epsilon pays for (with sigma 1 and a node-level shift of 2 rho C, about one pandemic
run in ten).

This sampler: Box-Muller on pairs of 32-bit Philox words (`batched_random`), the
first word w0 for the radius's uniform u = (w0 + 1/2) 2^-32, the second for the
angle. A pair with w0 = 0 (probability 2^-32) has its u refined by `TAIL_WORDS` more
words drawn under a key of its own, down to 2^-1025, so a pair's radius reaches
`gaussian_tail.RADIUS` (~37.7), the Gaussian law itself up to there; at most
`TAIL_SLOTS` pairs of a draw are refined. What remains of the support bound is
`gaussian_tail.release_tail`, which the accountants take from delta.

`normal(keys, n)`: float32[K, n], row k drawn with int32[2] key k; the TFF process
and the vectorized backend both draw with it (the same numbers, to float32 rounding:
TF's sin and cos differ in the last bit between vector and scalar code), at the
cost of TensorFlow's own normals.

Not addressed, and not accounted: the radius lies on the 2^32-point grid of w0, and
where w0 < 2^16 (probability 1.5e-5 a pair) consecutive radii are further apart than
float32 resolves a released value, so such a release can be one that a neighbouring
dataset cannot produce (Mironov 2012, here on the radius grid). Rows label such
noise an idealized real-valued Gaussian (`benchmarks.common.NOISE_MECHANISM`);
DP-SGD draws integer noise instead by default (`integer_gaussian`).
"""

from __future__ import annotations

import math

import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys as keys_lib
from tff_silo.privacy.gaussian_tail import (LOG_U_MIN, MAX_PAIRS, TAIL_SLOTS, TAIL_WORDS,
                                            float32_at_least)

_WORD = 2.0 ** -32

# ln 2^-1025, the lowest u, as the smallest float32 not below it: no radius past RADIUS.
_LOG_U_FLOOR = float32_at_least(LOG_U_MIN)


def tail_log_u(words):
  """float32 ln u of a pair whose radius word is 0, from its `TAIL_WORDS` refining
  words w_1..w_T ([F, T]): u = (0 + (w_1 + ... (w_T + 1/2) 2^-32 ...) 2^-32) 2^-32,
  without float64 (which TPUs lack). With w_j the first non-zero word, u = (w_j +
  (w_j+1 + ...) 2^-32) 2^(-32 (j + 1)), so ln u = ln(w_j + w_j+1 2^-32) - 32 (j + 1)
  ln 2 to within 2^-32 inside the log (below float32's 2^-24), ln 2 in two parts
  (Cody and Waite; the first exact times 32 (T + 2)); every word 0: u = 2^-1025,
  held no lower than `gaussian_tail.LOG_U_MIN` in float32 (rounded up)."""
  num_words = int(words.shape[1])
  values = tf.cast(words, tf.float32)
  index = tf.range(num_words)[None]
  first = tf.reduce_min(tf.where(words > 0, index, num_words), axis=1)   # T: all 0
  found = first < num_words
  at = tf.minimum(first, num_words - 1)
  following = tf.concat([values[:, 1:], tf.fill([tf.shape(values)[0], 1], 0.5)], axis=1)
  mantissa = tf.where(found, tf.gather(values, at, batch_dims=1)
                      + tf.gather(following, at, batch_dims=1) * _WORD, 0.5)
  words_down = 32.0 * tf.cast(first + 2, tf.float32)
  log_u = (tf.math.log(mantissa) - words_down * br.LN2_LOW) - words_down * br.LN2_HIGH
  return tf.maximum(log_u, _LOG_U_FLOOR)


def normal(keys, n: int):
  """float32[K, n] standard normals, row k from int32[2] key k (`keys` [K, 2])."""
  if int(n) != n or n < 0:
    raise ValueError(f"n must be a non-negative integer, got {n}")
  pairs = (int(n) + 1) // 2
  if pairs > MAX_PAIRS:
    raise ValueError(f"a release of {n} values is larger than the {2 * MAX_PAIRS} "
                     "the sampler's tail is accounted for")
  keys = tf.convert_to_tensor(keys, tf.int32)
  words = tf.reshape(br.random_bits(keys, 2 * pairs), [tf.shape(keys)[0], pairs, 2])
  return normals_of(keys, words)[:, :n]


def normals_of(keys, words):
  """The 2 P normals of each row of `words` (uint32[K, P, 2]: a radius and an angle
  word per pair), the refining words of a pair whose radius word is 0 drawn under
  its row's key and its index (`keys_lib.GAUSSIAN_TAIL`)."""
  num_keys, pairs = tf.shape(words)[0], int(words.shape[1])
  radius_word, angle_word = words[..., 0], words[..., 1]
  log_u = tf.math.log((tf.cast(radius_word, tf.float32) + 0.5) * _WORD)
  flagged = tf.equal(radius_word, 0)
  if pairs:
    slots = min(TAIL_SLOTS, pairs)

    def refine(log_u):
      is_flagged, index = tf.math.top_k(tf.cast(flagged, tf.int32), k=slots)
      rows = tf.repeat(tf.range(num_keys), slots)
      index = tf.reshape(index, [-1])
      tail_keys = br.fold_in(br.fold_in(tf.gather(keys, rows), keys_lib.GAUSSIAN_TAIL),
                             tf.cast(index, tf.int64))
      refined = tail_log_u(br.random_bits(tail_keys, TAIL_WORDS))
      where = tf.stack([rows, index], axis=1)
      keep = tf.reshape(is_flagged, [-1]) > 0   # the other slots keep their value
      return tf.tensor_scatter_nd_update(
          log_u, where, tf.where(keep, refined, tf.gather_nd(log_u, where)))

    log_u = tf.cond(tf.reduce_any(flagged), lambda: refine(log_u), lambda: log_u)
  radius = tf.sqrt(-2.0 * log_u)
  angle = (2.0 * math.pi * _WORD) * (tf.cast(angle_word, tf.float32) + 0.5)
  out = tf.stack([radius * tf.cos(angle), radius * tf.sin(angle)], axis=2)
  return tf.reshape(out, [num_keys, 2 * pairs])
