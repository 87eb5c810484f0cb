"""The DP-SGD gradient mechanism (Abadi et al. 2016; thesis sec. 1.2), in TensorFlow.

Per-example gradients are clipped to `l2_norm_clip` in global L2 norm over all weight
tensors, summed, and Gaussian noise N(0, (noise_multiplier * l2_norm_clip)^2 I) is
added to the sum; the result is divided by the normalizer (the expected batch size
q * n under Poisson sampling, the batch size under shuffled batches). Noise comes from
stateless random ops seeded explicitly, so runs are reproducible.
"""

from __future__ import annotations

import tensorflow as tf

_TINY = 1e-12


def clip_per_example(grads, l2_norm_clip):
  """Scales each example's gradient (leading axis) to global norm <= clip."""
  sq = [tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
        for g in grads]
  norms = tf.sqrt(tf.add_n(sq))
  factor = tf.minimum(1.0, l2_norm_clip / (norms + _TINY))
  return [g * tf.reshape(factor, [-1] + [1] * (len(g.shape) - 1)) for g in grads]


def gaussian_noise_like(tensors, stddev, seed):
  """Independent N(0, stddev^2) noise shaped like each tensor; `seed` is int32[2]."""
  return [tf.random.stateless_normal(tf.shape(t), seed=tf.random.experimental
                                     .stateless_fold_in(seed, i), stddev=stddev)
          for i, t in enumerate(tensors)]


def privatize(per_example_grads, *, l2_norm_clip, noise_multiplier, normalizer, seed):
  """Clip, sum, add noise, normalize: the DP-SGD gradient estimate."""
  clipped = clip_per_example(per_example_grads, l2_norm_clip)
  sums = [tf.reduce_sum(g, axis=0) for g in clipped]
  noise = gaussian_noise_like(sums, noise_multiplier * l2_norm_clip, seed)
  return [(s + z) / normalizer for s, z in zip(sums, noise)]
