"""Worked expected values of the shared local-training routine (pure TF)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import models
from tff_silo.privacy import dp_sgd
from tff_silo.algorithms.local_training import (LocalTrainingConfig, first_of_permutation,
                                                random_permutation, train_locally,
                                                uniform_keys)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 3)).astype(np.float32)
Y = RNG.normal(size=8).astype(np.float32)
W0 = [np.array([0.5, -1.0, 0.25], np.float32), np.array(0.1, np.float32)]
ANCHOR = [np.array([1.0, 1.0, 1.0], np.float32), np.array(-1.0, np.float32)]


def _run(config, lam=0.0, noise=0.0, seed=(0, 0), x=X, y=Y, model=None):
  model = model or models.linear_regression(3)
  out = train_locally(model, config, [tf.constant(w) for w in W0],
                      [tf.constant(a) for a in ANCHOR], tf.constant(lam, tf.float32),
                      tf.constant(x), tf.constant(y), tf.constant(noise, tf.float32),
                      tf.constant(seed, tf.int32))
  return [o.numpy() for o in out]


def _gd_step(lr, lam, clip=None):
  """One full-batch gradient step of 0.5 * mean squared error + lam/2 ||w - a||^2."""
  w, b = W0
  resid = X @ w + b - Y
  gw, gb = X * resid[:, None], resid
  gw, gb = gw + lam * (w - ANCHOR[0]), gb + lam * (b - ANCHOR[1])
  if clip is not None:
    norms = np.sqrt((gw ** 2).sum(1) + gb ** 2)
    f = np.minimum(1.0, clip / norms)
    gw, gb = gw * f[:, None], gb * f
  return [w - lr * gw.mean(0), b - lr * gb.mean()]


@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_full_batch_step_is_gradient_descent(lam):
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=100)  # B >= n: one step
  for got, want in zip(_run(config, lam), _gd_step(0.1, lam)):
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_dp_step_without_noise_is_clipped_gradient_descent(sampling):
  # B >= n: q = 1, every example is in the one batch; no noise; per-example clip 0.5.
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=100, l2_norm_clip=0.5,
                               sampling=sampling, noise="idealized")
  for got, want in zip(_run(config, lam=0.7), _gd_step(0.1, 0.7, clip=0.5)):
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_integer_noise_step_is_clipped_gradient_descent_plus_its_noise():
  """The integer mechanism's step (default noise) at z = 1e-3: clipped gradient
  descent, off by the noise alone (within 6 of its standard deviations, z C lr / n
  a coordinate: the grid's rounding, z C / 2^14 per example, is far below)."""
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=100, l2_norm_clip=0.5)
  assert config.integer_noise
  z, n = 1e-3, len(Y)
  for got, want in zip(_run(config, lam=0.7, noise=z), _gd_step(0.1, 0.7, clip=0.5)):
    np.testing.assert_allclose(got, want, atol=6 * z * 0.5 * 0.1 / n)
    assert not np.allclose(got, want, rtol=1e-7, atol=0)   # the noise is there


def test_closed_form_per_example_gradients_match_vectorized_map():
  # The same DP step with the linear model's closed form and with tf.vectorized_map.
  linear = models.linear_svm(3)
  generic = models.SiloModel(
      name="svm_generic", weight_shapes=linear.weight_shapes, init_fn=linear.init_fn,
      apply_fn=linear.apply_fn, loss_fn=linear.loss_fn, metric="accuracy",
      predict_fn=linear.predict_fn)
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=3, epochs=2,
                               l2_norm_clip=0.3)
  y = np.sign(Y).astype(np.float32)
  a = _run(config, lam=0.2, noise=1.0, y=y, model=linear)
  b = _run(config, lam=0.2, noise=1.0, y=y, model=generic)
  for u, v in zip(a, b):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [models.linear_regression, models.linear_svm,
                                  models.logistic_regression,
                                  lambda d: models.linear_regression(d, bias=False)])
def test_linear_form_gives_the_per_example_gradients(make):
  """slope_i (x_i, 1) from `linear_form_fn` is each example's gradient (a tape's
  per example), with one model's weights and with each example's own."""
  model = make(3)
  rng = np.random.default_rng(1)
  weights = [tf.constant(rng.normal(size=s).astype(np.float32))
             for s in model.weight_shapes]
  y = np.where(Y > 0, 1.0, -1.0 if model.name == "linear_svm" else 0.0).astype(
      np.float32) if model.metric == "accuracy" else Y
  want = []
  for i in range(len(X)):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = model.per_example_loss(weights, X[i:i + 1], y[i:i + 1])[0]
    want.append(tape.gradient(loss, weights))
  want = [tf.stack(g) for g in zip(*want)]
  own = [tf.tile(w[None], [len(X)] + [1] * len(w.shape)) for w in weights]
  for these in (weights, own):
    features, slopes = model.linear_form_fn(these, tf.constant(X), tf.constant(y))
    got = [slopes[:, None] * features, slopes][:len(weights)]
    for g, w in zip(got, want):
      np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-7)


