"""The support bound of the library's Gaussian sampler (`gaussian`) and what it costs
in delta, without TensorFlow (the accountants import it).

A pair of the sampler's normals has radius at most `RADIUS` (~37.7): its uniform is
refined down to 2^-1025 when its first word is 0. `release_tail(shift)` bounds, for
one release of at most `MAX_PAIRS` pairs shifted by a neighbour by `shift` (the
change's L2 norm over the noise's standard deviation), the probability that the
released noise leaves the Gaussian's law where that matters:
- a pair i of radius above RADIUS - s_i, its share s_i of the shift (sum s_i^2 <=
  shift^2): the neighbour's output cannot be there. With g(x) = exp(-(RADIUS -
  x)^2 / 2), the chance of a radius above RADIUS - x, g(x) / x^2 grows on [x0,
  RADIUS - x0] (x0 ~ 2 / RADIUS, where x (RADIUS - x) = 2), so the pairs with
  s_i >= x0 add at most g(shift) sum s_i^2 / shift^2 <= g(shift), and the others at
  most MAX_PAIRS g(x0) (~1e-300);
- the sampler's lowest grid cell (its radius held at RADIUS) in any pair, and a
  draw with more than `TAIL_SLOTS` pairs to refine.
Outside that event the released density is the Gaussian's, so an (epsilon,
delta)-DP Gaussian release is (epsilon, delta + tail)-DP with this sampler, and a
run's tails add up (`accounting.sampler_tail`). Up to a shift of 24 noise
deviations (a noise multiplier of 0.04; 0.08 under replace-one) a release costs at
most 9.1e-41 (the sampler's floor, 7.3e-41, plus g(24)); one of 32 (a node in all 32
examples of a batch at sigma 2) 9e-8.
"""

from __future__ import annotations

import math

import numpy as np

TAIL_WORDS = 30      # words refining a pair whose radius word is 0
TAIL_SLOTS = 16      # pairs of one row of a draw that can be refined
MAX_PAIRS = 2 ** 27  # the largest release accounted (2^28 coordinates)
_WORD = 2.0 ** -32
# ln of the smallest uniform: the radius word and every refining word 0 ...
LOG_U_MIN = -(32 * (TAIL_WORDS + 2) + 1) * math.log(2.0)
RADIUS = math.sqrt(-2.0 * LOG_U_MIN)   # ~37.7: no pair's radius is larger
# ... and what the sampler does not draw as the Gaussian would: the lowest cell of
# the uniform's grid (every word 0, its radius held at RADIUS), and rows with more
# than TAIL_SLOTS pairs to refine.
_MOVED_PER_PAIR = 2.0 ** (-32 * (TAIL_WORDS + 1))
_OVERFLOW = math.exp((TAIL_SLOTS + 1) * math.log(MAX_PAIRS * _WORD)
                     - math.lgamma(TAIL_SLOTS + 2))
# below X0 a pair's share of the shift costs at most g(X0) (module docstring)
X0 = (RADIUS - math.sqrt(RADIUS ** 2 - 8.0)) / 2.0


def _g(x: float) -> float:
  """The chance that a pair's radius exceeds RADIUS - x."""
  return math.exp(-(RADIUS - x) ** 2 / 2.0)


def release_tail(shift: float) -> float:
  """The probability that one release of at most `MAX_PAIRS` noise pairs, shifted
  by a neighbour by `shift` (the change's L2 norm over the noise's standard
  deviation), leaves the exact Gaussian's behaviour (module docstring)."""
  if not shift >= 0:
    raise ValueError(f"shift must be >= 0, got {shift}")
  if shift == 0:
    return 0.0   # the two outputs have one law
  if shift > RADIUS - X0:
    return 1.0
  return min(1.0, _g(shift) + MAX_PAIRS * (_g(X0) + _MOVED_PER_PAIR) + _OVERFLOW)


def float32_at_least(value: float) -> float:
  """The smallest float32 >= `value`, as a Python float (the accountants round noise
  multipliers up with it; the sampler its floor of ln u, `LOG_U_MIN`)."""
  rounded = np.float32(value)
  if float(rounded) < value:
    rounded = np.nextafter(rounded, np.float32(np.inf))
  return float(rounded)
