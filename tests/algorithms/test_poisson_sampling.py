"""Poisson sampling by a word per example (`poisson_sampling`): the distribution of
the sample (each example kept independently with probability q), the exact
inclusion rule and its probability against the accountant's q, silos alone and
together, and the static mask of XLA-compiled rounds."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys
from tff_silo.algorithms import poisson_sampling as ps


def _masks(rate, n, trials, seed):
  """[trials, n] indicators of the kept examples of `trials` silos' samples."""
  silo_keys = tf.stack([tf.range(trials), tf.fill([trials], seed)], 1)
  sampler = ps.PoissonSampler(tf.fill([trials], ps.rate_threshold(rate)),
                              tf.fill([trials], n))
  silo, position = sampler.sample(br.random_bits, silo_keys)
  mask = np.zeros((trials, n))
  mask[silo.numpy(), position.numpy()] = 1.0
  assert mask.sum() == len(position)   # no example twice
  return mask


@pytest.mark.parametrize("rate, n", [(0.3, 20), (0.02, 150), (1.0, 7)])
def test_each_example_is_kept_independently_with_probability_q(rate, n):
  trials = 40_000
  mask = _masks(rate, n, trials, seed=3)
  if rate == 1.0:
    assert mask.all()
    return
  # Inclusion of every position: within 4.5 sd (n tests; a wrong gap law, e.g.
  # Geometric(q) counted from 1, moves them by 20+ sd).
  sd = np.sqrt(rate * (1 - rate) / trials)
  assert np.abs(mask.mean(0) - rate).max() < 4.5 * sd
  # Pairs: the correlation of positions i, j is ~N(0, 1/trials) when independent.
  corr = np.corrcoef(mask.T)[np.triu_indices(n, 1)]
  assert np.abs(corr).max() * np.sqrt(trials) < 5.0
  # The batch size is Binomial(n, q): chi-square over the sizes with >= 20
  # expected trials, the rest pooled.
  sizes = mask.sum(1).astype(int)
  expected = scipy.stats.binom.pmf(np.arange(n + 1), n, rate) * trials
  big = expected >= 20
  observed = np.bincount(sizes, minlength=n + 1)
  obs = np.append(observed[big], observed[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  assert scipy.stats.chisquare(obs, exp).pvalue > 1e-4


def test_an_example_is_kept_exactly_when_its_word_is_below_the_threshold():
  """Row i of a silo is kept iff its own word w_i < floor(B 2^32 / m): words at the
  threshold and one below, the extremes, B >= m (every row) and a silo of 0 rows."""
  below = ps.threshold(tf.constant([3, 64, 5, 7]), tf.constant([10, 130_000, 5, 0]))
  t = [3 * 2 ** 32 // 10, 64 * 2 ** 32 // 130_000]
  np.testing.assert_array_equal(below, t + [2 ** 32, 0])
  words = np.array([[t[0] - 1, t[0], 0, 2 ** 32 - 1, t[0] + 1],
                    [t[1] - 1, t[1], 0, 2 ** 32 - 1, t[1] - 2],
                    [2 ** 32 - 1] * 5, [0] * 5], np.uint32)
  n = tf.constant([5, 4, 5, 0])
  bits = lambda key, width: tf.constant(words[:, :width])
  silo, position = ps.PoissonSampler(below, n).sample(bits, tf.zeros([4, 2], tf.int32))
  np.testing.assert_array_equal(silo, [0, 0, 1, 1, 2, 2, 2, 2, 2])
  np.testing.assert_array_equal(position, [0, 2, 0, 2, 0, 1, 2, 3, 4])
  mask = ps.PoissonSampler(below, n).kept_mask(bits, tf.zeros([4, 2], tf.int32), 5)
  np.testing.assert_array_equal(mask, [[1, 0, 1, 0, 0], [1, 0, 1, 0, 0], [1] * 5, [0] * 5])


def test_every_silos_inclusion_probability_is_the_accounted_rate_within_1e_6():
  """The exact inclusion probability of every row, floor(B 2^32 / m) / 2^32 (each row
  its own uniform 32-bit word), is at most the accountant's q = B / m and within
  1e-6 of it relative: every public size up to 20,000 at the presets' batches, and
  every size up to a 130,000-person pandemic silo at batch 64 (q >= 4.9e-4) and at
  the forecaster's batch."""
  from benchmarks.configs import PRESETS
  from tff_silo.pandemic.pipeline import BATCH_SIZE
  batches = {p.batch_size for p in PRESETS.values()}
  cases = [(b, np.arange(1, 20_001)) for b in sorted(batches)]
  cases += [(b, np.arange(1, 130_001)) for b in (64, BATCH_SIZE)]
  for batch, m in cases:
    hazard = ps.threshold(tf.fill(m.shape, batch), tf.constant(m)).numpy() / 2 ** 32
    q = np.minimum(batch, m) / m
    assert (hazard <= q).all()
    assert (hazard >= q * (1 - 1e-6)).all(), batch
  # HyperNetFL's users: a float rate's own binary fraction, floored.
  for rate in (0.3, 0.1, 0.05, 1.0, 1e-3):
    assert rate * (1 - 1e-6) <= ps.rate_threshold(rate) / 2 ** 32 <= rate
  with pytest.raises(ValueError, match="sampling rate"):
    ps.rate_threshold(1.5)


def test_silos_sample_alone_what_they_sample_together():
  n = tf.constant([9, 300, 4, 0])
  below = tf.constant([2 ** 31, 2 ** 32 // 20, 2 ** 32, 2 ** 32 // 5], tf.int64)
  silo_keys = tf.constant([[1, 2], [3, 4], [5, 6], [7, 8]])
  # each silo alone, as the TFF backend draws it (local_training.train_locally)
  silo, position = ps.PoissonSampler(below, n).sample(br.random_bits, silo_keys)
  for k in range(4):
    _, alone = ps.PoissonSampler(below[k:k + 1], n[k:k + 1]).sample(
        lambda key, w: tf.random.stateless_uniform(
            [w], seed=key, minval=None, maxval=None, dtype=tf.uint32)[None],
        silo_keys[k])
    np.testing.assert_array_equal(position.numpy()[silo.numpy() == k], alone)
  assert (silo.numpy() == 2).sum() == 4 and (silo.numpy() == 3).sum() == 0


@pytest.mark.parametrize("xla", [False, True])
def test_the_static_mask_is_the_sample(xla):
  """`kept_mask` (static shapes, for XLA-compiled rounds) keeps what `sample` keeps:
  200 silos of random thresholds and sizes (one empty, padded to 300 rows), and one
  that keeps everything; XLA-compiled as well."""
  rng = np.random.default_rng(5)
  below = tf.constant(np.r_[rng.integers(0, 2 ** 32, 198), 2 ** 32, 2 ** 30], tf.int64)
  n = tf.constant(np.r_[rng.integers(1, 301, 199), 0], tf.int32)
  silo_keys = tf.constant(rng.integers(-2 ** 31, 2 ** 31, (200, 2)), tf.int32)
  silo, position = ps.PoissonSampler(below, n).sample(br.random_bits, silo_keys)
  want = np.zeros((200, 300), np.float32)
  want[silo.numpy(), position.numpy()] = 1.0
  assert want[198, :int(n[198])].all()
  mask = tf.function(lambda b, s, k: ps.PoissonSampler(b, s).kept_mask(
      br.random_bits, k, 300), jit_compile=xla)(below, n, silo_keys)
  np.testing.assert_array_equal(mask, want)
