"""The support bound of the library's Gaussian sampler (`gaussian`) and what it costs
in delta, without TensorFlow (the accountants import it).

A pair of the sampler's normals has radius at most `RADIUS` (~37.7): its uniform is
refined down to 2^-1025 when its first word is 0. `release_tail(shift)` bounds, for
one release of at most `MAX_PAIRS` pairs shifted by a neighbour by `shift` (the
change's L2 norm over the noise's standard deviation), the probability that the
released noise leaves the Gaussian's law where that matters: a pair of radius above
RADIUS - shift (the neighbour's output cannot be there; each pair's part of the
shift is at most `shift`, so a union over pairs), the sampler's lowest grid cell (its
radius held at RADIUS) and a draw with more than `TAIL_SLOTS` pairs to refine.
Outside that event the released density is the Gaussian's, so an (epsilon,
delta)-DP Gaussian release is (epsilon, delta + tail)-DP with this sampler, and a
run's tails add up (`accounting.sampler_tail`). Below a shift of ~25 (noise
multiplier 0.04; 0.08 under replace-one) the tail is under 1e-25.
"""

from __future__ import annotations

import math

TAIL_WORDS = 30      # words refining a pair whose radius word is 0
TAIL_SLOTS = 16      # pairs of one row of a draw that can be refined
MAX_PAIRS = 2 ** 27  # the largest release accounted (2^28 coordinates)
_WORD = 2.0 ** -32
# ln of the smallest uniform: the radius word and every refining word 0 ...
_LOG_U_MIN = -(32 * (TAIL_WORDS + 2) + 1) * math.log(2.0)
RADIUS = math.sqrt(-2.0 * _LOG_U_MIN)   # ~37.7: no pair's radius is larger
# ... and what the sampler does not draw as the Gaussian would: the lowest cell of
# the uniform's grid (every word 0, its radius held at RADIUS), and rows with more
# than TAIL_SLOTS pairs to refine.
_MOVED_PER_PAIR = 2.0 ** (-32 * (TAIL_WORDS + 1))
_OVERFLOW = math.exp((TAIL_SLOTS + 1) * math.log(MAX_PAIRS * _WORD)
                     - math.lgamma(TAIL_SLOTS + 2))


def release_tail(shift: float, pairs: int = MAX_PAIRS) -> float:
  """The probability that one release of `pairs` noise pairs, shifted by a
  neighbour by `shift` (the change's L2 norm over the noise's standard deviation),
  leaves the exact Gaussian's behaviour: a pair's radius above RADIUS - shift, or a
  pair the sampler does not draw as the Gaussian would (module docstring)."""
  if not shift >= 0:
    raise ValueError(f"shift must be >= 0, got {shift}")
  if shift == 0:
    return 0.0   # the two outputs have one law
  if shift >= RADIUS:
    return 1.0
  violation = pairs * math.exp(-(RADIUS - shift) ** 2 / 2.0)
  return min(1.0, violation + pairs * _MOVED_PER_PAIR + _OVERFLOW)