def test_seeded_and_noisy():
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=2, l2_norm_clip=1.0)
  a, b = _run(config, noise=1.0, seed=(3, 4)), _run(config, noise=1.0, seed=(3, 4))
  c = _run(config, noise=1.0, seed=(3, 5))
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.allclose(a[0], c[0])


def test_poisson_batches_have_expected_size():
  # The update counts examples: regression on x = 0 features and y = -1 targets, DP
  # without noise, a tiny learning rate (b stays ~0): each per-example gradient of
  # the bias is b - y = 1, so each step moves b by -lr * (batch size) / B.
  n, batch = 400, 40
  x = np.zeros((n, 3), np.float32)
  y = -np.ones(n, np.float32)
  model = models.linear_regression(3)
  config = LocalTrainingConfig(learning_rate=1e-4, batch_size=batch, l2_norm_clip=1.0)
  out = train_locally(model, config, [tf.zeros(3), tf.zeros([])],
                      [tf.zeros(3), tf.zeros([])], 0.0, x, y, 0.0, tf.constant([0, 0]))
  steps = n // batch
  mean_batch = -float(out[1].numpy()) / 1e-4 / steps * batch
  # Sum of 10 Binomial(400, 0.1) has std 19; the mean batch size 40 +- 1.9 (3 sigma: 5.7).
  assert abs(mean_batch - batch) < 6.0


def test_config_validation():
  with pytest.raises(ValueError, match="sampling"):
    LocalTrainingConfig(learning_rate=0.1, batch_size=2, sampling="bogus")
  with pytest.raises(ValueError, match="learning_rate"):
    LocalTrainingConfig(learning_rate=0.0, batch_size=2)
  with pytest.raises(ValueError, match="l2_norm_clip"):
    LocalTrainingConfig(learning_rate=0.1, batch_size=2, l2_norm_clip=-1.0)


def test_cnn_per_example_gradients_run():
  model = models.small_cnn((8, 8, 1), 10, channels=(4, 8))
  x = RNG.random((6, 8, 8, 1)).astype(np.float32)
  y = RNG.integers(0, 10, 6).astype(np.float32)
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=3, l2_norm_clip=1.0)
  w = [tf.constant(v) for v in model.initial_weights(0)]
  out = train_locally(model, config, w, w, 0.0, x, y, 1.0, tf.constant([0, 1]))
  assert [o.shape for o in out] == [v.shape for v in w]
  assert all(np.all(np.isfinite(o.numpy())) for o in out)


@pytest.mark.parametrize("shape, hidden", [((8, 8, 1), None), ((12, 12, 2), 5)])
def test_cnn_stacked_per_example_gradients_equal_autodiff(shape, hidden):
  """S = 2 models with 3 examples each (SAME and VALID padding, with and without
  the hidden layer): every example's gradient, formed, is the tape's gradient of
  its own loss under its own model."""
  model = models.small_cnn(shape, 4, channels=(3, 5), hidden=hidden)
  weights = [tf.constant(np.stack(w)) for w in zip(model.initial_weights(1),
                                                  model.initial_weights(2))]
  x = tf.constant(RNG.normal(size=(2, 3, *shape)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 4, (2, 3)).astype(np.float32))
  got = model.stacked_per_example_gradients_fn(weights, x, y)
  for s in range(2):
    for i in range(3):
      own = [w[s] for w in weights]
      with tf.GradientTape() as tape:
        tape.watch(own)
        loss = model.per_example_loss(own, x[s, i:i + 1], y[s, i:i + 1])[0]
      for g, want in zip(got, tape.gradient(loss, own)):
        formed = np.reshape(dp_sgd.formed(g)[s, i], want.shape)
        np.testing.assert_allclose(formed, want, rtol=1e-4, atol=1e-6)


def test_fixed_step_count_continues_shuffled_epochs():
  """`steps` runs exactly that many steps: with n = 8 and B = 4 an epoch is 2 steps."""
  by_epochs = _run(LocalTrainingConfig(learning_rate=0.1, batch_size=4, epochs=2,
                                       sampling="shuffle"))
  by_steps = _run(LocalTrainingConfig(learning_rate=0.1, batch_size=4, steps=4,
                                      sampling="shuffle"))
  one_epoch = _run(LocalTrainingConfig(learning_rate=0.1, batch_size=4, steps=2,
                                       sampling="shuffle"))
  for a, b in zip(by_epochs, by_steps):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  assert not np.allclose(one_epoch[0], by_steps[0])
  with pytest.raises(ValueError, match="local steps must be a positive integer"):
    LocalTrainingConfig(learning_rate=0.1, batch_size=4, steps=0)


