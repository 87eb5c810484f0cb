"""The integer Gaussian mechanism (`privacy.integer_law`, `privacy.integer_gaussian`;
issue 53, item 1): its table against an independent 60-digit computation of the
rounded Gaussian, its sampler's search and law, the rounding's norm bound, and the
grid test that today's Gaussian sampler fails (`test_gaussian`) passing for it."""

import bisect
import math

import mpmath
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys as keys_lib
from tff_silo.privacy import integer_gaussian as ig
from tff_silo.privacy import integer_law as law

KEYS = np.arange(8, dtype=np.int32).reshape(4, 2)


def _rounded_gaussian_mass(k: int):
  """P(round(G) = k), G ~ N(0, SIGMA^2), with mpmath's erfc at 60 digits."""
  with mpmath.workdps(60):
    s = law.SIGMA * mpmath.sqrt(2)
    half = mpmath.mpf(1) / 2
    return (mpmath.erfc((k - half) / s) - mpmath.erfc((k + half) / s)) / 2


def test_the_table_is_the_rounded_gaussian_within_its_accounted_gap():
  """Entries' probabilities (exact integers over 2^126) against mpmath's erfc: within
  1e-37 absolute (the masses' relative error is claimed below 1e-38, the table's
  rounding below 2^-124), the cut's mass below the gap, and the gap ~1.3e-32 (what
  `release_tail` charges, times 1 + e^32)."""
  entries = law.table_integers()
  assert entries[-1] == 2 ** law.TABLE_BITS and all(
      a <= b for a, b in zip(entries, entries[1:]))
  with mpmath.workdps(60):
    inside = 1 - mpmath.erfc((law.HALF_WIDTH + mpmath.mpf(1) / 2)
                             / (law.SIGMA * mpmath.sqrt(2)))
    for k in (0, 1, 2, 77, 1000, law.SIGMA, 3 * law.SIGMA + 5, 6 * law.SIGMA,
              9 * law.SIGMA, law.HALF_WIDTH - 1, law.HALF_WIDTH):
      got = mpmath.mpf(entries[k] - (entries[k - 1] if k else 0)) / 2 ** law.TABLE_BITS
      want = _rounded_gaussian_mass(k) * (1 if k == 0 else 2) / inside
      assert abs(got - want) < 1e-37, k
    assert float(1 - inside) < law.sampler_gap()
  assert 1e-33 < law.sampler_gap() < 2e-32
  assert law.release_tail(1) < 2e-18


def test_the_search_counts_the_entries_at_or_below_the_uniform():
  """Crafted words: u = 0 draws 0; u just below / at each of a few entries' values
  draws k / k + 1; the all-ones words draw -HALF_WIDTH (top bit of w0 = the sign)."""
  entries = law.table_integers()
  mask31 = (1 << 31) - 1

  def words(u, negative=False):
    high, low = u >> 63, u & ((1 << 63) - 1)
    return [(high >> 32) | (int(negative) << 31), high & 0xFFFFFFFF,
            low >> 32, low & 0xFFFFFFFF]

  cases = [(0, 0)]
  for k in (0, 1, 5, 1000, law.SIGMA, 8 * law.SIGMA):
    cases += [(entries[k] - 1, k), (entries[k], k + 1)]
  got = ig.noise_of(tf.constant([words(u) for u, _ in cases], tf.uint32)).numpy()
  assert list(got) == [k for _, k in cases]
  ones = tf.constant([[0xFFFFFFFF] * 4, [mask31, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]],
                     tf.uint32)
  assert list(ig.noise_of(ones).numpy()) == [-law.HALF_WIDTH, law.HALF_WIDTH]


