"""Poisson sampling whose inclusion probability is exactly a rational the accountant
bounds: each example kept when its own 32-bit word is below a threshold.

Amplification by Poisson subsampling needs every example kept independently with
probability (at most) the q the accountant charges. A float uniform compared with q,
or float geometric gaps between kept examples, only approximates that: their grids
move an example's inclusion hazard to up to 2031 q on a 130,000-row silo (issue 53).
Here example i of a silo is kept iff its word w_i (uint32, from the step's key) is
below t = floor(B 2^32 / m) for a batch B of public size m: exactly probability
t / 2^32 <= B / m (the accountant's q, `privacy.batching`), within 2^-32 of it (so
within 1e-6 relative for every q >= 2.4e-4), independently across examples (distinct
Philox counters). A silo with B >= m keeps every example.

Both backends sample through `PoissonSampler`, the TFF backend with one silo, the
vectorized backend with all silos at once (a draw of N words starts with the draw of
n < N under the same key, so the padded draw is each silo's own). A step costs one
word per example (130,000 words for the largest pandemic silo; measured in
`benchmarks/RESULTS.md`); `kept_mask` gives the same sample as a mask over padded
rows in static shapes, for XLA-compiled rounds (integers only: TPUs included).
"""

from __future__ import annotations

import fractions
import math

import tensorflow as tf

WORD = 2 ** 32


def threshold(batch, size):
  """floor(min(batch, size) 2^32 / size) (int64, elementwise over integer tensors; 0
  where size is 0): an example is kept when its word is below it."""
  size = tf.cast(size, tf.int64)
  batch = tf.minimum(tf.cast(batch, tf.int64), size)
  return tf.where(size > 0, batch * WORD // tf.maximum(size, 1), 0)


def rate_threshold(rate: float) -> int:
  """floor(rate 2^32) for a Python float rate in [0, 1], exactly (the rate's binary
  fraction times 2^32)."""
  if not 0 <= rate <= 1 or math.isnan(rate):
    raise ValueError(f"a sampling rate must be in [0, 1], got {rate}")
  return math.floor(fractions.Fraction(rate) * WORD)


def kept(words, below):
  """Which words are kept by int64 thresholds `below` (broadcast against uint32
  `words`): w < t, and every word when t = 2^32."""
  below = tf.cast(below, tf.int64)
  every = below >= WORD
  return every | (words < tf.cast(tf.clip_by_value(below, 0, WORD - 1), tf.uint32))


class PoissonSampler:
  """Every step's Poisson samples of K silos with thresholds `below` (int64 [K]:
  each example kept with probability below / 2^32, `threshold`) and sizes `n`
  (int32 [K])."""

  def __init__(self, below, n):
    self._below = tf.cast(below, tf.int64)[:, None]
    self._n = tf.convert_to_tensor(n, tf.int32)
    self.most = tf.reduce_max(tf.concat([self._n, [0]], 0))

  def _kept(self, words):
    real = tf.range(tf.shape(words)[1])[None] < self._n[:, None]
    return real & kept(words, self._below)

  def sample(self, bits, key, listed=None):
    """Each silo's sample of one step as one list of (silo [M], position [M])
    int32 pairs, silo by silo and in increasing position.

    Args:
      bits: `bits(key, width)` -> uint32 [K, width] words, silo k's from its own
        key (row k of `key`).
      key: the silos' keys of the step.
      listed: bool [K], the silos whose samples are listed (default all); every
        silo's is drawn (the others' draws unchanged).
    """
    kept_ = self._kept(bits(key, self.most))
    if listed is not None:
      kept_ &= listed[:, None]
    pairs = tf.cast(tf.where(kept_), tf.int32)
    return pairs[:, 0], pairs[:, 1]

  def kept_mask(self, bits, key, num_rows):
    """`sample` as a mask [K, num_rows] (1.0 where an example is kept; num_rows >=
    every n) in static shapes, for an XLA-compiled round."""
    return tf.cast(self._kept(bits(key, num_rows)), tf.float32)
