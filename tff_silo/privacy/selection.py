"""Private selection: the exponential mechanism as report-noisy-min with Gumbel noise
(thesis sec. 1.2; McSherry & Talwar 2007).

Subtracting independent Gumbel noise of scale 2 * sensitivity / epsilon from every
candidate's score and reporting the argmin selects candidate g with probability
proportional to exp(-epsilon * s_g / (2 * sensitivity)): the exponential mechanism,
epsilon-DP for scores of the given sensitivity. Its privacy for composition is
(epsilon^2 / 8)-zCDP (bounded-range analysis, Rogers & Steinke 2021), described by
`tff_silo.privacy.accounting.selection_event`.
"""

from __future__ import annotations

import tensorflow as tf

_TINY = 1e-12


def _check(epsilon, sensitivity):
  """Python numbers are checked here; tensors (inside a TFF computation) are the
  caller's to validate."""
  if not tf.is_tensor(epsilon) and not epsilon > 0:
    raise ValueError(f"epsilon must be positive, got {epsilon}")
  if not tf.is_tensor(sensitivity) and not sensitivity > 0:
    raise ValueError(f"sensitivity must be positive, got {sensitivity}")


def report_noisy_min(scores, epsilon: float, sensitivity: float, seed):
  """Index of the privately selected lowest score along the last axis.

  Args:
    scores: float tensor `[..., G]` of losses or error rates (lower is better).
    epsilon: the selection's epsilon (> 0).
    sensitivity: the scores' sensitivity to one example (> 0), e.g. 1 / (n - 1) for
      an error rate (thesis eq. B.1).
    seed: int32[2] stateless seed.

  Returns:
    int32 tensor `[...]` of selected indices.
  """
  _check(epsilon, sensitivity)
  scores = tf.convert_to_tensor(scores, tf.float32)
  uniform = tf.random.stateless_uniform(tf.shape(scores), seed=seed, minval=_TINY,
                                        maxval=1.0)
  gumbel = -tf.math.log(-tf.math.log(uniform))
  noisy = scores - (2.0 * sensitivity / epsilon) * gumbel
  return tf.argmin(noisy, axis=-1, output_type=tf.int32)


def exponential_mechanism_probabilities(scores, epsilon: float, sensitivity: float):
  """The selection probabilities exp(-eps * s_g / (2 sensitivity)) / Z (for checks)."""
  _check(epsilon, sensitivity)
  logits = -epsilon * tf.convert_to_tensor(scores, tf.float32) / (2.0 * sensitivity)
  return tf.nn.softmax(logits, axis=-1)
