"""HyperNetFL / UDP-Alg (Nemala et al. 2023, Algorithm 1): the hypernetwork's
vector-Jacobian product against an explicit Jacobian, one TFF round against the
same round written out in plain TensorFlow, sampling, and the driver."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import hypernet
from hypernet.process import UserInput
from hypernet.process import process_for as hypernet_process_for
from tff_silo import keys
from tff_silo.algorithms.local_training import train_locally
from tff_silo.data import digits_images, label_skewed_silos
from tff_silo.models import linear_regression, small_cnn
from tff_silo.privacy.user_level import UserDPSettings
from tff_silo.privacy.user_level_factory import UserLevelDPMeanFactory
from tff_silo.runner import runner_for


def _tiny_hypernetwork():
  return hypernet.Hypernetwork(linear_regression(3), num_users=4, embedding_dim=2,
                               hidden_width=5)


def test_generate_gives_the_target_shapes():
  hn = hypernet.Hypernetwork(small_cnn((8, 8, 1), 10, channels=(4, 8), hidden=16),
                             num_users=3, embedding_dim=2, hidden_width=6)
  phi, embeddings = hn.init(0)
  theta = hn.generate([tf.constant(p) for p in phi], tf.constant(embeddings[1]))
  assert [tuple(t.shape) for t in theta] == [tuple(s) for s in hn.target.weight_shapes]
  assert embeddings.shape == (3, 2)
  assert hn.num_parameters == sum(p.size for p in phi)


def test_vjp_equals_the_explicit_jacobian_transposed_times_delta():
  hn = _tiny_hypernetwork()
  phi, embeddings = hn.init(1)
  phi = [tf.constant(p) for p in phi]
  v = tf.constant(embeddings[2])
  rng = np.random.default_rng(0)
  delta = [tf.constant(rng.standard_normal(s).astype(np.float32))
           for s in hn.target.weight_shapes]
  phi_part, v_part = hn.vjp(phi, v, delta)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(phi)
    tape.watch(v)
    theta = tf.concat([tf.reshape(t, [-1]) for t in hn.generate(phi, v)], 0)
  flat_delta = np.concatenate([d.numpy().ravel() for d in delta])
  for p, got in zip(phi, phi_part):
    jacobian = tape.jacobian(theta, p).numpy().reshape(len(flat_delta), -1)
    np.testing.assert_allclose(got.numpy().ravel(), jacobian.T @ flat_delta,
                               rtol=1e-5, atol=1e-6)
  jacobian_v = tape.jacobian(theta, v).numpy()
  np.testing.assert_allclose(v_part.numpy(), jacobian_v.T @ flat_delta, rtol=1e-5,
                             atol=1e-6)


def _users(num_users=6, seed=0):
  x, y = digits_images()
  return label_skewed_silos("digits", x, y, num_classes=10, num_users=num_users,
                            classes_per_user=2, seed=seed)


def _process(users, settings, **kwargs):
  target = small_cnn(users.feature_shape, 10, channels=(4, 8), hidden=16)
  hn = hypernet.Hypernetwork(target, users.num_silos, 3, hidden_width=8)
  args = dict(client_learning_rate=0.05, batch_size=8, local_steps=3,
              hypernet_learning_rate=0.5, embedding_learning_rate=0.3)
  args.update(kwargs)
  return hypernet_process_for(
      hypernet.hypernet_algorithm(hn, users.feature_shape, users.train_sizes,
                                  settings, **args))


@pytest.mark.tff
def test_one_round_matches_algorithm_1_written_out():
  users = _users()
  settings = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.05, weight_cap=30.0,
                            public_sizes=True)
  process = _process(users, settings)
  hn, config = process.hypernetwork, process.config
  state = process.initialize()
  sampled = [1, 4]
  user_keys = {u: keys.fold_in(keys.unit_keys(7, 5)[u], 0).numpy() for u in sampled}
  weights = process.user_weights
  inputs = [UserInput(users.x_train[u], users.y_train[u], np.int32(u),
                      np.float32(weights[u]), user_keys[u]) for u in sampled]
  new_state, metrics = process.next(state, inputs)

  phi = [tf.constant(p) for p in state.phi]
  phi_step = [np.zeros(p.shape, np.float32) for p in state.phi]
  embeddings = np.array(state.embeddings)
  for u in sampled:
    v = tf.constant(state.embeddings[u])
    theta = hn.generate(phi, v)
    trained = train_locally(hn.target, config, theta, theta, 0.0,
                            tf.constant(users.x_train[u]), tf.constant(users.y_train[u]),
                            0.0, user_keys[u])
    delta = [a - b for a, b in zip(trained, theta)]
    phi_part, v_part = hn.vjp(phi, v, delta)
    flat = np.concatenate([g.numpy().ravel() for g in phi_part])
    scale = min(1.0, 0.05 / np.linalg.norm(flat))
    for step, g in zip(phi_step, phi_part):
      step += weights[u] * scale * g.numpy()
    embeddings[u] += 0.3 * v_part.numpy()
  total = 0.5 * weights.sum()
  for old, new, step in zip(state.phi, new_state.phi, phi_step):
    np.testing.assert_allclose(new, old + 0.5 * step / total, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(new_state.embeddings, embeddings, rtol=1e-4, atol=1e-7)
  unsampled = [0, 2, 3, 5]
  np.testing.assert_array_equal(new_state.embeddings[unsampled],
                                state.embeddings[unsampled])
  assert new_state.round_num == 1
  assert metrics["aggregator"]["sigma"] == 0.0


@pytest.mark.tff
def test_a_round_without_users_moves_phi_by_noise_only():
  users = _users()
  settings = UserDPSettings(sampling_rate=0.2, l2_norm_clip=0.1, noise_multiplier=5.0)
  process = _process(users, settings)
  state = process.initialize()
  new_state, metrics = process.next(state, [])
  sigma = 5.0 * 0.1 / (0.2 * users.num_silos)
  assert metrics["aggregator"]["sigma"] == pytest.approx(sigma, rel=1e-6)
  moved = np.concatenate([(b - a).ravel() for a, b in zip(state.phi, new_state.phi)])
  assert np.std(moved) == pytest.approx(0.5 * sigma, rel=0.05)   # lambda * noise
  np.testing.assert_array_equal(new_state.embeddings, state.embeddings)


def test_builder_rejects_a_population_mismatch():
  users = _users()
  settings = UserDPSettings(sampling_rate=0.5)
  target = small_cnn(users.feature_shape, 10, channels=(4, 8), hidden=16)
  hn = hypernet.Hypernetwork(target, users.num_silos + 1, 3, hidden_width=8)
  with pytest.raises(ValueError, match="train_sizes has 6 users"):
    hypernet_process_for(
        hypernet.hypernet_algorithm(hn, users.feature_shape, users.train_sizes, settings,
                                    client_learning_rate=0.1, batch_size=8,
                                    local_steps=1, hypernet_learning_rate=0.1,
                                    embedding_learning_rate=0.1))


def test_sampling_is_seeded_and_has_rate_q():
  first = [hypernet.sample_users(50, 0.2, seed=3, round_num=r) for r in range(200)]
  again = [hypernet.sample_users(50, 0.2, seed=3, round_num=r) for r in range(200)]
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  # 10,000 Bernoulli(0.2) draws: the rate is within 0.012 (3 sd) of q.
  assert np.mean([len(s) for s in first]) / 50 == pytest.approx(0.2, abs=0.012)
  assert any(not np.array_equal(first[0], s) for s in first[1:])


@pytest.mark.tff
def test_run_reports_the_accounted_epsilon_and_learns_without_noise():
  users = _users()
  noisy = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=2.0)
  result = hypernet.run_hypernet(_process(users, noisy), users, rounds=3,
                                 target_delta=1e-5, seed=1)
  # The ledger adds three rounds; epsilon() composes them at once: same RDP sum.
  phi_size = hypernet.Hypernetwork(   # _process's: its phi, the noisy coordinates
      small_cnn(users.feature_shape, 10, channels=(4, 8), hidden=16), users.num_silos,
      3, hidden_width=8).num_parameters
  assert result.epsilon == pytest.approx(noisy.epsilon(3, 1e-5, phi_size), rel=1e-12)
  assert result.sigma == pytest.approx(2.0 * 0.1 / (0.5 * 6), rel=1e-6)
  assert len(result.silo_test_metric) == 6 and len(result.users_per_round) == 3
  with pytest.raises(ValueError, match="give target_delta"):
    hypernet.run_hypernet(_process(users, noisy), users, rounds=1)

  plain = UserDPSettings(sampling_rate=1.0)
  untrained = hypernet.run_hypernet(_process(users, plain), users, rounds=1, seed=1)
  trained = hypernet.run_hypernet(_process(users, plain), users, rounds=30, seed=1)
  assert math.isinf(trained.epsilon)
  assert trained.train_metric > untrained.train_metric + 0.2


def test_lenet_target_adds_one_relu_dense_layer():
  """Flat conv features from the one-dense CNN (identity output layer), then by hand."""
  lenet = small_cnn((8, 8, 1), 10, channels=(2, 3), hidden=5)
  flat = lenet.weight_shapes[4][0]
  conv_only = small_cnn((8, 8, 1), flat, channels=(2, 3))
  weights = [tf.constant(w) for w in lenet.init_fn(0)]
  x = tf.constant(digits_images()[0][:4])
  features = conv_only.apply_fn(weights[:4] + [tf.eye(flat), tf.zeros(flat)], x).numpy()
  w1, b1, w2, b2 = [w.numpy() for w in weights[4:]]
  expected = np.maximum(features @ w1 + b1, 0.0) @ w2 + b2
  np.testing.assert_allclose(lenet.apply_fn(weights, x).numpy(), expected, rtol=1e-5,
                             atol=1e-6)
  assert lenet.name == "lenet" and len(lenet.weight_shapes) == 8


def _algorithm(users, settings, **kwargs):
  return _process(users, settings, **kwargs).algorithm


@pytest.mark.parametrize("settings", [
    UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.05, noise_multiplier=3.0,
                   weight_cap=30.0),
    UserDPSettings(sampling_rate=0.5),   # pFedHN: no clip, no noise
], ids=["udp_alg", "pfedhn"])
@pytest.mark.slow
@pytest.mark.tff
def test_vectorized_rounds_equal_the_tff_process(settings):
  """Same users, keys and noise: phi and every embedding agree to float32 tolerance
  after rounds with none (noise only; first, so that the program is traced on it),
  two users, none again and four."""
  users = _users()
  algorithm = _algorithm(users, settings, init_seed=4, noise_seed=9)
  user_keys = keys.unit_keys(5, users.num_silos)
  states = {}
  for backend in ("tff", "vectorized"):
    runner = runner_for(algorithm, backend)
    data = runner.prepare(users.x_train, users.y_train, user_keys)
    state = runner.initialize()
    for sampled in ([], [1, 4], [], [0, 2, 3, 5]):
      state = runner.next(state, np.array(sampled, np.int64), data)
    states[backend] = state
  tff_state, vectorized_state = states["tff"], states["vectorized"]
  assert int(vectorized_state.round_num) == 4
  initial = algorithm.hypernetwork.init(4)[0]
  for start, a, b in zip(initial, tff_state.phi, vectorized_state.phi):
    assert np.abs(np.asarray(a) - start).max() > 1e-4   # phi moved
    np.testing.assert_allclose(b.numpy(), a, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(vectorized_state.embeddings.numpy(), tff_state.embeddings,
                             rtol=1e-4, atol=2e-6)


@pytest.mark.tff
def test_vectorized_run_reports_what_the_tff_run_reports():
  users = _users()
  settings = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=2.0)
  algorithm = _algorithm(users, settings)
  runs = [hypernet.run_hypernet(algorithm, users, rounds=3, target_delta=1e-5, seed=2,
                                backend=backend) for backend in ("tff", "vectorized")]
  np.testing.assert_array_equal(runs[0].users_per_round, runs[1].users_per_round)
  np.testing.assert_allclose(runs[1].silo_test_metric, runs[0].silo_test_metric,
                             atol=1e-9)
  assert runs[1].epsilon == runs[0].epsilon and runs[1].sigma == runs[0].sigma


def test_vectorized_backend_refuses_other_aggregators_in_one_line():
  users = _users()
  algorithm = _algorithm(users, UserDPSettings(sampling_rate=0.5),
                         aggregator=tff.aggregators.MeanFactory())
  with pytest.raises(ValueError, match="other tff.aggregators factories run on "
                     "backend=tff"):
    runner_for(algorithm, "vectorized")
  with pytest.raises(ValueError, match="backend must be one of"):
    runner_for(algorithm, "gpu")


def test_another_aggregator_cannot_claim_the_settings_user_level_epsilon():
  """run_hypernet charges (q, z) to the user-level ledger; only the settings' own
  user-level DP mean adds that noise."""
  users = _users()
  noisy = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=3.0)
  with pytest.raises(ValueError, match="the user-level epsilon would not hold"):
    _algorithm(users, noisy, aggregator=tff.aggregators.MeanFactory())
  other = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=1.0)
  with pytest.raises(ValueError, match="the user-level epsilon would not hold"):
    _algorithm(users, noisy, aggregator=UserLevelDPMeanFactory.for_settings(
        other, users.train_sizes, seed=0))
  own = _algorithm(users, noisy, aggregator=UserLevelDPMeanFactory.for_settings(
      noisy, users.train_sizes, seed=0))
  assert own.sigma == noisy.mean(users.train_sizes).sigma
