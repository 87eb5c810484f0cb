"""What code compiled by XLA (`jit_compile=True`) needs beyond static shapes.

- `compiling()`: whether the function being traced is compiled by XLA, so that a
  routine shared with uncompiled programs can take its static-shape path.
- `cumsum`: a prefix sum over the last axis. XLA lowers `tf.cumsum` to a reduce
  window as long as the axis, O(n^2) on a CPU (a School step's 28,000 (silo, row)
  pairs: 55 ms against 1.3 ms uncompiled; benchmarks/RESULTS.md); in blocks of
  `BLOCK` it is O(n BLOCK).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_util

BLOCK = 128
LEVELS = 2   # blocks of blocks: n up to ~BLOCK^2 at the top costs (n / BLOCK^2)^2


def compiling() -> bool:
  """Whether the function being traced is compiled by XLA."""
  return control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


def cumsum(x, levels: int = LEVELS):
  """`tf.cumsum(x, axis=-1)`; traced for XLA, by blocks (exact for integers and
  integer-valued floats below 2^24, the only sums it is used for)."""
  if levels == 0 or not compiling():
    return tf.cumsum(x, axis=-1)
  lead, n = tf.shape(x)[:-1], tf.shape(x)[-1]
  padded = tf.pad(x, [[0, 0]] * (len(x.shape) - 1) + [[0, -n % BLOCK]])
  within = tf.cumsum(tf.reshape(padded, tf.concat([lead, [-1, BLOCK]], 0)), axis=-1)
  totals = within[..., -1]
  out = within + (cumsum(totals, levels - 1) - totals)[..., None]
  return tf.reshape(out, tf.concat([lead, [-1]], 0))[..., :n]
