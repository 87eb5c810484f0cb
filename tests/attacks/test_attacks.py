"""Gradient inversion (DLG / iDLG), its metrics and the defenses' observed updates."""

import math

import numpy as np
import pytest
import tensorflow as tf

from attacks import defenses, dlg, metrics, models
from tff_silo.data import digits_images


@pytest.fixture(scope="module")
def digits():
  x, y = digits_images()
  return x, y.astype(np.int64)


@pytest.fixture(scope="module")
def lenet():
  return models.sigmoid_lenet((8, 8, 1), 10, seed=0)


# --- the label rule -------------------------------------------------------------------

def test_idlg_reads_every_label_from_the_last_layer(lenet, digits):
  x, _ = digits
  for label in range(10):
    grads = models.gradients(lenet, x[:1], [label])
    assert dlg.infer_label(lenet, grads) == label


def test_label_rule_on_a_hand_made_last_layer():
  # Features h >= 0 and softmax p: the true class's column h (p_c - 1) is the only
  # non-positive one.
  model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4)])
  h = np.array([0.2, 0.0, 1.5], np.float32)
  p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
  y = np.array([0, 0, 1, 0], np.float32)
  kernel_grad = np.outer(h, p - y)
  assert dlg.infer_label(model, [kernel_grad, p - y]) == 2


# --- metrics on known pairs -----------------------------------------------------------

def test_metrics_on_known_pairs():
  truth = np.zeros([2, 8, 8, 1], np.float32)
  recon = truth + np.array([0.1, 0.0], np.float32)[:, None, None, None]
  np.testing.assert_allclose(metrics.mse(truth, recon), [0.01, 0.0], atol=1e-7)
  psnr = metrics.psnr(truth, recon)
  assert psnr[0] == pytest.approx(20.0, abs=1e-3) and math.isinf(psnr[1])
  # Reconstructions are compared after clipping to [0, 1].
  assert metrics.mse(np.ones([1, 4, 4, 1]), 1.5 * np.ones([1, 4, 4, 1]))[0] == 0.0


def test_ssim_of_constant_images_is_its_luminance_term():
  # For constant images only (2 mu_a mu_b + C1) / (mu_a^2 + mu_b^2 + C1) is left,
  # C1 = (0.01 * max_val)^2; dark images make C1 matter (0.833 here, 0.8 without).
  a = np.full([1, 16, 16, 1], 0.02, np.float32)
  b = np.full([1, 16, 16, 1], 0.01, np.float32)
  c1 = 0.01 ** 2
  expected = (2 * 0.02 * 0.01 + c1) / (0.02 ** 2 + 0.01 ** 2 + c1)
  assert metrics.ssim(a, b)[0] == pytest.approx(expected, rel=1e-4)
  assert metrics.ssim(a, a)[0] == pytest.approx(1.0)


def test_ssim_keeps_structure_and_penalizes_an_inverted_digit(digits):
  x, _ = digits
  assert metrics.ssim(x[:1], x[:1])[0] == pytest.approx(1.0)
  assert metrics.ssim(x[:1], 0.9 * x[:1] + 0.05)[0] > 0.9   # contrast change only
  assert metrics.ssim(x[:1], 1.0 - x[:1])[0] < -0.5


def test_matching_recovers_a_permuted_batch(digits):
  x, y = digits
  order = np.array([2, 0, 3, 1])
  shuffled = x[:4][order]
  found = metrics.match(x[:4], shuffled)
  np.testing.assert_array_equal(shuffled[found], x[:4])
  scores = metrics.score(x[:4], y[:4], shuffled, y[:4][order])
  assert scores.label_accuracy == 1.0 and np.all(np.isinf(scores.psnr))


def test_metrics_reject_mismatched_shapes():
  with pytest.raises(ValueError, match="one shape"):
    metrics.mse(np.zeros([1, 8, 8, 1]), np.zeros([1, 8, 8, 3]))
  with pytest.raises(ValueError, match="label shapes differ"):
    metrics.label_accuracy([1, 2], [1])


# --- end-to-end reconstruction --------------------------------------------------------

@pytest.mark.parametrize("method", ["idlg", "dlg"])
def test_reconstructs_a_digit_from_a_one_step_update(lenet, digits, method):
  x, y = digits
  update = models.one_step_update(models.gradients(lenet, x[:1], y[:1]), 0.1)
  grads = models.gradients_from_update(update, 0.1)
  result = dlg.reconstruct(lenet, grads, method=method, iterations=150, seed=0)
  scores = metrics.score(x[:1], y[:1], result.images, result.labels)
  assert scores.label_accuracy == 1.0
  assert scores.psnr[0] > 30.0 and scores.ssim[0] > 0.95
  assert result.loss_curve[-1] < 1e-3 * result.loss_curve[0]


