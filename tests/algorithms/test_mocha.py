"""Mocha (primal, SGD; thesis sec. 1.4): the relationship update and the regularized
steps against numpy, the two backends against each other, stacked runs, accounting."""

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import algorithms, data, models
from tff_silo.backends.vectorized import programs
from tff_silo.algorithms import mocha
from tff_silo.privacy import PrivacyProtocol
from tff_silo.simulation import Run, run_simulation, run_simulations

MODEL = models.linear_regression(3)
SILOS = data.heterogeneous_linear_silos(num_silos=4, num_examples=40, dim=3, tau=1.0,
                                        seed=0)
ASSUMED = dict(target_epsilon=5.0, target_delta=1e-3,
               protocol=PrivacyProtocol(assumed_silo_size=24))
SETTINGS = {
    "poisson_assumed_size": (dict(l2_norm_clip=0.5), ASSUMED),
    "replace_one": (dict(l2_norm_clip=0.5, sampling="without_replacement"),
                    dict(target_epsilon=5.0, target_delta=1e-3,
                         protocol=PrivacyProtocol("replace_one"))),
    "no_dp": ({}, {}),
}


def _mocha(silos=SILOS, **options):
  options = dict(dict(client_learning_rate=0.1, batch_size=8, lam=0.5), **options)
  return algorithms.mocha_algorithm(MODEL, silos.feature_shape,
                                    num_silos=silos.num_silos, **options)


def _numpy_relationship(w):
  values, vectors = np.linalg.eigh(w.astype(np.float64) @ w.T.astype(np.float64))
  root = np.sqrt(np.maximum(values, 1e-8))
  return (vectors * root) @ vectors.T / root.sum()


