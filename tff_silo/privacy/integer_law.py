"""The law and the accounting of the integer Gaussian mechanism (`integer_gaussian`),
without TensorFlow (the accountants import it). Issue 53, item 1.

The mechanism: each clipped contribution x (L2 norm <= C) is divided by the grid
gamma = z C / SIGMA and rounded to the nearest integers, r; a contribution whose
integer norm |r|^2 exceeds `bound_sq(z, d)` (float rounding only) counts as zero,
checked in integers; the r are summed in integers, integer noise is added to every
coordinate, and the release is gamma (sum + noise). The noise is the rounded
Gaussian, the law of round(G) for G ~ N(0, SIGMA^2): since the sum S is an integer
vector, S + round(G) = round(S + G), a post-processing of the Gaussian mechanism
on S, whose L2 sensitivity is sqrt(bound_sq) (neighbouring sums differ by one r).
So the release is exactly as private as a Gaussian mechanism with noise multiplier
`effective_noise_multiplier` = SIGMA / sqrt(bound_sq) (below z: rounding moves a
contribution by up to sqrt(d) / 2), and every accountant of the sampled Gaussian
(RDP, PLD) applies unchanged. Everything before the last product is integer
arithmetic; the product, and the float32 it gives, are post-processing. (The
discrete Gaussian of Canonne, Kamath & Steinke 2020 would need Zhu & Wang 2019's
general subsampling bound, whose constant costs up to 19x the noise at epsilon 1,
q = 0.05, 400 steps: the tight sampled-Gaussian bound is not proven for it.)

The sampler draws |noise| by inverting a 126-bit fixed-point table of the law of
|round(G)| cut at HALF_WIDTH = 12 SIGMA, the sign from one more bit
(`integer_gaussian.noise`; the search starts from a `guide`). The table:
P(round(G) = k) = w_k I_k / (SIGMA sqrt(2 pi)), w_k = exp(-k^2 / (2 SIGMA^2)) in
50-digit decimals (a recurrence in r = exp(-1 / (2 SIGMA^2))), I_k = integral of
exp(-a u - b u^2) over u in [-1/2, 1/2] (a = k / SIGMA^2, b = 1 / (2 SIGMA^2)) by
its Taylor series to u^12, the u^2 and u^4 terms exactly in decimals, the others
(below 5e-25) in float64 (terms below 1e-40 left out), normalized over the cut.
The sampler's law is within `sampler_gap()` (~1.3e-32: the cut's mass and the
table's rounding) of the rounded Gaussian in total variation per coordinate: a run
that releases n coordinates in all is within n gap of the exact mechanism, so an
(epsilon, delta)-DP accounting of the exact one holds for the run with delta + (1 +
e^epsilon) n gap. The accountants charge (1 + e^EPSILON_CEILING) n gap
(`release_tail`, ~1e-18 a coordinate at EPSILON_CEILING = 32); a row reporting a
larger epsilon says that its guarantee is outside what the sampler is certified
for (`benchmarks.common.labelled`).
"""

from __future__ import annotations

import bisect
import decimal
import functools
import math

import numpy as np

# DP-SGD's noise (`local_training.LocalTrainingConfig.noise`): this mechanism, or
# float32 Gaussian noise whose guarantee holds for real numbers only (`gaussian`).
NOISE_MECHANISMS = ("integer", "idealized")
SIGMA_BITS = 14
SIGMA = 2 ** SIGMA_BITS           # the noise's standard deviation in grid units
CUT = 12
HALF_WIDTH = CUT * SIGMA          # the largest |noise| drawn
TABLE_BITS = 126                  # the table's fixed point: two 63-bit words
WORD_BITS = 63
GUIDE_BITS = 11                   # the search's guide: 2^11 buckets an octave of 1 - u
GUIDE_STEPS = 3                   # its buckets hold at most 2^3 - 1 entries (7 seen)
_SERIES_TERMS = 6                 # I_k's even powers u^2 .. u^12
_SERIES_ERROR = 1e-38             # |error| of I_k (float64 rounding, left-out terms)
# The largest epsilon this noise's guarantee is certified for: the sampler's gap
# costs delta (1 + e^epsilon) times its mass, charged at this epsilon
# (`release_tail`); rows with a larger epsilon say it is outside.
EPSILON_CEILING = 32.0
# Slack on the rounded norm bound for float32's rounding of x / gamma and of the
# clip itself (relative); a contribution beyond the bound counts as zero.
FLOAT_SLACK = 1e-5
_BOUND_MARGIN = 2.0 ** -18     # above float32's error on the bound (2^-21)
MAX_BOUND_SQ = 2 ** 60         # |r| <= 2^30 (noise multipliers above ~2^-16)
MIN_NOISE_MULTIPLIER = 2.0 ** -15   # its bound stays below MAX_BOUND_SQ
_PRECISION = decimal.Context(prec=50)