def test_reconstruction_is_deterministic_from_its_seed(lenet, digits):
  x, y = digits
  grads = models.gradients(lenet, x[1:2], y[1:2])
  runs = [dlg.reconstruct(lenet, grads, method="dlg", optimizer=opt, iterations=20,
                          seed=seed)
          for opt, seed in [("lbfgs", 3), ("lbfgs", 3), ("lbfgs", 4), ("adam", 3),
                            ("adam", 3)]]
  np.testing.assert_array_equal(runs[0].images, runs[1].images)
  np.testing.assert_array_equal(runs[0].loss_curve, runs[1].loss_curve)
  assert not np.array_equal(runs[0].images, runs[2].images)
  np.testing.assert_array_equal(runs[3].images, runs[4].images)
  assert len(runs[3].loss_curve) == 21


def test_a_clip_aware_attacker_inverts_a_clipped_gradient(lenet, digits):
  x, y = digits
  clipped = defenses.Defense("clip", l2_norm_clip=0.1)
  update = defenses.observed_update(lenet, x[:1], y[:1], learning_rate=0.1,
                                    defense=clipped)
  grads = models.gradients_from_update(update, 0.1)
  assert float(tf.linalg.global_norm(grads)) == pytest.approx(0.1, rel=1e-4)
  result = dlg.reconstruct(lenet, grads, iterations=150, l2_norm_clip=0.1)
  assert metrics.psnr(x[:1], result.images)[0] > 30.0


def test_dlg_on_a_batch_returns_one_image_and_label_per_example(lenet, digits):
  x, y = digits
  grads = models.gradients(lenet, x[:2], y[:2])
  result = dlg.reconstruct(lenet, grads, method="dlg", iterations=5, batch_size=2)
  assert result.images.shape == (2, 8, 8, 1) and result.labels.shape == (2,)
  np.testing.assert_allclose(result.label_probs.sum(-1), 1.0, rtol=1e-5)


# --- bad inputs -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(iterations=0), "iterations must be a positive integer, got 0"),
    (dict(iterations=-3), "iterations must be a positive integer, got -3"),
    (dict(method="gan"), "method must be one of dlg, idlg; got 'gan'"),
    (dict(optimizer="sgd"), "optimizer must be one of lbfgs, adam; got 'sgd'"),
    (dict(batch_size=2), "idlg reads the label of a single example"),
    (dict(l2_norm_clip=0.0), "l2_norm_clip must be positive or None"),
])
def test_bad_arguments_are_one_line_errors(lenet, digits, kwargs, message):
  x, y = digits
  grads = models.gradients(lenet, x[:1], y[:1])
  with pytest.raises(ValueError, match=message) as error:
    dlg.reconstruct(lenet, grads, **kwargs)
  assert "\n" not in str(error.value)


def test_gradients_that_do_not_match_the_model_are_one_line_errors(lenet, digits):
  x, y = digits
  grads = models.gradients(lenet, x[:1], y[:1])
  other = models.gradients(models.sigmoid_lenet((8, 8, 1), 5), x[:1], [1])
  for bad in (grads[:-1], other, 3.0):
    with pytest.raises(ValueError, match="gradients") as error:
      dlg.reconstruct(lenet, bad)
    assert "\n" not in str(error.value)


# --- defenses -------------------------------------------------------------------------

def test_laplace_noise_scales_with_nu_and_reports_its_leakage(lenet, digits):
  x, y = digits
  exact = models.one_step_update(models.gradients(lenet, x[:1], y[:1]), 0.1)
  distances = []
  for nu in (1e-3, 1.0):
    defense = defenses.Defense("laplace", nu=nu)
    noisy = defenses.observed_update(lenet, x[:1], y[:1], learning_rate=0.1,
                                     defense=defense, seed=(1, 2))
    distances.append(float(tf.linalg.global_norm([a - b for a, b in zip(noisy, exact)])))
    assert defense.leakage(lenet) == pytest.approx(lenet.count_params() / nu)
  assert 0 < distances[0] < 1e-2 * distances[1]


def test_dp_sgd_noise_is_seeded_and_accounted(lenet, digits):
  x, y = digits
  defense = defenses.Defense("dp_sgd", l2_norm_clip=1.0, noise_multiplier=0.5)
  runs = [defenses.observed_update(lenet, x[:2], y[:2], learning_rate=0.1,
                                   defense=defense, seed=s) for s in [(0, 1), (0, 1), (0, 2)]]
  np.testing.assert_array_equal(runs[0][0], runs[1][0])
  assert not np.array_equal(runs[0][0], runs[2][0])
  assert 0 < defense.epsilon(1e-5, lenet) < math.inf
  assert defenses.Defense().epsilon(1e-5, lenet) == math.inf


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="blur"), "defense must be one of none, dp_sgd, clip, laplace"),
    (dict(name="dp_sgd", l2_norm_clip=1.0), "dp_sgd needs noise_multiplier > 0"),
    (dict(name="clip"), "clip needs l2_norm_clip > 0"),
    (dict(name="laplace", nu=0.0), "laplace needs nu > 0"),
    (dict(name="clip", l2_norm_clip=1.0, noise_multiplier=1.0), "for dp_sgd only"),
])
def test_bad_defenses_are_rejected(kwargs, message):
  with pytest.raises(ValueError, match=message):
    defenses.Defense(**kwargs)
