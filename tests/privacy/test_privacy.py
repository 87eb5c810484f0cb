import itertools
import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from tff_silo.privacy import accounting, dp_sgd, integer_law
from tff_silo.privacy import calibrate_noise_multiplier, epsilon_spent


def _dp_accounting_epsilon(z, q, steps, delta, orders=None):
  acc = dp_accounting.rdp.RdpAccountant(orders) if orders else dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps))
  return acc.get_epsilon(delta)


@pytest.mark.parametrize("z, q, steps, delta", [
    (1.1, 256 / 60000, 14040, 1e-5), (4.7, 32 / 110, 600, 1e-3), (0.8, 1.0, 3, 1e-5)])
def test_epsilon_matches_dp_accounting(z, q, steps, delta):
  ours = epsilon_spent(z, q, steps, delta)
  assert ours == pytest.approx(_dp_accounting_epsilon(z, q, steps, delta,
                                                      list(accounting.RDP_ORDERS)), rel=1e-12)
  # dp_accounting's own default orders give nearly the same figure.
  assert ours == pytest.approx(_dp_accounting_epsilon(z, q, steps, delta), rel=0.02)


def test_golden_values():
  # Regression value of this accountant (dp_accounting 0.4.3, RDP_ORDERS) for the MNIST
  # DP-SGD tutorial setting (z = 1.1, B = 256 of 60,000, 60 epochs, delta = 1e-5),
  # frozen when it was written; dp_accounting's RDP-to-DP conversion is tighter than
  # the classical one the tutorial's older figure (~3) used.
  assert epsilon_spent(1.1, 256 / 60000, 14062, 1e-5) == pytest.approx(2.597, abs=1e-3)


def test_unsampled_gaussian_closed_form():
  # q = 1: T Gaussian steps have RDP T * alpha / (2 z^2); converted to (eps, delta)
  # with eps = min_alpha rdp + log((alpha-1)/alpha) - (log(delta) + log(alpha))/(alpha-1).
  z, steps, delta = 3.0, 40, 1e-6
  a = np.array(accounting.RDP_ORDERS)
  rdp = steps * a / (2 * z ** 2)
  want = np.min(rdp + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1))
  assert epsilon_spent(z, 1.0, steps, delta) == pytest.approx(want, rel=1e-9)


def test_selection_event_has_exponential_mechanism_rdp():
  eps, count = 0.18, 7
  acc = dp_accounting.rdp.RdpAccountant(list(accounting.RDP_ORDERS))
  acc.compose(accounting.selection_event(eps, count))
  orders = np.array(accounting.RDP_ORDERS)
  np.testing.assert_allclose(acc._rdp, count * orders * eps ** 2 / 8, rtol=1e-12)


GRID = list(itertools.product([0.1, 1.0, 6.0, 40.0], [0.01, 0.3, 1.0], [1, 50, 2000],
                              [1e-3, 1e-7]))


@pytest.mark.parametrize("eps, q, steps, delta", GRID)
def test_calibration_never_overshoots_and_is_tight(eps, q, steps, delta):
  z = calibrate_noise_multiplier(eps, delta, q, steps)
  assert epsilon_spent(z, q, steps, delta) <= eps
  # 0.1% less noise would overshoot: the calibration is not needlessly loose.
  assert epsilon_spent(z * (1 - 1e-3), q, steps, delta) > eps


def test_calibrations_and_epsilons_are_remembered(monkeypatch):
  """A setting calibrated (or accounted) before is not searched again (a grid's
  stacked runs), and gives the same multiplier and epsilon; a new one is."""
  setting = accounting.silo_setting(0.37, 501, 1e-3)
  z, spent = accounting.calibrate_noise_multipliers([2.5, 2.5], [setting] * 2)
  assert spent[0] <= 2.5 and z[0] == z[1]

  def searched(*args):
    raise AssertionError("searched again")
  monkeypatch.setattr(accounting, "_search_noise_multipliers", searched)
  monkeypatch.setattr(accounting, "_best_epsilons", searched)
  again, spent_again = accounting.calibrate_noise_multipliers([2.5], [setting])
  assert again[0] == z[0] and spent_again[0] == spent[0]
  assert accounting.epsilons_spent(z[:1], [setting])[0] == spent[0]
  with pytest.raises(AssertionError, match="searched again"):
    accounting.calibrate_noise_multipliers([2.6], [setting])