def test_the_guided_search_is_the_count_of_entries_at_or_below_u_at_every_bucket_edge():
  """The guide's buckets (`integer_law.guide`) bound the search exactly: against
  bisection on the table for u at both edges of buckets of every bit length of
  2^126 - 1 - u, beside entries of the centre, the tail and the table's end (one
  below, at, one above), and uniform 63- and 126-bit u."""
  entries = list(law.table_integers()[:-1])
  top = (1 << 126) - 1
  rng = np.random.default_rng(1)
  us = [0, 1, top - 1, top]
  for k in [*range(20), *rng.integers(0, law.HALF_WIDTH, 1000),
            *range(law.HALF_WIDTH - 20, law.HALF_WIDTH)]:
    us += [entries[int(k)] + d for d in (-1, 0, 1)]
  us += [int(u) for u in rng.integers(0, 2 ** 63, 1000)]
  us += [(int(a) << 63) | int(b) for a, b in rng.integers(0, 2 ** 63, (1000, 2))]
  for length in range(1, 127):
    width = 1 << max(length - 1 - law.GUIDE_BITS, 0)
    for j in {0, 1, (1 << min(length - 1, law.GUIDE_BITS)) - 1}:
      v = (1 << (length - 1)) + j * width
      us += [top - v, top - (v + width - 1)]
  us = [u for u in us if 0 <= u <= top]
  mask = (1 << 63) - 1
  words = [[(u >> 95), (u >> 63) & 0xFFFFFFFF, (u & mask) >> 32, u & 0xFFFFFFFF]
           for u in us]
  got = ig.noise_of(tf.constant(words, tf.uint32)).numpy()
  want = [bisect.bisect_right(entries, u) for u in us]
  assert list(got) == want


def test_draws_follow_the_table_and_are_the_same_compiled_one_key_or_many():
  """200,000 draws: chi-square against the table's law in 40 equiprobable bins, mean
  and standard deviation; XLA draws the same integers; a row drawn alone equals the
  row drawn with other keys, and a draw of n is a prefix of one of N > n."""
  draws = ig.noise(KEYS, 50_000).numpy()
  assert draws.dtype == np.int64
  pmf = law.sampler_pmf()
  cdf = np.cumsum(pmf)
  edges = np.searchsorted(cdf, np.arange(1, 40) / 40.0) - law.HALF_WIDTH
  bins = np.searchsorted(edges, draws.ravel(), side="right")
  observed = np.bincount(bins, minlength=40)
  expected = np.diff(np.concatenate([[0.0], cdf[edges + law.HALF_WIDTH], [1.0]]))
  assert scipy.stats.chisquare(observed, expected * draws.size).pvalue > 0.01
  assert abs(draws.mean()) < 0.01 * law.SIGMA
  assert abs(draws.std() / law.SIGMA - 1.0) < 0.01
  compiled = tf.function(lambda k: ig.noise(k, 50_000), jit_compile=True)(KEYS)
  np.testing.assert_array_equal(compiled.numpy(), draws)
  np.testing.assert_array_equal(ig.noise(KEYS[2:3], 1_000).numpy()[0], draws[2, :1_000])


def test_a_draw_is_the_search_of_its_high_words_and_its_low_key_s_words():
  """`noise(keys, n)` is `noise_of` of each coordinate's two Philox words and the two
  of its key's INTEGER_LOW child; where u's high half ties an entry the search
  compares (or lies at the top), the low half, drawn lazily, decides."""
  keys = np.array([[5, 6], [-7, 8]], np.int32)
  n = 1_000
  high = br.random_bits(keys, 2 * n).numpy().reshape(2, n, 2)
  low = br.random_bits(br.fold_in(keys, keys_lib.INTEGER_LOW), 2 * n).numpy()
  words = np.concatenate([high, low.reshape(2, n, 2)], -1)
  np.testing.assert_array_equal(ig.noise(keys, n).numpy(), ig.noise_of(words).numpy())
  entries = law.table_integers()
  tied = []   # u's high 63 bits those of an entry, its low half below / at / above
  for k in (0, 3, law.SIGMA, 9 * law.SIGMA + 5, law.HALF_WIDTH - 2):
    h, l = entries[k] >> 63, entries[k] & ((1 << 63) - 1)
    for low_half in {max(l - 1, 0), l, min(l + 1, (1 << 63) - 1)}:
      tied.append([h >> 32, h & 0xFFFFFFFF, low_half >> 32, low_half & 0xFFFFFFFF])
  tied.append([0x7FFFFFFF, 0xFFFFFFFF, 0x1234, 0x5678])   # the top: bucket of low
  tied = np.array(tied, np.uint32)
  lazy = ig.lazy_noise_of(tied[:, :2], lambda: tf.constant(tied[:, 2:]))
  np.testing.assert_array_equal(lazy.numpy(), ig.noise_of(tied).numpy())
  assert len(set(lazy.numpy().tolist())) > 5