def _corrections() -> np.ndarray:
  """I_k's terms beyond u^4 for k = 0..HALF_WIDTH in float64 (the u^2 and u^4 terms
  are exact, `_masses`): sum over n >= 3 of h_2n 4^-n / (2n + 1), h_j the u^j
  coefficient of exp(-a u - b u^2) = sum_l (-a)^(j-2l) (-b)^l / ((j-2l)! l!). Each
  term below 5e-25 and computed to ~1e-15 relative: the sum within 1e-38."""
  a = np.arange(HALF_WIDTH + 1, dtype=np.float64) / SIGMA ** 2
  b = 1.0 / (2.0 * SIGMA ** 2)
  total = np.zeros_like(a)
  for n in range(3, _SERIES_TERMS + 1):
    j = 2 * n
    h = sum(a ** (j - 2 * l) * (-b) ** l / (math.factorial(j - 2 * l) * math.factorial(l))
            for l in range(n + 1))
    total += h / (4.0 ** n * (j + 1))
  return total


@functools.lru_cache(maxsize=1)
def _masses() -> tuple:
  """The unnormalized masses of |round(G)| = k for k = 0..HALF_WIDTH (twice the
  point mass for k > 0) as decimals, and their total."""
  with decimal.localcontext(_PRECISION):   # every operation at 50 digits
    r = (decimal.Decimal(-1) / (2 * SIGMA * SIGMA)).exp()
    r2, s2 = r * r, SIGMA * SIGMA
    second, fourth = decimal.Decimal(24 * s2 ** 2), decimal.Decimal(1920 * s2 ** 4)
    masses, w, step = [], decimal.Decimal(1), r
    for k, correction in enumerate(_corrections()):
      # the u^2 and u^4 terms, h_2 / 12 = (k^2 - s^2) / (24 s^4) and h_4 / 80 =
      # (k^4 - 6 k^2 s^2 + 3 s^4) / (1920 s^8), exactly
      k2 = k * k
      integral = (1 + (k2 - s2) / second + (k2 * k2 - 6 * k2 * s2 + 3 * s2 * s2) / fourth
                  + decimal.Decimal(float(correction)))
      masses.append(w * integral if k == 0 else 2 * w * integral)
      w, step = w * step, step * r2
    return masses, sum(masses, decimal.Decimal(0))


@functools.lru_cache(maxsize=1)
def table_integers() -> tuple:
  """The sampler's cumulative law of |noise| on 0..HALF_WIDTH in units of
  2^-TABLE_BITS: entry k = floor(2^TABLE_BITS P(|noise| <= k)), at most 2^126 - 1
  (so that it splits into two 63-bit words), the last 2^126."""
  masses, total = _masses()
  cumulative, out = decimal.Decimal(0), []
  with decimal.localcontext(_PRECISION):
    scale = decimal.Decimal(2) ** TABLE_BITS / total
    for mass in masses:
      cumulative += mass
      out.append(min(int((cumulative * scale).to_integral_value(decimal.ROUND_FLOOR)),
                     2 ** TABLE_BITS - 1))
  out[-1] = 2 ** TABLE_BITS
  return tuple(out)


@functools.lru_cache(maxsize=1)
def table() -> tuple:
  """(high, low) int64[HALF_WIDTH]: entries 0..HALF_WIDTH - 1 of `table_integers`
  split into 63-bit words (the last entry, above every draw, is never compared)."""
  entries = table_integers()[:-1]
  mask = (1 << WORD_BITS) - 1
  return (np.array([e >> WORD_BITS for e in entries], np.int64),
          np.array([e & mask for e in entries], np.int64))


@functools.lru_cache(maxsize=1)
def guide() -> np.ndarray:
  """int64[127 2^GUIDE_BITS]: the search's guide (Chen & Asau 1974's indexed
  search, its buckets on a binary floating-point scale of 1 - u): u's bucket is
  L 2^GUIDE_BITS + j, L the bit length of v = 2^126 - 1 - u and j the GUIDE_BITS
  bits of v after its leading one (all of them, unshifted, when v has fewer),
  `integer_gaussian._bucket_of`. Bucket entry: (start << 32) | end, every table
  entry below `start` at most u and every one from `end` on above it, for each u
  of the bucket; at most 2^GUIDE_STEPS - 1 entries between (asserted). Buckets
  narrow with 1 - u as the law's tail thins (entries per bucket about the
  Mills ratio 1.25 SIGMA / 2^GUIDE_BITS), so GUIDE_STEPS steps finish the search
  where the table's own binary search takes 18. Unused indices hold 0."""
  entries = table_integers()[:-1]
  top = 2 ** TABLE_BITS - 1
  out = np.zeros(127 << GUIDE_BITS, np.int64)
  widest = 0
  for length in range(TABLE_BITS + 1):
    width = 1 << max(length - 1 - GUIDE_BITS, 0)
    lead = (1 << (length - 1)) if length else 0
    for j in range(1 << min(max(length - 1, 0), GUIDE_BITS)):
      v_low = lead + j * width                # the bucket's v: [v_low, v_low + width)
      start = bisect.bisect_left(entries, top - (v_low + width - 1))
      end = bisect.bisect_right(entries, top - v_low)
      out[(length << GUIDE_BITS) + j] = (start << 32) | end
      widest = max(widest, end - start)
  assert widest < 1 << GUIDE_STEPS, widest
  return out


