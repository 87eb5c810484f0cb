"""The DP-SGD gradient mechanism (Abadi et al. 2016; thesis sec. 1.2), in TensorFlow.

Per-example gradients are clipped to `l2_norm_clip` in global L2 norm over all weight
tensors, summed, and Gaussian noise N(0, (noise_multiplier * l2_norm_clip)^2 I) is
added to the sum; the result is divided by the normalizer (the expected batch size
q * n under Poisson sampling, the batch size otherwise).

`privatize`'s noise is the integer Gaussian mechanism's (`integer_gaussian`); the
training loops draw theirs there too, or, behind the explicit `idealized` setting,
from the float sampler (`gaussian`, `gaussian_noise_like`). Noise is keyed by a
64-bit key (`tff_silo.keys`): one key per release, never reused. Without a key the
noise is drawn from OS entropy; a fixed key is for reproducible simulation only. An
example whose gradient is not finite contributes zero (it would otherwise turn the
release into NaN and so reveal that it was sampled).
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_silo import keys
from tff_silo.privacy import gaussian, integer_gaussian

_TINY = 1e-12

OuterProduct = collections.namedtuple("OuterProduct", ["inputs", "output_grads"])
OuterProduct.__doc__ = """Per-example gradients of a kernel kept factored: example i's
gradient is sum_t inputs_it (x) output_grads_it, reshaped to the kernel's shape; a
dense kernel has one position (inputs [S, b, in], output_grads [S, b, out]), a
convolution one per output position (inputs [S, b, T, in]: each position's input
patch; output_grads [S, b, T, out]). `clipped_stacked_sums` takes their norms the
cheaper of two ways (`forms_cheaper`): formed (a batched matmul per example, T in
out each; then summed weighted by the clip factors) or never formed (Goodfellow
2015's norms for T = 1; for T > 1 the Gram matrices' product, T^2 (in + out) each:
Li et al. 2021's ghost clipping; then the clipped sum as one weighted matmul, Bu et
al. 2023's book-keeping)."""


def formed(g):
  """An `OuterProduct`'s per-example gradients, formed: [S, b, in, out] (a kernel's
  shape after a reshape); a tensor as it is."""
  if not isinstance(g, OuterProduct):
    return g
  a, d = g
  if len(a.shape) == 3:
    return a[..., :, None] * d[..., None, :]
  return tf.matmul(a, d, transpose_a=True)


def forms_cheaper(g) -> bool:
  """Whether forming the `OuterProduct` `g`'s per-example gradients (T in out
  multiply-adds each) costs less than their norms from the Gram matrices of the
  positions (T^2 (in + out)), from the static shapes (unknown: formed)."""
  a, d = g
  if len(a.shape) == 3:
    return False
  positions, fan_in, fan_out = a.shape[-2], a.shape[-1], d.shape[-1]
  if None in (positions, fan_in, fan_out):
    return True
  return positions * fan_in * fan_out <= positions ** 2 * (fan_in + fan_out)


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
  factor = _clip_factors(*_per_example(grads), l2_norm_clip)
  return [tf.math.multiply_no_nan(g, tf.reshape(factor, [-1] + [1] * (len(g.shape) - 1)))
          for g in grads]


def _clip_factors(sq, finite, l2_norm_clip):
  """min(1, clip / norm) of each squared norm, 0 where it is not finite."""
  return tf.where(finite, tf.minimum(1.0, l2_norm_clip / (tf.sqrt(sq) + _TINY)), 0.0)


def _expanded_bound(sq, magnitude, length):
  """An upper bound of a squared norm |g + o|^2 computed expanded (|g|^2 + 2 g.o +
  |o|^2, g never formed): `sq` as computed plus float32's worst rounding of sums of
  at most `length` products over the terms' `magnitude` (|g|^2 + 2 |g| |o| +
  |o|^2). The expansion may round far below the true norm where g is close to -o
  and both are large; a clip factor from the bound is never above the true norm's."""
  return tf.maximum(sq, 0.0) + _rounding(magnitude, length)


def _rounding(magnitude, length):
  """float32's worst rounding of sums of at most `length` products (and a few more
  additions) over terms of total `magnitude`."""
  return 2.0 * (length + 8.0) * _UNIT_ROUNDOFF * magnitude


_UNIT_ROUNDOFF = 2.0 ** -24   # float32's


def clipped_stacked_sums(per_example, offsets, mask, l2_norm_clip):
  """For each of S groups, sum_i mask_i * clip(g_i + o): the clipped sums of b
  examples' gradients each shifted by its group's offset o (MR-MTL's penalty
  gradient, added before clipping) -> [S, ...] per weight.

  `per_example`: one entry per weight, a tensor [S, b, *shape] or an `OuterProduct`
  (formed where `forms_cheaper`; else never formed: its squared norm is the sum of
  the positions' Gram matrices' product (|a| |d| squared for one position), its
  inner product with o is sum_t a_t^T o d_t, its clipped sum A^T diag(c) D over all
  positions; its norm bounded above for float32's rounding, `_expanded_bound`, a
  convolution's products each with its own length); `offsets` [S, *shape]; `mask`
  [S, b] in {0, 1}. As `clip_per_example`, a non-finite example contributes zero.
  """
  per_example = [formed(g) if isinstance(g, OuterProduct) and forms_cheaper(g) else g
                 for g in per_example]
  sq, magnitude, length, slack = 0.0, 0.0, 0, 0.0
  for g, o in zip(per_example, offsets):
    if isinstance(g, OuterProduct):
      a, d = g
      g2, cross, bound = _factored_terms(g, o)
      o2 = tf.reduce_sum(tf.reshape(tf.square(o), [tf.shape(o)[0], -1]), 1)[:, None]
      sq += g2 + 2.0 * cross + o2
      fan_in, fan_out = tf.shape(a)[-1], tf.shape(d)[-1]
      if len(a.shape) == 3:
        magnitude += g2 + 2.0 * bound * tf.sqrt(o2) + o2
        length += tf.cast(fan_in + fan_out, tf.float32)
      else:   # the float64 Gram matrices' (`_factored_terms`) and g . o's own sums
        positions = tf.shape(a)[-2]
        magnitude += tf.abs(g2) + o2
        slack += (_rounding(tf.square(bound) * _UNIT_ROUNDOFF,
                            tf.cast(fan_in + fan_out + positions ** 2, tf.float32))
                  + _rounding(2.0 * bound * tf.sqrt(o2),
                              tf.cast(fan_in + positions * fan_out, tf.float32)))
    else:
      flat = tf.reshape(g, tf.concat([tf.shape(g)[:2], [-1]], 0))
      direct = tf.reduce_sum(tf.square(flat + tf.reshape(o, [tf.shape(o)[0], 1, -1])), -1)
      sq, magnitude = sq + direct, magnitude + direct
  finite = tf.math.is_finite(sq)
  factor = mask * _clip_factors(
      tf.where(finite, _expanded_bound(sq, magnitude, length) + slack, sq), finite,
      l2_norm_clip)
  kept = tf.reduce_sum(factor, 1)
  sums = []
  for g, o in zip(per_example, offsets):
    shift = tf.reshape(kept, [-1] + [1] * (len(o.shape) - 1)) * o
    if isinstance(g, OuterProduct):
      a, d = (tf.where(_by_example(finite, t), t, 0.0) for t in g)
      flat = lambda t: tf.reshape(t, tf.stack([tf.shape(t)[0], -1, tf.shape(t)[-1]]))
      total = tf.matmul(flat(a * _by_example(factor, a)), flat(d), transpose_a=True)
    else:
      total = tf.reduce_sum(tf.math.multiply_no_nan(g, _by_example(factor, g)), 1)
    sums.append(tf.reshape(total, tf.shape(o)) + shift)
  return sums


def _by_example(values, t):
  """[S, b] `values` shaped to broadcast against `t` [S, b, ...]."""
  return tf.reshape(values, tf.concat([tf.shape(values),
                                       tf.ones([len(t.shape) - 2], tf.int32)], 0))


def _factored_terms(g, o):
  """For an `OuterProduct` g never formed and an offset o [S, *shape]: each
  example's |g_i|^2, g_i . o and S1 = sum_t |a_t| |d_t| >= |g_i| (which bounds
  every partial sum of both), each [S, b].

  With one position |g_i|^2 = |a|^2 |d|^2. With T > 1 it is the sum of the Gram
  matrices' product, whose terms may cancel: it is computed in float64 (the Gram
  matrices are T^2 (in + out) multiply-adds, not the T in out of the other
  products), so its rounding, below ~S1^2 2^-53 per product summed, costs the
  bound almost nothing (in float32 a magnitude of S1^2, up to T |g_i|^2 where
  nothing cancels, shrank clip factors by up to ~1e-3 on the digits CNN)."""
  a, d = g
  o = tf.reshape(o, tf.stack([tf.shape(o)[0], tf.shape(a)[-1], tf.shape(d)[-1]]))
  products = tf.reduce_sum(tf.square(a), -1) * tf.reduce_sum(tf.square(d), -1)
  if len(a.shape) == 3:
    return products, tf.reduce_sum(tf.matmul(a, o) * d, -1), tf.sqrt(products)
  gram = lambda t: tf.matmul(t, t, transpose_b=True)   # [S, b, T, T]
  g2 = tf.reduce_sum(gram(tf.cast(a, tf.float64)) * gram(tf.cast(d, tf.float64)),
                     [-2, -1])
  shape = tf.shape(a)
  ao = tf.reshape(tf.matmul(tf.reshape(a, tf.stack([shape[0], -1, shape[-1]])), o),
                  tf.shape(d))
  return (tf.cast(g2, tf.float32), tf.reduce_sum(ao * d, [-2, -1]),
          tf.reduce_sum(tf.sqrt(products), -1))


def clipped_linear_sums(features, slopes, offsets, l2_norm_clip, segment_ids=None,
                        num_segments=None):
  """The clipped sums of a linear model's per-example gradients, never formed:
  example i's gradient is slope_i (features_i, 1) (kernel [d], bias) shifted by an
  offset o (MR-MTL's penalty gradient, added before clipping), so its squared norm
  is s_i^2 |f_i|^2 + 2 s_i f_i . o_w + |o_w|^2 + (s_i + o_b)^2 (bounded above for
  float32's rounding, `_expanded_bound`) and the kernel's clipped sum is
  F^T (c s) + (sum_i c_i) o_w (c_i the clip factors).

  `features` [m, d], `slopes` [m]; `offsets` (o_w [d], o_b []), or (o_w,) for a
  model without bias; with `segment_ids` ([m] int32 in [0, num_segments)) one
  offset per segment ([num_segments, ...]) and one sum per segment. As
  `clip_per_example`, a non-finite example contributes zero.
  """
  if segment_ids is None:
    total = lambda t: tf.reduce_sum(t, 0)
  else:
    total = lambda t: tf.math.unsorted_segment_sum(t, segment_ids, num_segments)
  factor, finite, o_w, bias_grads = _linear_clip_factors(
      features, slopes, offsets, l2_norm_clip, segment_ids)
  kept = total(factor)
  sums = [total(tf.math.multiply_no_nan(features,
                                        tf.where(finite, factor * slopes, 0.0)[:, None]))
          + tf.math.multiply_no_nan(o_w, kept[..., None])]
  if bias_grads is not None:
    sums.append(total(tf.where(finite, factor * bias_grads, 0.0)))
  return sums


def clipped_linear_contributions(features, slopes, offsets, l2_norm_clip,
                                 segment_ids=None):
  """The clipped per-example gradients of `clipped_linear_sums`, formed and flat:
  [m, d (+ 1 with a bias)], the kernel's coordinates then the bias (the integer
  mechanism rounds each, `integer_gaussian`); zero for a non-finite example."""
  factor, finite, o_w, bias_grads = _linear_clip_factors(
      features, slopes, offsets, l2_norm_clip, segment_ids)
  own_w = o_w if segment_ids is None else tf.gather(o_w, segment_ids)
  own_w = tf.broadcast_to(own_w, tf.shape(features))
  kernel = tf.math.multiply_no_nan(slopes[:, None] * features + own_w, factor[:, None])
  parts = [tf.where(finite[:, None], kernel, 0.0)]
  if bias_grads is not None:
    parts.append(tf.where(finite, factor * bias_grads, 0.0)[:, None])
  return tf.concat(parts, 1)


def _linear_clip_factors(features, slopes, offsets, l2_norm_clip, segment_ids):
  """(clip factor [m], finite [m], o_w, each example's bias gradient or None)."""
  own = (lambda t: t) if segment_ids is None else (lambda t: tf.gather(t, segment_ids))
  o_w = offsets[0]
  g2 = tf.square(slopes) * tf.reduce_sum(tf.square(features), -1)
  o2 = own(tf.reduce_sum(tf.square(o_w), -1))
  sq = g2 + 2.0 * slopes * tf.reduce_sum(features * own(o_w), -1) + o2
  magnitude = g2 + 2.0 * tf.sqrt(g2) * tf.sqrt(o2) + o2
  bias_grads = None
  if len(offsets) > 1:
    bias_grads = slopes + own(offsets[1])
    sq += tf.square(bias_grads)
    magnitude += tf.square(bias_grads)
  finite = tf.math.is_finite(sq)
  factor = _clip_factors(
      tf.where(finite, _expanded_bound(sq, magnitude, tf.cast(tf.shape(features)[-1],
                                                              tf.float32)), sq),
      finite, l2_norm_clip)
  return factor, finite, o_w, bias_grads


def flat_examples(tensors):
  """[m, D]: each example's tensors (a leading example axis, static trailing
  shapes) flattened and concatenated in order (`split_flat`'s inverse)."""
  return tf.concat([tf.reshape(t, [tf.shape(t)[0], int(np.prod(t.shape[1:]))])
                    for t in tensors], 1)


def split_flat(flat, shapes):
  """A flat [D] tensor cut into tensors of the static `shapes`, in order."""
  sizes = [int(np.prod(s)) for s in shapes]
  return [tf.reshape(part, s) for part, s in zip(tf.split(flat, sizes), shapes)]


def gaussian_noise_like(tensors, stddev, key=None):
  """Independent N(0, stddev^2) noise shaped like each tensor (their shapes static),
  all drawn with one int32[2] `key` (one flat draw of `gaussian.normal`, split); OS
  entropy when `key` is None."""
  sizes = [t.shape.num_elements() for t in tensors]
  if None in sizes:
    raise ValueError("gaussian_noise_like needs tensors of static shapes")
  flat = gaussian.normal(keys.key_or_fresh(key)[None], sum(sizes))[0] * stddev
  return split_flat(flat, [t.shape for t in tensors])


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
  """Clip, sum, add noise, normalize: the DP-SGD gradient estimate, its noise the
  integer Gaussian mechanism's on the flattened gradients
  (`integer_gaussian.sum_release`); z = 0 adds none. `seed`: the release's int32[2]
  key (`tff_silo.keys`); None draws from OS entropy (a fixed key is for simulation
  only)."""
  clipped = clip_per_example(per_example_grads, l2_norm_clip)
  if noise_multiplier == 0:
    return [tf.reduce_sum(g, 0) / normalizer for g in clipped]
  released = integer_gaussian.sum_release(flat_examples(clipped), l2_norm_clip,
                                          noise_multiplier, keys.key_or_fresh(seed))
  return split_flat(released / normalizer, [g.shape[1:] for g in clipped])