def test_a_draw_begins_every_longer_draw_of_its_key():
  """`noise` draws n as its bucket and cuts: the first n coordinates of any longer
  draw (coordinate j is Philox block j of its key)."""
  keys = np.array([[1, 2], [3, -4]], np.int32)
  longest = ig.noise(keys, 300).numpy()
  for n in (1, 16, 17, 29, 200, 299):
    assert ig._bucket(n) >= n and ig._bucket(n) <= max(16, 1.125 * n)
    np.testing.assert_array_equal(ig.noise(keys, n).numpy(), longest[:, :n])


def test_sum_release_is_the_grid_times_the_integer_sum_and_its_draws():
  """One sum's release: grid (sum of round(x / grid) + the key's draws), the grid
  z_g C / 2^14 of the grid multiplier z_g >= z; zero rows add nothing."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(37, 5)).astype(np.float32)
  norms = np.linalg.norm(x, axis=1, keepdims=True)
  x *= (2.0 / np.maximum(1.0, norms)).astype(np.float32)   # norms <= 2
  key = np.array([5, 9], np.int32)
  z_g = law.grid_noise_multiplier(1.3, 5)
  grid = np.float32(z_g) * np.float32(2.0) / np.float32(law.SIGMA)
  integers = np.round(x * (np.float32(1.0) / grid)).astype(np.int64).sum(0)
  expected = grid * (integers + ig.noise(key[None], 5).numpy()[0]).astype(np.float64)
  released = ig.sum_release(x, 2.0, 1.3, key).numpy()
  np.testing.assert_allclose(released, expected, rtol=1e-6)
  padded = np.concatenate([x, np.zeros([20, 5], np.float32)])
  np.testing.assert_array_equal(ig.sum_release(padded, 2.0, 1.3, key).numpy(), released)
  assert z_g >= 1.3


def test_rounding_keeps_every_contribution_within_the_integer_bound():
  """A contribution of norm C rounds within `bound_sq`; a larger one (a clip that
  failed) and a non-finite one count as zero; the grid is z C / SIGMA."""
  z, dimension, clip = 0.8, 50, 2.0
  grid = z * clip / law.SIGMA
  bound = law.bound_sq(z, dimension)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((5, dimension)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True) / clip
  x[3] *= 1.01
  x[4, 7] = np.nan
  r = ig.rounded(x, grid, bound).numpy()
  sq = (r.astype(object) ** 2).sum(1)
  assert all(s <= bound for s in sq[:3]) and sq[3] == 0 and sq[4] == 0
  np.testing.assert_allclose(r[:3] * grid, x[:3], atol=grid)
  assert law.effective_noise_multiplier(z, dimension) < z


def test_rounding_and_segment_sums_are_the_same_in_a_graph_eagerly_and_compiled():
  """The rounding is x times the correctly rounded 1 / grid in every mode (a graph's
  constant folding once made it a Reciprocal, 1 / 1e-4 = 9999.999 for 1,284 grids,
  and half-integers rounded the other way), and the per-segment sums (rounding and
  limb sums fused under XLA) are the exact int64 sums of the rounded rows."""
  m, dimension = 1284, 40
  rng = np.random.default_rng(0)
  grid = np.full(m, 1e-4, np.float32)
  bound = np.full(m, 1 << 40, np.int64)
  x = ((rng.integers(-200, 200, (m, dimension)) + 0.5) * grid[:, None]).astype(np.float32)
  expected = np.round(x * (np.float32(1) / grid[:, None])).astype(np.int64)
  one = lambda x, grid: ig.rounded(x, grid, bound[:, None])
  for r in (one(x, grid), tf.function(one, autograph=False)(x, grid),
            tf.function(one, autograph=False, jit_compile=True)(x, grid)):
    np.testing.assert_array_equal(r.numpy(), expected)
  silos = np.sort(rng.integers(0, 7, m)).astype(np.int32)
  exact = np.zeros((8, dimension), np.int64)
  np.add.at(exact, silos, expected)
  sums = tf.function(lambda x, grid: ig.integer_sums(x, grid, bound, silos, 8),
                     autograph=False)
  np.testing.assert_array_equal(sums(x, grid).numpy(), exact)
  np.testing.assert_array_equal(ig.integer_sums(x, grid, bound, silos, 8).numpy(), exact)

def test_the_grid_multiplier_pays_for_rounding_and_stays_close():
  """`grid_noise_multiplier` is the smallest float32 whose effective multiplier
  reaches the target; School's 28 coordinates cost nothing visible, a 100k-
  parameter model ~1%; a grid too coarse for the target is a one-line error."""
  for target, dimension in ((1.0, 28), (0.7, 100_000), (3.0, 1_000_000)):
    z = law.grid_noise_multiplier(target, dimension)
    assert law.effective_noise_multiplier(z, dimension) >= target
    below = float(np.nextafter(np.float32(z), np.float32(0)))
    assert law.effective_noise_multiplier(below, dimension) < target
  assert law.grid_noise_multiplier(1.0, 28) < 1.0002
  assert law.grid_noise_multiplier(1.0, 100_000) < 1.011
  with pytest.raises(ValueError, match="grid finer"):
    law.grid_noise_multiplier(200.0, 10_000_000)


def test_the_grid_test_that_the_float_gaussian_fails_passes_for_the_integer_one():
  """Issue 53, item 1, the same test as `test_gaussian`'s radius-grid test: a test
  that knows the centre of a release, draws from the sampler's far tail (|noise| >
  4.4 SIGMA, u in the top 2^-16 of its range), a neighbour one sensitivity away.
  Every release of c is a possible release of c + v and the likelihood ratio of
  the sampler's own law never exceeds the Gaussian mechanism's privacy loss bound
  at that point (to the table's 1e-20 relative precision), so nothing tells the
  neighbours apart beyond what epsilon pays for."""
  z, dimension = 1.0, 28
  bound = law.bound_sq(z, dimension)
  v = int(math.isqrt(bound))            # a shift of the full sensitivity, one axis
  rng = np.random.default_rng(0)
  count = 2000
  top = (1 << 32) - (1 << 16)           # w0 (no sign bit) in its top 2^-16
  words = np.stack([rng.integers(top >> 1, 1 << 31, count) | (
      rng.integers(0, 2, count) << 31), rng.integers(0, 2 ** 32, count),
                    rng.integers(0, 2 ** 32, count), rng.integers(0, 2 ** 32, count)],
                   -1).astype(np.uint32)
  noise = ig.noise_of(tf.constant(words)).numpy()
  assert (np.abs(noise) > 4 * law.SIGMA).all()
  pmf = law.sampler_pmf()
  centre, grid = 1234, z * 1.0 / law.SIGMA
  for shift in (0, v, -v):
    release = ((centre + shift + noise).astype(np.float64) * np.float32(grid))
    m = np.round(release / np.float32(grid)).astype(np.int64)   # the integer, exact
    np.testing.assert_array_equal(m, centre + shift + noise)
    for c in (centre, centre + v, centre - v):
      offset = m - c
      assert (np.abs(offset) <= law.HALF_WIDTH).all()
      assert (pmf[offset + law.HALF_WIDTH] > 0).all()
    mine, theirs = pmf[m - centre + law.HALF_WIDTH], pmf[m - centre - v + law.HALF_WIDTH]
    loss = np.log(mine / theirs)
    gaussian_loss = ((m - centre - v + 0.5 * np.sign(m - centre - v)) ** 2
                     - (m - centre - 0.5 * np.sign(m - centre)) ** 2) / (
                         2.0 * law.SIGMA ** 2)
    assert (loss <= gaussian_loss + 1e-9).all()
