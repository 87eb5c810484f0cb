"""The DP-SGD gradient mechanism (Abadi et al. 2016; thesis sec. 1.2), in TensorFlow.

Per-example gradients are clipped to `l2_norm_clip` in global L2 norm over all weight
tensors, summed, and Gaussian noise N(0, (noise_multiplier * l2_norm_clip)^2 I) is
added to the sum; the result is divided by the normalizer (the expected batch size
q * n under Poisson sampling, the batch size otherwise).

Noise comes from the library's Gaussian sampler (`gaussian`, whose support bound the
accountants charge), keyed by a 64-bit key (`tff_silo.keys`): one key per release,
never reused. Without a key the noise is drawn from OS entropy; a fixed key is for
reproducible simulation only. An example whose gradient is not finite
contributes zero (it would otherwise turn the release into NaN and so reveal that it
was sampled).
"""

from __future__ import annotations

import tensorflow as tf

from tff_silo import keys
from tff_silo.privacy import gaussian

_TINY = 1e-12


def _per_example(grads):
  """(squared global norm, finite) of each example (leading axis): finite is False
  when a gradient has a NaN or inf, or its squared norm overflows float32."""
  sq = tf.add_n([tf.reduce_sum(tf.square(tf.reshape(g, [tf.shape(g)[0], -1])), axis=1)
                 for g in grads])
  return sq, tf.math.is_finite(sq)


def nonfinite_examples(grads):
  """How many examples (leading axis) have a gradient with a NaN or inf (or a
  squared norm beyond float32)."""
  _, finite = _per_example(grads)
  return tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32))


def clip_per_example(grads, l2_norm_clip):
  """Scales each example's gradient (leading axis) to global norm <= clip; an
  example whose squared norm is not finite is set to zero (`multiply_no_nan`: a
  zero factor gives 0 even for a NaN or inf)."""
  sq, finite = _per_example(grads)
  factor = tf.where(finite, tf.minimum(1.0, l2_norm_clip / (tf.sqrt(sq) + _TINY)), 0.0)
  return [tf.math.multiply_no_nan(g, tf.reshape(factor, [-1] + [1] * (len(g.shape) - 1)))
          for g in grads]


def gaussian_noise_like(tensors, stddev, key=None):
  """Independent N(0, stddev^2) noise shaped like each tensor (their shapes static),
  all drawn with one int32[2] `key` (one flat draw of `gaussian.normal`, split); OS
  entropy when `key` is None."""
  sizes = [t.shape.num_elements() for t in tensors]
  if None in sizes:
    raise ValueError("gaussian_noise_like needs tensors of static shapes")
  flat = gaussian.normal(keys.key_or_fresh(key)[None], sum(sizes))[0] * stddev
  return [tf.reshape(part, tf.shape(t))
          for part, t in zip(tf.split(flat, sizes), tensors)]


def clipped_sum(per_example_grads, l2_norm_clip, segment_ids=None, num_segments=None):
  """The sum over examples (leading axis) of the clipped gradients; with
  `segment_ids` ([m] int32 in [0, num_segments)), one sum per segment (a silo's
  examples in the vectorized backend): [num_segments, ...]."""
  clipped = clip_per_example(per_example_grads, l2_norm_clip)
  if segment_ids is None:
    return [tf.reduce_sum(g, axis=0) for g in clipped]
  return [tf.math.unsorted_segment_sum(g, segment_ids, num_segments) for g in clipped]


def privatize(per_example_grads, *, l2_norm_clip, noise_multiplier, normalizer,
              seed=None):
  """Clip, sum, add noise, normalize: the DP-SGD gradient estimate. `seed`: the
  release's int32[2] key (`tff_silo.keys`); None draws from OS entropy (a fixed key
  is for simulation only)."""
  sums = clipped_sum(per_example_grads, l2_norm_clip)
  noise = gaussian_noise_like(sums, noise_multiplier * l2_norm_clip, seed)
  return [(s + z) / normalizer for s, z in zip(sums, noise)]
