"""Private selection: the exponential mechanism as report-noisy-min with Gumbel noise
(thesis sec. 1.2; McSherry & Talwar 2007).

Subtracting independent Gumbel noise of scale 2 * sensitivity / epsilon from every
candidate's score and reporting the argmin selects candidate g with probability
proportional to exp(-epsilon * s_g / (2 * sensitivity)): the exponential mechanism,
epsilon-DP for scores of the given sensitivity. Its privacy for composition is
(epsilon^2 / 8)-zCDP (bounded-range analysis, Rogers & Steinke 2021), described by
`tff_silo.privacy.accounting.selection_event`.

The Gumbel noise is -log(-log u) for float64 uniforms u = (k + 1/2) 2^-52 with k
uniform on 0 .. 2^52 - 1, strictly inside (0, 1): the noise lies in [-3.6, 36.7], so
the sampler differs from an exact Gumbel on an event of probability below 1e-15 per
candidate, and the reported index from the exact exponential mechanism by at most
G * 1e-15 in total variation (G candidates), which is negligible next to any delta
used here. (float32 uniforms clipped at 1e-12, as before, cut the upper tail at 16.6,
an event of probability 6e-8.)

The noise and the noisy scores stay float64, although TPUs have none (IFCA's is the
one round program left with float64): a float32 noisy score keeps 24 bits of a
score that can be hundreds of noise scales (an error rate near 0.3 against a scale
2 / (eps (n - 1))), so its rounding, up to ~1e-5 of a scale, would decide which
index is released on near-ties with a probability near the deltas used, where
float64's is ~1e-14. An exact sampler in integers would lift this; it is not built.

Keys: `seed` is the selection's int32[2] key (`tff_silo.keys`); None draws from OS
entropy. A fixed key is for reproducible simulation only.
"""

from __future__ import annotations

import tensorflow as tf

from tff_silo import keys

# Half a step of float64's 52-bit uniform grid: moves every draw strictly inside (0, 1).
_HALF_STEP = 2.0 ** -53


def _check(epsilon, sensitivity):
  """Python numbers are checked here; tensors (inside a TFF computation) are the
  caller's to validate."""
  if not tf.is_tensor(epsilon) and not epsilon > 0:
    raise ValueError(f"epsilon must be positive, got {epsilon}")
  if not tf.is_tensor(sensitivity) and not sensitivity > 0:
    raise ValueError(f"sensitivity must be positive, got {sensitivity}")


def gumbel(shape, key):
  """Standard Gumbel noise from float64 uniforms strictly inside (0, 1), as float64."""
  return gumbel_of(tf.random.stateless_uniform(shape, seed=key, dtype=tf.float64))


def gumbel_of(uniform):
  """-log(-log u) of float64 uniforms on TF's 52-bit grid, moved half a step inside
  (0, 1) (`batched_random.uniform64` draws them for many keys at once)."""
  return -tf.math.log(-tf.math.log(uniform + _HALF_STEP))


def report_noisy_min(scores, epsilon: float, sensitivity: float, seed=None):
  """Index of the privately selected lowest score along the last axis.

  Args:
    scores: float tensor `[..., G]` of losses or error rates (lower is better).
    epsilon: the selection's epsilon (> 0).
    sensitivity: the scores' sensitivity to one example (> 0), e.g. 1 / (n - 1) for
      an error rate (thesis eq. B.1).
    seed: int32[2] key of this selection; None: OS entropy.

  Returns:
    int32 tensor `[...]` of selected indices.
  """
  _check(epsilon, sensitivity)
  return noisy_argmin(scores, epsilon, sensitivity,
                      gumbel(tf.shape(scores), keys.key_or_fresh(seed)))


def noisy_argmin(scores, epsilon, sensitivity, noise):
  """argmin of scores - (2 sensitivity / epsilon) * noise (standard Gumbel noise of
  the scores' shape; epsilon and sensitivity broadcast against them)."""
  scores = tf.cast(scores, tf.float64)
  scale = 2.0 * tf.cast(sensitivity, tf.float64) / tf.cast(epsilon, tf.float64)
  return tf.argmin(scores - scale * noise, axis=-1, output_type=tf.int32)


def exponential_mechanism_probabilities(scores, epsilon: float, sensitivity: float):
  """The selection probabilities exp(-eps * s_g / (2 sensitivity)) / Z (for checks)."""
  _check(epsilon, sensitivity)
  logits = -epsilon * tf.convert_to_tensor(scores, tf.float32) / (2.0 * sensitivity)
  return tf.nn.softmax(logits, axis=-1)
