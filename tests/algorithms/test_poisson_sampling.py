"""Poisson sampling by geometric gaps (`poisson_sampling`): the distribution of the
sample (each example kept independently with probability q), the chunks' exact
continuation, and the draws' cost."""

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
  sampler = ps.PoissonSampler(tf.fill([trials], rate), tf.fill([trials], n))
  silo, position = sampler.sample(br.uniform, br.fold_in, silo_keys)
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


def test_chunks_continue_until_the_positions_pass_n():
  # Zeros are gaps of 0: every example kept, through ceil(100 / 13) chunks of the
  # chunk width 13 at q = 0.01; gaps of 2 (u at 1 - 0.5^2.5 for q = 0.5) keep
  # every third example.
  width = int(ps.chunk_width(tf.constant(0.01), tf.constant(100)))
  assert width == 13
  zeros = lambda key, w: tf.zeros([1, w])
  silo, position = ps.PoissonSampler(tf.constant([0.01]), tf.constant([100])).sample(
      zeros, br.fold_in, tf.constant([[0, 0]]))
  np.testing.assert_array_equal(position, np.arange(100))
  np.testing.assert_array_equal(silo, np.zeros(100))
  u = 1 - 0.5 ** 2.5
  sampler = ps.PoissonSampler(tf.constant([0.5, 0.5]), tf.constant([30, 10]))
  _, position = sampler.sample(lambda key, w: tf.fill([2, w], u), br.fold_in,
                               tf.zeros([2, 2], tf.int32))
  np.testing.assert_array_equal(position, np.r_[np.arange(2, 30, 3), np.arange(2, 10, 3)])


def test_silos_sample_alone_what_they_sample_together():
  rates = tf.constant([0.5, 0.05, 1.0, 0.2])
  n = tf.constant([9, 300, 4, 0])
  silo_keys = tf.constant([[1, 2], [3, 4], [5, 6], [7, 8]])
  # each silo alone, as the TFF backend draws it (local_training.train_locally)
  silo, position = ps.PoissonSampler(rates, n).sample(br.uniform, br.fold_in, silo_keys)
  for k in range(4):
    _, alone = ps.PoissonSampler(rates[k:k + 1], n[k:k + 1]).sample(
        lambda key, w: tf.random.stateless_uniform([w], seed=key)[None], keys.fold_in,
        silo_keys[k])
    np.testing.assert_array_equal(position.numpy()[silo.numpy() == k], alone)
  assert (silo.numpy() == 2).sum() == 4 and (silo.numpy() == 3).sum() == 0


def test_draws_grow_with_the_expected_batch_not_with_n():
  # A 130,000-person silo with batch 64 draws ~100 uniforms a step, not 130,000.
  widths = ps.chunk_width(tf.constant([64 / 130_000, 0.5, 1.0]),
                          tf.constant([130_000, 10, 5])).numpy()
  np.testing.assert_array_equal(widths, [104, 10, 5])


@pytest.mark.parametrize("xla", [False, True])
def test_the_static_mask_is_the_sample(xla):
  """`kept_mask` (static shapes, for XLA-compiled rounds) keeps what `sample` keeps:
  200 silos of random rates and sizes (one empty, padded to 300 rows), and zeros
  (gaps of 0) that need ceil(100 / 13) chunks; XLA-compiled as well."""
  rng = np.random.default_rng(5)
  rates = tf.constant(np.r_[rng.uniform(0.01, 1.0, 199), 0.3], tf.float32)
  n = tf.constant(np.r_[rng.integers(1, 301, 199), 0], tf.int32)
  silo_keys = tf.constant(rng.integers(-2 ** 31, 2 ** 31, (200, 2)), tf.int32)
  cases = [(rates, n, silo_keys, br.uniform),
           (tf.constant([0.01]), tf.constant([100]), tf.constant([[0, 0]]),
            lambda key, w: tf.zeros([1, w]))]
  for rate, size, key, uniform in cases:
    sampler = ps.PoissonSampler(rate, size)
    silo, position = sampler.sample(uniform, br.fold_in, key)
    want = np.zeros((len(size), 300), np.float32)
    want[silo.numpy(), position.numpy()] = 1.0
    mask = tf.function(lambda r, s, k: ps.PoissonSampler(r, s).kept_mask(
        uniform, br.fold_in, k, 300), jit_compile=xla)(rate, size, key)
    np.testing.assert_array_equal(mask, want)