def sampler_pmf() -> np.ndarray:
  """float64[2 HALF_WIDTH + 1]: the sampler's exact law on -HALF_WIDTH..HALF_WIDTH
  (the table's differences; half of |k|'s mass to each sign for k != 0)."""
  half = (np.array([float(e) for e in np.diff((0,) + table_integers())])
          / 2.0 ** TABLE_BITS)
  return np.concatenate([half[:0:-1] / 2.0, half[:1], half[1:] / 2.0])


@functools.lru_cache(maxsize=1)
def sampler_gap() -> float:
  """The sampler's total variation from the rounded Gaussian per coordinate: the
  cut's mass P(|G| > HALF_WIDTH + 1/2), the masses' relative error (the series',
  twice for the normalization), the table's rounding (each entry within 2 units
  of 2^-126 below its value, so each probability within 2^-124), with a 1% margin."""
  cut = math.erfc((HALF_WIDTH + 0.5) / (SIGMA * math.sqrt(2.0)))
  return 1.01 * (cut + 3.0 * _SERIES_ERROR + (HALF_WIDTH + 1) * 2.0 ** (2 - TABLE_BITS))


def bound_sq(noise_multiplier: float, dimension: int) -> int:
  """The integer bound on |r|^2 of a contribution rounded to the grid z C / SIGMA
  that the accountants charge: (SIGMA / z (1 + slack) + sqrt(d) / 2)^2 (1 +
  2^-18), rounded down, plus 1, never below the bound the TF code computes in
  float32 from z (`integer_gaussian.grid_and_bound`)."""
  if not noise_multiplier > 0 or not math.isfinite(noise_multiplier):
    raise ValueError("noise_multiplier must be positive and finite, got "
                     f"{noise_multiplier}")
  if int(dimension) != dimension or dimension < 1:
    raise ValueError(f"dimension must be a positive integer, got {dimension}")
  radius = SIGMA / noise_multiplier * (1.0 + FLOAT_SLACK) + math.sqrt(dimension) / 2.0
  return min(int(math.floor(radius * radius * (1.0 + _BOUND_MARGIN))) + 1, MAX_BOUND_SQ)


def effective_noise_multiplier(noise_multiplier: float, dimension: int) -> float:
  """SIGMA / sqrt(bound_sq): the Gaussian multiplier the release is as private as."""
  return SIGMA / math.sqrt(bound_sq(noise_multiplier, dimension))


def grid_noise_multiplier(target: float, dimension: int) -> float:
  """The smallest float32 z whose `effective_noise_multiplier` is at least `target`:
  the noise a run draws (z C) for an accounted multiplier `target`."""
  if not target > 0 or not math.isfinite(target):
    raise ValueError(f"target must be a positive finite noise multiplier, got {target}")
  if target < MIN_NOISE_MULTIPLIER:
    raise ValueError(f"a noise multiplier of {target:g} is below "
                     f"{MIN_NOISE_MULTIPLIER:g}, the smallest the integer noise's norm "
                     "bound (2^60) allows")
  shortfall = target * math.sqrt(dimension) / (2.0 * SIGMA)
  if shortfall >= 0.5:
    raise ValueError(
        f"a noise multiplier of {target} over {dimension} coordinates needs a grid finer "
        f"than SIGMA = 2^{SIGMA_BITS} allows (z sqrt(d) / (2 SIGMA) = {shortfall:.2f}, "
        "at most 0.5)")
  z = np.float32(target * (1.0 + FLOAT_SLACK) / (1.0 - shortfall))
  while effective_noise_multiplier(float(z), dimension) < target:
    z = np.nextafter(z, np.float32(np.inf))
  return float(z)


def release_tail(coordinates: float) -> float:
  """What the sampler's gap adds to delta for releases of `coordinates` noisy
  coordinates in all, for any reported epsilon up to EPSILON_CEILING."""
  return (1.0 + math.exp(EPSILON_CEILING)) * coordinates * sampler_gap()