def test_relationship_is_the_normalized_square_root_of_the_gram():
  """Omega = (W W^T)^(1/2) / tr: symmetric, trace 1, squared it is W W^T over the
  trace squared; a run padded to a larger one's K keeps its own Omega."""
  rng = np.random.default_rng(0)
  layers = [rng.normal(size=(5, 3, 2)).astype(np.float32),
            rng.normal(size=(5,)).astype(np.float32)]
  w = np.concatenate([layers[0].reshape(5, -1), layers[1][:, None]], axis=1)
  omega = mocha.relationship([l[None] for l in layers], [5]).numpy()[0]
  np.testing.assert_allclose(omega, _numpy_relationship(w), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(omega, omega.T, atol=1e-7)
  assert np.trace(omega) == pytest.approx(1.0, rel=1e-6)
  gram = w.astype(np.float64) @ w.T   # full rank: no eigenvalue floored
  trace_root = np.sqrt(np.linalg.eigvalsh(gram)).sum()
  np.testing.assert_allclose(omega @ omega, gram / trace_root ** 2, rtol=1e-4,
                             atol=1e-6)
  # Runs of 5 and 3 silos stacked: the second padded with zero rows.
  padded = [np.stack([l, np.concatenate([l[:3], np.zeros_like(l[3:])])]) for l in layers]
  stacked = mocha.relationship(padded, [5, 3]).numpy()
  np.testing.assert_allclose(stacked[0], omega, rtol=1e-6, atol=1e-8)
  np.testing.assert_allclose(stacked[1][:3, :3], _numpy_relationship(w[:3]),
                             rtol=1e-5, atol=1e-7)
  assert not stacked[1][3:].any() and not stacked[1][:, 3:].any()



def test_relationship_of_fewer_parameters_than_silos():
  """d < K: Omega through W's QR is the K x K eigh's, with W W^T's K - d
  zero eigenvalues and a tiny one (below the floor) floored; padded runs as
  before."""
  rng = np.random.default_rng(1)
  w = rng.normal(size=(12, 4)).astype(np.float32)
  w[:, 3] = 1e-6 * w[:, 0] + 1e-9   # W^T W's smallest eigenvalue ~1e-16
  omega = mocha.relationship([w[None]], [12]).numpy()[0]
  np.testing.assert_allclose(omega, _numpy_relationship(w), rtol=1e-5, atol=1e-7)
  padded = np.stack([w, np.concatenate([w[:7], np.zeros_like(w[7:])])])
  stacked = mocha.relationship([padded], [12, 7]).numpy()
  np.testing.assert_allclose(stacked[0], omega, rtol=1e-6, atol=1e-8)
  np.testing.assert_allclose(stacked[1][:7, :7], _numpy_relationship(w[:7]),
                             rtol=1e-5, atol=1e-7)
  assert not stacked[1][7:].any() and not stacked[1][:, 7:].any()
  diverged = np.stack([w, np.full_like(w, np.nan)])
  out = mocha.relationship([diverged], [12, 12]).numpy()
  np.testing.assert_allclose(out[0], omega, rtol=1e-6, atol=1e-8)
  assert np.isnan(out[1]).all()


@pytest.mark.parametrize("silos, parameters", [(12, 4), (4, 12), (6, 6)])
def test_relationship_is_the_same_compiled_or_with_unknown_shapes(silos, parameters):
  """Known shapes go through QR (either orientation), unknown ones through the SVD
  of W itself; XLA's SVD is its own: all within float32 of float64's eigh, singular
  values from 1e-6 (floored) to 30 included."""
  rng = np.random.default_rng(silos)
  u, _ = np.linalg.qr(rng.normal(size=(silos, silos)))
  v, _ = np.linalg.qr(rng.normal(size=(parameters, parameters)))
  m = min(silos, parameters)
  w = ((u[:, :m] * np.geomspace(30, 1e-6, m)) @ v[:, :m].T).astype(np.float32)
  want = _numpy_relationship(w)
  unknown = tf.function(lambda w: mocha.relationship([w], [silos]),
                        input_signature=[tf.TensorSpec([None, None, None])])
  compiled = tf.function(lambda w: mocha.relationship([w], [silos]), jit_compile=True)
  for got in (mocha.relationship([w[None]], [silos]), unknown(w[None]), compiled(w[None])):
    np.testing.assert_allclose(got.numpy()[0], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", ["tff", "vectorized"])
@pytest.mark.tff
def test_every_step_follows_the_objectives_gradient(backend):
  """Full batches (B >= n), two local epochs a round: each step is w_k -= lr (grad
  f_k(w_k) + lam sum_j Omega_kj w_j), silo k's own row current and the others'
  at the round's start; Omega starts at I / K and is set from W after each round."""
  lr, lam, rounds = 0.1, 0.5, 3
  result = run_simulation(
      _mocha(batch_size=64, local_epochs=2, client_learning_rate=lr, lam=lam), SILOS,
      rounds=rounds, seed=1, backend=backend)
  x = [np.concatenate([xk, np.ones((len(xk), 1), np.float32)], 1)
       for xk in SILOS.x_train]
  num_silos = SILOS.num_silos
  w = np.zeros((num_silos, 4))
  omega = np.eye(num_silos) / num_silos
  for _ in range(rounds):
    start = w.copy()
    for _ in range(2):
      for k in range(num_silos):
        loss_grad = x[k].T @ (x[k] @ w[k] - SILOS.y_train[k]) / len(x[k])
        others = omega[k] @ start - omega[k, k] * start[k]
        w[k] = w[k] - lr * (loss_grad + lam * (omega[k, k] * w[k] + others))
    omega = _numpy_relationship(w)
  for k in range(num_silos):
    np.testing.assert_allclose(np.append(*result.silo_weights[k]), w[k], rtol=1e-4,
                               atol=1e-5)
  assert result.server_weights == ()


def _assert_same(reference, vectorized):
  assert reference.rounds == vectorized.rounds
  for ref, vec in zip(reference.silo_weights, vectorized.silo_weights):
    for a, b in zip(ref, vec):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(vectorized.silo_test_metric, reference.silo_test_metric,
                             rtol=1e-5, atol=1e-6)
  if reference.privacy is not None:
    np.testing.assert_array_equal(vectorized.privacy.epsilon_spent,
                                  reference.privacy.epsilon_spent)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.tff
def test_vectorized_mocha_computes_what_the_tff_process_computes(setting):
  options, run = SETTINGS[setting]
  definition = _mocha(**options)
  _assert_same(*(run_simulation(definition, SILOS, rounds=3, seed=1, backend=backend,
                                **run) for backend in ("tff", "vectorized")))


def test_stacked_mocha_runs_compute_what_each_computes_alone():
  """Runs of 4 and 3 silos (each its own Omega, the smaller padded), another
  epsilon, lambda and learning rate stack into one program; each run's numbers are
  its own."""
  other = data.heterogeneous_linear_silos(num_silos=3, num_examples=20, dim=3, seed=5)
  options, run = SETTINGS["poisson_assumed_size"]
  runs = [Run(_mocha(**options), SILOS, seed=1, **run),
          Run(_mocha(other, lam=2.0, **options), other, seed=2, **run),
          Run(_mocha(client_learning_rate=0.03, **options), SILOS, seed=3,
              **dict(run, target_epsilon=2.0))]
  stacked = run_simulations(runs, rounds=3, eval_every=2, backend="vectorized")
  assert [r.runs_stacked for r in stacked] == [3, 3, 3]
  for spec, result in zip(runs, stacked):
    programs.release_programs()   # each alone traced from its own definition
    alone, = run_simulations([spec], rounds=3, eval_every=2, backend="vectorized")
    assert alone.runs_stacked == 1
    _assert_same(alone, result)
    np.testing.assert_allclose(np.array(result.history), np.array(alone.history),
                               rtol=1e-5)


def test_a_diverged_mocha_run_ends_in_nan_and_leaves_its_stack_alone():
  """A learning rate that blows W up: that run's metric is NaN (a diverged trial the
  grid never selects), not an SVD error for every run stacked with it; the other
  run's numbers are its own."""
  sane = Run(_mocha(), SILOS, seed=1)
  runs = [sane, Run(_mocha(client_learning_rate=1e6), SILOS, seed=2)]
  stacked = run_simulations(runs, rounds=4, backend="vectorized")
  assert [r.runs_stacked for r in stacked] == [2, 2]
  assert np.isnan(stacked[1].test_metric)
  alone, = run_simulations([sane], rounds=4, backend="vectorized")
  _assert_same(alone, stacked[0])


def test_mocha_costs_what_local_training_costs():
  """One DP-SGD pass a round, as MR-MTL: the same noise and epsilon."""
  options, run = SETTINGS["poisson_assumed_size"]
  local = algorithms.local_algorithm(MODEL, SILOS.feature_shape, client_learning_rate=0.1,
                                     batch_size=8, **options)
  results = [run_simulation(d, SILOS, rounds=3, seed=1, backend="vectorized", **run)
             for d in (_mocha(**options), local)]
  np.testing.assert_array_equal(results[0].privacy.noise_multipliers,
                                results[1].privacy.noise_multipliers)
  np.testing.assert_array_equal(results[0].privacy.epsilon_spent,
                                results[1].privacy.epsilon_spent)


@pytest.mark.parametrize("backend", ["tff", "vectorized"])
def test_mocha_for_other_silos_is_a_one_line_error(backend):
  definition = _mocha(data.heterogeneous_linear_silos(num_silos=3, num_examples=20,
                                                      dim=3, seed=5))
  with pytest.raises(ValueError, match=r"num_silos=3 .* the run has 4 silos"):
    run_simulation(definition, SILOS, rounds=1, backend=backend)


@pytest.mark.parametrize("num_silos", [0, 2.5, True, -1])
def test_mocha_needs_a_positive_number_of_silos(num_silos):
  with pytest.raises(ValueError, match="num_silos must be a positive integer"):
    algorithms.mocha_algorithm(MODEL, (3,), num_silos=num_silos,
                               client_learning_rate=0.1, batch_size=8)
