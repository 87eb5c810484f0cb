"""Statistical tests of the selection and d-privacy mechanisms (seeded)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_silo.privacy import d_privacy, selection


def test_report_noisy_min_matches_exponential_mechanism():
  scores = tf.constant([0.1, 0.2, 0.5, 0.25])
  eps, sens, draws = 2.0, 0.1, 40000
  picks = selection.report_noisy_min(tf.tile(scores[None], [draws, 1]), eps, sens,
                                     seed=tf.constant([7, 1])).numpy()
  freq = np.bincount(picks, minlength=4) / draws
  want = selection.exponential_mechanism_probabilities(scores, eps, sens).numpy()
  np.testing.assert_allclose(want.sum(), 1.0, rtol=1e-6)
  np.testing.assert_allclose(want, np.exp(-eps * scores.numpy() / (2 * sens)) /
                             np.exp(-eps * scores.numpy() / (2 * sens)).sum(), rtol=1e-5)
  # Binomial std of a frequency <= sqrt(0.25 / 40000) = 0.0025: 0.01 is 4 std errors.
  np.testing.assert_allclose(freq, want, atol=0.01)


def test_report_noisy_min_is_seeded_and_picks_min_with_tiny_noise():
  scores = tf.constant([[0.3, 0.1, 0.2]])
  a = selection.report_noisy_min(scores, 1.0, 0.5, tf.constant([1, 2]))
  b = selection.report_noisy_min(scores, 1.0, 0.5, tf.constant([1, 2]))
  assert int(a[0]) == int(b[0])
  # Huge epsilon: the noise scale 2 * sens / eps is negligible, the argmin wins.
  assert int(selection.report_noisy_min(scores, 1e6, 1e-3, tf.constant([3, 4]))[0]) == 1


@pytest.mark.parametrize("epsilon, sensitivity", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_report_noisy_min_rejects_bad_arguments(epsilon, sensitivity):
  with pytest.raises(ValueError):
    selection.report_noisy_min([0.1, 0.2], epsilon, sensitivity, tf.constant([0, 0]))


@pytest.mark.parametrize("dim, epsilon", [(2, 0.5), (10, 2.0), (100, 4.0)])
def test_euclidean_laplace_radius_and_component_variance(dim, epsilon):
  draws = 40000
  noise = d_privacy.euclidean_laplace_noise(dim, epsilon, tf.constant([5, dim]),
                                            batch_shape=[draws]).numpy()
  radii = np.linalg.norm(noise, axis=1)
  # Radius ~ Gamma(dim, 1/eps): mean dim/eps, relative std error 1/sqrt(dim * draws)
  # <= 0.0036; 2% is > 5 standard errors.
  assert radii.mean() == pytest.approx(dim / epsilon, rel=0.02)
  assert radii.var() == pytest.approx(dim / epsilon ** 2, rel=0.05)
  # Lemma 2: each component has variance (dim + 1) / eps^2; the sample variance of
  # 40,000 draws of a heavy-ish tailed component has relative std error < 2%.
  np.testing.assert_allclose(noise.var(axis=0).mean(), (dim + 1) / epsilon ** 2,
                             rtol=0.03)
  # Uniform direction: each component of a unit vector has mean 0 and variance 1/dim,
  # so its mean over the draws has std 1/sqrt(dim * draws); all <= 5 std errors.
  units = noise / radii[:, None]
  assert np.abs(units.mean(axis=0)).max() < 5 / np.sqrt(dim * draws)
  np.testing.assert_allclose((units ** 2).mean(axis=0).mean(), 1 / dim, rtol=1e-5)


def test_sanitize_update_scale_and_leakage():
  delta = [tf.fill([4, 5], 0.5), tf.constant([3.0, 4.0])]
  nu = 2.0
  out, leakage = d_privacy.sanitize_update(delta, nu, tf.constant([0, 1]))
  assert leakage == [20 / nu, 2 / nu]
  assert [o.shape for o in out] == [d.shape for d in delta]
  # Per layer, eps = n / (nu ||delta||): the noise radius has mean nu * ||delta||
  # (3,000 releases of the update, one per key).
  release_keys = tf.stack([tf.range(3000), tf.fill([3000], 9)], axis=1)
  out = d_privacy.sanitize_updates([tf.tile(d[None], [3000] + [1] * len(d.shape))
                                    for d in delta], nu, release_keys)
  draws = np.linalg.norm(out[1].numpy() - delta[1].numpy(), axis=1)
  assert np.mean(draws) == pytest.approx(nu * 5.0, rel=0.05)  # ||(3, 4)|| = 5
  zero, _ = d_privacy.sanitize_update([tf.zeros([3])], nu, tf.constant([0, 0]))
  np.testing.assert_array_equal(zero[0].numpy(), np.zeros(3))


@pytest.mark.parametrize("dim", [1, 3, 1000])
def test_euclidean_laplace_radius_is_gamma_distributed(dim):
  """The radius, a sum of dim Exp(1) draws, against scipy's Gamma(dim, 1 / eps)
  CDF: Kolmogorov-Smirnov over 20,000 seeded draws (p 0.56, 0.54, 0.25; a shape
  one off is rejected at p < 1e-10 for dims 1 and 3, at 1e-6 and 0.03 for 999
  and 1001)."""
  from scipy import stats
  epsilon = 2.0
  noise = d_privacy.euclidean_laplace_noise(dim, epsilon, tf.constant([11, dim]),
                                            batch_shape=[20000]).numpy()
  radii = np.linalg.norm(noise.astype(np.float64), axis=1)
  assert stats.kstest(radii, stats.gamma(dim, scale=1 / epsilon).cdf).pvalue > 1e-3


@pytest.mark.parametrize("dim", [1, 7, 1000, 70_001])
def test_the_radius_is_the_float64_sum_of_the_exp1_draws(dim):
  """The float32 pairwise sum of `batched_random.exponentials` against float64's sum
  of -ln(1 - u): within each draw's 2^-21 and the sum's log2(n) 2^-24, relative."""
  from tff_silo import batched_random as br
  row_keys = tf.constant([[3, 1], [4, 1], [5, 9]])
  radii = d_privacy._sample(row_keys, dim, tf.ones([3]))
  noise = np.linalg.norm(radii.numpy().astype(np.float64), axis=1)
  exact = -np.log1p(-br.uniform64(br.fold_in(row_keys, 0), dim).numpy()).sum(axis=1)
  bound = 2.0 ** -21 + np.log2(max(dim, 2)) * 2.0 ** -24 + 2.0 ** -22   # + the norm's
  np.testing.assert_allclose(noise, exact, rtol=bound, atol=0)


def test_batched_sanitized_releases_are_the_single_ones_compiled_or_not():
  """Row k of `sanitize_updates` is `sanitize_update` with key k, and XLA draws
  the same numbers."""
  delta = [tf.reshape(tf.range(24, dtype=tf.float32), [3, 2, 4]) / 10.0,
           tf.constant([[1.0], [0.0], [-2.0]])]
  release_keys = tf.constant([[1, 2], [3, 4], [5, 6]])
  batched = d_privacy.sanitize_updates(delta, 1.5, release_keys)
  compiled = tf.function(lambda d, k: d_privacy.sanitize_updates(d, 1.5, k),
                         jit_compile=True)(delta, release_keys)
  for k in range(3):
    single, _ = d_privacy.sanitize_update([d[k] for d in delta], 1.5, release_keys[k])
    for a, b, c in zip(single, batched, compiled):
      np.testing.assert_allclose(b[k], a, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(c[k], a, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(batched[1][1], [0.0])   # a zero update: no noise


@pytest.mark.parametrize("kwargs", [dict(dim=0, epsilon=1.0), dict(dim=3, epsilon=0.0)])
def test_euclidean_laplace_rejects_bad_arguments(kwargs):
  with pytest.raises(ValueError):
    d_privacy.euclidean_laplace_noise(seed=tf.constant([0, 0]), **kwargs)


def test_sanitize_rejects_nonpositive_nu():
  with pytest.raises(ValueError, match="nu"):
    d_privacy.sanitize_update([tf.ones([2])], 0.0, tf.constant([0, 0]))


def test_gumbel_is_untruncated_to_float64_resolution():
  draws = selection.gumbel([200000], tf.constant([5, 6])).numpy()
  assert draws.dtype == np.float64 and np.all(np.isfinite(draws))
  # Standard Gumbel: mean = Euler's gamma, variance pi^2 / 6; 200,000 draws give a
  # standard error of 0.0029 for the mean and ~0.008 for the variance (4 s.e. below).
  assert abs(draws.mean() - np.euler_gamma) < 0.012
  assert abs(draws.var() - np.pi ** 2 / 6) < 0.035
  # The tail: P(G > 10) = 1 - exp(-e^-10) = 4.5e-5 per draw, 9 expected here.
  assert np.sum(draws > 10) > 0