def test_calibration_with_selections():
  kw = dict(selection_epsilon=0.03 * 2.0, num_selections=20)
  z = calibrate_noise_multiplier(2.0, 1e-5, 0.05, 1000, **kw)
  assert epsilon_spent(z, 0.05, 1000, 1e-5, **kw) <= 2.0
  assert z > calibrate_noise_multiplier(2.0, 1e-5, 0.05, 1000)
  with pytest.raises(ValueError, match="selections"):
    calibrate_noise_multiplier(0.5, 1e-5, 0.05, 1000, selection_epsilon=0.5,
                               num_selections=50)


@pytest.mark.parametrize("kwargs, message", [
    (dict(target_epsilon=0.0), "target_epsilon"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(target_delta=1.0), "target_delta"),
    (dict(sampling_rate=0.0), "sampling_rate"),
    (dict(steps=-3), "steps"),
    (dict(num_selections=2), "selection_epsilon"),
])
def test_calibration_rejects_bad_arguments(kwargs, message):
  args = dict(target_epsilon=1.0, target_delta=1e-5, sampling_rate=0.1, steps=10)
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    calibrate_noise_multiplier(**args)


def test_no_noise_is_infinite_epsilon():
  assert math.isinf(epsilon_spent(0.0, 0.1, 10, 1e-5))