def _bias_only_run(sampling, size=0.0, batch_size=4, n=10, key=(0, 0)):
  """x = 0, y = 1 from bias 0: every example's gradient is (0, b - 1), clipped to
  0.5 while b < 0.5, so each sampled example moves b by lr * 0.5 / normalizer."""
  model = models.linear_regression(1)
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=batch_size,
                               l2_norm_clip=0.5, sampling=sampling)
  zero = [tf.zeros([1]), tf.constant(0.0)]
  out = train_locally(model, config, zero, zero, tf.constant(0.0),
                      tf.zeros([n, 1]), tf.ones([n]), tf.constant(0.0),
                      tf.constant(key, tf.int32), 0, tf.constant(size, tf.float32))
  return float(out[1])


def test_sampling_without_replacement_takes_exactly_b_examples_per_step():
  # n = 10, B = 4: 2 steps of exactly 4 examples, each step 0.1 * 0.5 * 4 / 4.
  for key in ((0, 0), (5, 9)):
    assert _bias_only_run("without_replacement", key=key) == pytest.approx(0.1)


def test_a_batch_without_replacement_is_the_permutations_head():
  # the partial sort picks what the full sort's first k are, in its order: ties
  # (here many, and padded rows' 2^52) go in index order
  rng = np.random.default_rng(0)
  values = np.concatenate([rng.integers(0, 5, (3, 40)) * 2 ** 50,
                           np.full((3, 8), 2 ** 52)], 1)
  for k in (1, 7, 40, 48):
    np.testing.assert_array_equal(
        first_of_permutation(tf.constant(values, tf.int64), k).numpy(),
        random_permutation(tf.constant(values, tf.int64)).numpy()[:, :k])
  # float32 uniforms tie too often for a uniform subset (its docstring)
  with pytest.raises(TypeError, match="int64 keys"):
    first_of_permutation(tf.constant(values, tf.float32), 1)


def test_uniform_keys_order_float64_uniforms_exactly_as_integers():
  """TF's float64 uniforms times 2^52 are integers below 2^52, in the same order
  with the same ties; the batched draw gives the same keys."""
  from tff_silo import batched_random
  key = tf.constant([[7, -3]], tf.int32)
  uniforms = tf.random.stateless_uniform([1000], seed=key[0], dtype=tf.float64)
  keys = uniform_keys(uniforms).numpy()
  np.testing.assert_array_equal(keys / 2.0 ** 52, uniforms.numpy())
  assert keys.max() < 2 ** 52 and len(np.unique(keys)) == len(np.unique(uniforms))
  np.testing.assert_array_equal(batched_random.mantissas(key, 1000).numpy()[0], keys)
  np.testing.assert_array_equal(np.argsort(keys, kind="stable"),
                                np.argsort(uniforms.numpy(), kind="stable"))


def test_poisson_sampling_follows_the_public_size():
  # m = 40, B = 4: 10 steps at rate 0.1 on 10 examples, normalizer 4; the sampled
  # counts are random, so b is a multiple of 0.1 * 0.5 / 4 = 0.0125 that varies.
  runs = [_bias_only_run("poisson", size=40.0, key=(k, 0)) for k in range(8)]
  assert all(abs(r / 0.0125 - round(r / 0.0125)) < 1e-4 for r in runs)
  assert len({round(r / 0.0125) for r in runs}) > 1
  # 100 Bernoulli(0.1) draws x 0.0125: mean 0.125, sd 0.0375 per run, 0.013 for the
  # mean of 8; 0.055 is 4 sd.
  assert abs(np.mean(runs) - 0.125) < 0.055


@pytest.mark.parametrize("shape, hidden, expected", [
    # unpadded 28x28: conv1 26*26*9*32, conv2 11*11*9*32*64, dense 5*5*64*10
    ((28, 28, 1), None, 2 * (2 * 194_688 + 3 * 2_230_272 + 3 * 16_000)),
    # SAME-padded 8x8 with a hidden layer: 8*8*9*32, 4*4*9*32*64, 2*2*64*7, 7*10
    ((8, 8, 1), 7, 2 * (2 * 18_432 + 3 * 294_912 + 3 * 1_792 + 3 * 70)),
])
def test_cnn_training_flops_count_each_layers_passes(shape, hidden, expected):
  model = models.small_cnn(shape, 10, hidden=hidden)
  assert models.cnn.training_flops(shape, model.weight_shapes) == expected
