"""Poisson sampling in O(expected batch) draws: geometric gaps between kept examples.

Poisson sampling keeps each of n examples independently with probability q. Drawing
a uniform per example costs n draws per step, so a 130,000-person pandemic silo with
batch 64 drew 130,000 uniforms for 64 examples. The same sample, in distribution,
comes from the gaps between kept examples: the number of examples skipped before
the next kept one is Geometric(q), P(G >= g) = (1 - q)^g, drawn by inversion

    G = floor(log(1 - u) / log(1 - q)),   u ~ U[0, 1)

P(G >= g) = P(u >= 1 - (1 - q)^g): in float32, the uniforms' 2^-23 grid and the
log's few ulp move each probability by ~1e-7 (at most 2.4e-7 (1 - q)^g g |log(1 - q)|
<= 1e-7 for the log), as the grid alone moved the uniform-per-example test u < q.
The kept positions are the running sums of G + 1, minus one, while below n (sums
in float32: exact integers up to n < 2^24 rows, and never below n once past it). Draws come in chunks of
`chunk_width(q, n)` uniforms (the expected batch plus 4 standard deviations plus 8),
and another chunk is drawn, with the next chunk key, until the positions pass n: the
sample is exact, never truncated, and one chunk almost always suffices.

Both backends sample through `PoissonSampler`, the TFF backend with one silo, the
vectorized backend with all silos at once (a draw of N uniforms starts with the draw
of n < N under the same key, so the padded draw is each silo's own). An
XLA-compiled round needs static shapes: `kept_mask` draws the same sample as a mask
over the padded rows, every chunk N uniforms wide (O(N) per step, not O(q n)).
"""

from __future__ import annotations

import tensorflow as tf

from tff_silo import xla


def _rate(rate):
  """q in (0, 1]: a silo without examples may have none (its rate is 1 here)."""
  return tf.where(rate > 0, tf.minimum(rate, 1.0), 1.0)


def chunk_width(rate, n):
  """Uniforms per chunk (elementwise over float32 `rate` and int32 `n`): the
  expected batch q n plus 4 standard deviations plus 8, at most n, at least 1."""
  rate = _rate(rate)
  mean = rate * tf.cast(n, tf.float32)
  width = tf.math.ceil(mean + 4.0 * tf.sqrt(mean * tf.maximum(1.0 - rate, 0.0)) + 8.0)
  return tf.maximum(tf.minimum(tf.cast(width, tf.int32), n), 1)


class PoissonSampler:
  """Every step's Poisson samples of K silos with rates `rate` (float32 [K], q in
  (0, 1]) and sizes `n` (int32 [K]); what depends on them alone is computed once,
  outside the step loop (`sample` runs per step)."""

  def __init__(self, rate, n):
    self.width = chunk_width(rate, n)
    self.most = tf.reduce_max(self.width)
    with tf.control_dependencies([tf.debugging.assert_less(
        n, 2 ** 24, message="Poisson sampling: a silo has 2^24 rows or more")]):
      self._size = tf.cast(n, tf.float32)[:, None]
    self._log_stay = tf.cast(tf.math.log1p(-tf.cast(_rate(rate), tf.float64)),
                             tf.float32)[:, None]
    self._real = tf.range(self.most)[None] < self.width[:, None]

  def _chunk(self, uniforms, start, real=None):
    """One chunk of each silo's sample from `uniforms` [K, W] (slots past the
    silo's width unused: `real`, default W = `most`), the silo's next candidate
    position `start` [K] (float32). Returns the positions [K, W] (int32), which are
    kept [K, W] and the next chunk's start [K] (n once the silo's sample is
    complete)."""
    real = self._real if real is None else real
    gaps = tf.floor(tf.math.log1p(-uniforms) / self._log_stay)
    # A gap reaching past n ends the sample whatever its length: clipped.
    advance = tf.where(real, tf.minimum(gaps, self._size) + 1.0, 0.0)
    ends = start[:, None] + xla.cumsum(advance)
    kept = real & (ends <= self._size)
    positions = tf.cast(tf.minimum(ends, self._size), tf.int32) - 1   # kept: below n
    return positions, kept, tf.minimum(ends[:, -1], self._size[:, 0])

  def sample(self, uniform, fold_in, key, listed=None):
    """Each silo's sample of one step as one list of (silo [M], position [M])
    int32 pairs, silo by silo and in increasing position within a chunk.

    Args:
      uniform: `uniform(key, width)` -> float32 [K, width] uniforms in [0, 1), silo
        k's from its own key (row k of `key`).
      fold_in: `fold_in(key, c)`, the key's child for chunk c.
      key: the silos' keys of the step: chunk 0 draws with it, chunk c >= 1 with
        fold_in(key, c).
      listed: bool [K], the silos whose samples are listed (default all); every
        silo's is drawn (the others' draws unchanged).
    """
    def one(chunk_key, start):
      positions, kept, start = self._chunk(uniform(chunk_key, self.most), start)
      if listed is not None:
        kept &= listed[:, None]
      pairs = tf.cast(tf.where(kept), tf.int32)
      return pairs[:, 0], tf.gather_nd(positions, pairs), start

    silo, position, start = one(key, tf.zeros_like(self._size[:, 0]))

    def more(chunk, silo, position, start):
      extra_silo, extra_position, start = one(fold_in(key, chunk), start)
      return (chunk + 1, tf.concat([silo, extra_silo], 0),
              tf.concat([position, extra_position], 0), start)

    _, silo, position, _ = tf.while_loop(
        lambda chunk, silo, position, start: tf.reduce_any(start < self._size[:, 0]),
        more, (tf.constant(1), silo, position, start),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          tf.TensorShape([None]), start.shape))
    return silo, position

  def kept_mask(self, uniform, fold_in, key, num_rows):
    """`sample` as a mask [K, num_rows] (1.0 where an example is kept; num_rows >=
    every n) in static shapes, for an XLA-compiled round: the same sample, each
    chunk drawn num_rows wide (of which a silo uses its first `width`)."""
    real = tf.range(num_rows)[None] < self.width[:, None]
    silo = tf.broadcast_to(tf.range(tf.shape(real)[0])[:, None], tf.shape(real))

    def add(chunk, start, mask):
      chunk_key = tf.cond(chunk > 0, lambda: fold_in(key, chunk), lambda: key)
      positions, kept, start = self._chunk(uniform(chunk_key, num_rows), start, real)
      # Kept positions are distinct; the others add 0 (at a valid index).
      where = tf.stack([silo, tf.maximum(positions, 0)], -1)
      return chunk + 1, start, tf.tensor_scatter_nd_add(mask, where,
                                                        tf.cast(kept, tf.float32))

    _, _, mask = tf.while_loop(
        lambda chunk, start, mask: tf.reduce_any(start < self._size[:, 0]), add,
        (tf.constant(0), tf.zeros_like(self._size[:, 0]),
         tf.zeros(tf.shape(real), tf.float32)))
    return mask