def test_clip_per_example():
  grads = [tf.constant([[3.0, 4.0], [0.3, 0.4]]), tf.constant([0.0, 0.0])]
  clipped = dp_sgd.clip_per_example(grads, 1.0)
  np.testing.assert_allclose(clipped[0].numpy(), [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)


def test_clipped_stacked_sums_equal_clipping_the_formed_gradients():
  """Two groups of four examples: a plain [S, b, 3] gradient and an `OuterProduct`
  of [S, b, 4] x [S, b, 2], each shifted by its group's offset before clipping;
  small and large norms, a masked example and a non-finite one. The sums equal
  `clipped_sum` of the formed gradients over each group's unmasked examples."""
  rng = np.random.default_rng(3)
  plain = rng.normal(size=(2, 4, 3)).astype(np.float32)
  a = rng.normal(size=(2, 4, 4)).astype(np.float32)
  d = rng.normal(size=(2, 4, 2)).astype(np.float32)
  a[0, 1] *= 0.01   # under the clip
  d[0, 1] *= 0.01
  plain[0, 1] *= 0.01
  a[1, 2, 0] = np.nan
  offsets = [rng.normal(size=(2, 3)).astype(np.float32) * 0.1,
             rng.normal(size=(2, 4, 2)).astype(np.float32) * 0.1]
  mask = np.array([[1, 1, 0, 1], [1, 1, 1, 1]], np.float32)
  got = dp_sgd.clipped_stacked_sums(
      [tf.constant(plain), dp_sgd.OuterProduct(tf.constant(a), tf.constant(d))],
      [tf.constant(o) for o in offsets], tf.constant(mask), 1.0)
  for s in range(2):
    kept = mask[s] > 0
    formed = [plain[s][kept] + offsets[0][s],
              np.einsum("bi,bo->bio", a[s], d[s])[kept] + offsets[1][s]]
    want = dp_sgd.clipped_sum([tf.constant(f) for f in formed], 1.0)
    for g, w in zip(got, want):
      np.testing.assert_allclose(g[s].numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
  assert all(np.all(np.isfinite(g.numpy())) for g in got)


@pytest.mark.parametrize("positions, fan_in, fan_out, forms", [
    (25, 4, 3, True),    # T in out = 300 < T^2 (in + out) = 4,375: formed
    (3, 12, 10, False),  # 360 > 198: the Gram matrices' norms, never formed
])
def test_clipped_stacked_sums_of_convolutions_equal_clipping_the_formed_gradients(
    positions, fan_in, fan_out, forms):
  """A convolution's factored per-example gradients (each example's patches [T, in]
  and output gradients [T, out], a kernel [in, out] shaped (2, in / 2, out)), three
  groups of five examples, each shifted by its group's offset before clipping: under
  and over the clip, a masked example, a non-finite one, one whose gradient nearly
  cancels its offset. Whichever way the shapes choose, the sums equal `clipped_sum`
  of the formed gradients."""
  rng = np.random.default_rng(11)
  a = rng.normal(size=(3, 5, positions, fan_in)).astype(np.float32)
  d = rng.normal(size=(3, 5, positions, fan_out)).astype(np.float32) * 0.1
  d[0, 1] *= 1e-3   # under the clip
  a[2, 3, 1, 0] = np.inf
  g = dp_sgd.OuterProduct(tf.constant(a), tf.constant(d))
  assert dp_sgd.forms_cheaper(g) == forms
  kernels = np.einsum("sbti,sbto->sbio", a, d)
  offsets = rng.normal(size=(3, fan_in, fan_out)).astype(np.float32) * 0.05
  offsets[1] = -kernels[1, 2] + 1e-3   # example (1, 2): |g + o| tiny
  shape = (3, 2, fan_in // 2, fan_out)
  mask = np.ones((3, 5), np.float32)
  mask[0, 4] = 0
  got = dp_sgd.clipped_stacked_sums([g], [tf.constant(offsets.reshape(shape))],
                                    tf.constant(mask), 1.0)[0].numpy()
  assert got.shape == shape and np.all(np.isfinite(got))
  for s in range(3):
    kept = mask[s] > 0
    want = dp_sgd.clipped_sum([tf.constant(kernels[s][kept] + offsets[s])], 1.0)[0]
    np.testing.assert_allclose(got[s].reshape(fan_in, fan_out), want.numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("segmented", [True, False])
def test_clipped_linear_sums_equal_clipping_the_formed_gradients(bias, segmented):
  """Nine examples of a linear model (gradient slope_i (x_i, 1)) in three segments,
  each shifted by its segment's offset before clipping: small and large norms, an
  example whose kernel gradient cancels its offset, a non-finite slope. The sums equal
  `clipped_sum` of the formed gradients over each segment's examples (unsegmented:
  all examples, one offset)."""
  rng = np.random.default_rng(5)
  x = rng.normal(size=(9, 4)).astype(np.float32)
  slopes = rng.normal(size=9).astype(np.float32) * 3
  slopes[1] *= 0.001   # under the clip
  slopes[4] = np.nan
  ids = np.array([0, 0, 1, 2, 1, 0, 2, 2, 1], np.int32)
  offsets = [rng.normal(size=(3, 4)).astype(np.float32) * 0.1,
             rng.normal(size=3).astype(np.float32) * 0.1][:2 if bias else 1]
  if not segmented:
    ids[:] = 0
    offsets = [o[0] for o in offsets]
  cancel = 6   # its kernel gradient is its offset's negative: |g|^2 expanded ~ 0
  x[cancel] = -(offsets[0][ids[cancel]] if segmented else offsets[0]) / slopes[cancel]
  got = dp_sgd.clipped_linear_sums(
      tf.constant(x), tf.constant(slopes), [tf.constant(o) for o in offsets], 1.0,
      tf.constant(ids) if segmented else None, 3 if segmented else None)
  for segment in range(3 if segmented else 1):
    kept = ids == segment
    own = [o[segment] if segmented else o for o in offsets]
    formed = [slopes[kept, None] * x[kept] + own[0]]
    if bias:
      formed.append(slopes[kept] + own[1])
    want = dp_sgd.clipped_sum([tf.constant(f) for f in formed], 1.0)
    for g, w in zip(got, want):
      np.testing.assert_allclose(g[segment].numpy() if segmented else g.numpy(),
                                 w.numpy(), rtol=1e-5, atol=1e-6)
  assert len(got) == len(offsets)
  assert all(np.all(np.isfinite(g.numpy())) for g in got)


def test_expanded_norms_never_clip_too_little():
  """Gradients and offsets of norm ~3e4 that cancel to a norm of 1.5 (clip 1):
  float32's expanded |g + o|^2 rounds by thousands there, so without its rounding
  bound many such examples kept factor 1 (norm 1.5). Each example alone in its
  segment (linear) or group (outer product, convolution); each clipped sum's norm,
  in float64, is at most the clip (its own float32 rounding aside)."""
  rng = np.random.default_rng(7)
  m, d = 200, 28
  x = rng.normal(size=(m, d)) * 6e3
  slopes = np.ones(m)
  gap = rng.normal(size=(m, d))
  gap *= 1.5 / np.linalg.norm(gap, axis=1, keepdims=True)
  offsets = (-x + gap).astype(np.float32)   # g + o = gap, |gap| = 1.5
  linear = dp_sgd.clipped_linear_sums(
      tf.constant(x, tf.float32), tf.constant(slopes, tf.float32),
      [tf.constant(offsets)], 1.0, tf.range(m), m)[0].numpy()
  outer = dp_sgd.clipped_stacked_sums(
      [dp_sgd.OuterProduct(tf.constant(x[:, None], tf.float32), tf.ones([m, 1, 1]))],
      [tf.constant(offsets[:, :, None])], tf.ones([m, 1]), 1.0)[0].numpy()[:, :, 0]
  # A convolution's (two positions, 14 x 4 kernel: the Gram matrices' norms).
  patches = rng.normal(size=(m, 1, 2, 14)) * 6e3
  out_grads = rng.normal(size=(m, 1, 2, 4))
  kernels = np.einsum("mbti,mbto->mio", patches, out_grads)
  gap = rng.normal(size=kernels.shape)
  gap *= 1.5 / np.linalg.norm(gap, axis=(1, 2), keepdims=True)
  conv = dp_sgd.OuterProduct(tf.constant(patches, tf.float32),
                             tf.constant(out_grads, tf.float32))
  assert not dp_sgd.forms_cheaper(conv)
  convolution = dp_sgd.clipped_stacked_sums(
      [conv], [tf.constant(-kernels + gap, tf.float32)], tf.ones([m, 1]),
      1.0)[0].numpy().reshape(m, -1)
  for sums in (linear, outer, convolution):
    norms = np.linalg.norm(sums.astype(np.float64), axis=1)
    assert norms.max() <= 1.0 + 1e-2, norms.max()


def test_dp_sgd_noise_statistics():
  # Zero gradients: the output is pure integer noise, std z_g C / normalizer per
  # coordinate at the grid multiplier z_g >= z (rounding's price over 20,000
  # coordinates: 0.65%).
  grads = [tf.zeros([5, 20000])]
  out = dp_sgd.privatize(grads, l2_norm_clip=2.0, noise_multiplier=1.5, normalizer=4.0,
                         seed=tf.constant([1, 2]))[0].numpy()
  z_g = integer_law.grid_noise_multiplier(1.5, 20000)
  assert 1.5 < z_g < 1.5 * 1.01
  # 20,000 draws: the sample std has relative std error 1/sqrt(2*20000) = 0.5%, the
  # mean has std 0.75/141 = 0.0053; tolerances are ~4 standard errors.
  assert np.std(out) == pytest.approx(z_g * 2.0 / 4.0, rel=0.02)
  assert abs(np.mean(out)) < 0.02
  again = dp_sgd.privatize(grads, l2_norm_clip=2.0, noise_multiplier=1.5, normalizer=4.0,
                           seed=tf.constant([1, 2]))[0].numpy()
  np.testing.assert_array_equal(out, again)


def test_nonfinite_per_example_gradient_contributes_zero_and_is_counted():
  grads = [tf.constant([[3.0, 4.0], [np.nan, 0.4], [0.3, np.inf]]),
           tf.constant([1.0, 0.0, 0.0])]
  assert int(dp_sgd.nonfinite_examples(grads)) == 2
  clipped = dp_sgd.clip_per_example(grads, 1.0)
  np.testing.assert_allclose(clipped[0].numpy(), [[3 / np.sqrt(26), 4 / np.sqrt(26)],
                                                  [0, 0], [0, 0]], rtol=1e-6)
  np.testing.assert_allclose(clipped[1].numpy(), [1 / np.sqrt(26), 0, 0], rtol=1e-6)
  out = dp_sgd.privatize(grads, l2_norm_clip=1.0, noise_multiplier=1.0, normalizer=1.0,
                         seed=tf.constant([3, 4]))
  assert all(np.all(np.isfinite(o.numpy())) for o in out)
