"""The one round loop (`tff_silo.driver`): stops, evaluation cadence, participation
policies, and the result fields every driver shares."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import driver, keys


def _loop(rounds, **hooks):
  calls = []
  log = driver.run_rounds(rounds, lambda r: calls.append(("step", r)),
                          evaluate=lambda r: calls.append(("evaluate", r)),
                          progress=lambda r, t, s: calls.append(("progress", r)),
                          **hooks)
  return log, calls


def test_every_round_runs_evaluates_on_its_cadence_and_reports_progress():
  log, calls = _loop(5, eval_every=2)
  assert (log.rounds_run, log.stopped_because, len(log.round_seconds)) == (5, "rounds", 5)
  assert [r for kind, r in calls if kind == "step"] == [1, 2, 3, 4, 5]
  assert [r for kind, r in calls if kind == "evaluate"] == [2, 4]   # the end: the driver's
  assert [r for kind, r in calls if kind == "progress"] == [1, 2, 3, 4, 5]


def test_a_refused_round_is_not_run_and_a_reason_stops_after_its_round():
  log, calls = _loop(5, before=lambda r: r < 3)
  assert (log.rounds_run, log.stopped_because) == (2, "budget")
  assert ("step", 3) not in calls
  log, calls = _loop(5, after=lambda r: "early_stopping" if r == 2 else None)
  assert (log.rounds_run, log.stopped_because) == (2, "early_stopping")
  assert calls[-1] == ("progress", 2)


@pytest.mark.parametrize("rounds, eval_every", [(0, 0), (2.5, 0), (3, -1)])
def test_bad_run_lengths_are_refused(rounds, eval_every):
  with pytest.raises(ValueError, match="rounds must be a positive integer|eval_every"):
    driver.run_rounds(rounds, lambda r: None, eval_every=eval_every)


def test_uniform_users_decline_past_their_leakage_cap():
  users = driver.UniformUsers(10, 4, seed=0, per_participation=0.5, leakage_cap=1.0)
  rounds = 0
  while not users.exhausted():
    sampled = users.sample(rounds + 1)
    assert len(set(sampled)) == len(sampled) <= 4
    users.charge(sampled)
    rounds += 1
  assert np.all(users.participations == 2) and users.leakage().max() <= 1.0 + 1e-9
  assert users.declined > 0 and rounds > 5
  free = driver.UniformUsers(10, 4, seed=0)
  assert len(free.sample(1)) == 4 and not free.exhausted()


def test_poisson_users_take_part_at_their_rate_and_replay_from_the_seed():
  users = driver.PoissonUsers(200, 0.3, seed=5)
  counts = [len(users.sample(r)) for r in range(1, 51)]
  assert abs(np.mean(counts) / 200 - 0.3) < 0.02
  assert np.array_equal(users.sample(7), driver.PoissonUsers(200, 0.3, seed=5).sample(7))
  assert not np.array_equal(users.sample(7), users.sample(8))
  # Exactly the users whose 32-bit words are below floor(0.3 2^32): P = that / 2^32.
  key = keys.derive(keys.root_key(5), keys.USER_SAMPLING, 6)
  words = tf.random.stateless_uniform([200], seed=key, minval=None, maxval=None,
                                      dtype=tf.uint32).numpy()
  np.testing.assert_array_equal(users.sample(7),
                                np.flatnonzero(words < int(0.3 * 2 ** 32)))


def test_every_driver_returns_the_common_fields():
  import hypernet
  from tff_silo import algorithms, data, models
  from tff_silo.dprivate_simulation import run_dprivate_clustering
  from tff_silo.privacy import UserDPSettings
  from tff_silo.simulation import run_simulation
  common = [f.name for f in dataclasses.fields(driver.RunResult)]
  silos = data.heterogeneous_linear_silos(num_silos=4, num_examples=20, dim=3, seed=0)
  model = models.linear_regression(3)
  silo = run_simulation(algorithms.mrmtl_algorithm(
      model, (3,), client_learning_rate=0.1, batch_size=8), silos, rounds=2,
      backend="vectorized")
  users = data.two_cluster_linear_silos(num_users=10, seed=0)
  dprivate = run_dprivate_clustering(algorithms.dprivate_clustering_algorithm(
      models.linear_regression(2, bias=False), users.feature_shape,
      client_learning_rate=0.1, batch_size=10, num_clusters=2, nu=None), users,
      rounds=2,
      clients_per_round=5, backend="vectorized")
  images = data.label_skewed_silos("digits", *data.digits_images(), num_classes=10,
                                   num_users=4, classes_per_user=2, seed=0)
  network = hypernet.Hypernetwork(models.small_cnn(images.feature_shape, 10,
                                                   channels=(2, 4), hidden=8),
                                  images.num_silos, 2, hidden_width=4)
  hn = hypernet.run_hypernet(hypernet.hypernet_algorithm(
      network, images.feature_shape, images.train_sizes,
      UserDPSettings(sampling_rate=1.0), client_learning_rate=0.05, batch_size=8,
      local_steps=1, hypernet_learning_rate=0.1, embedding_learning_rate=0.1),
      images, rounds=2, backend="vectorized")
  for result, silos_ in ((silo, silos), (dprivate, users), (hn, images)):
    assert isinstance(result, driver.RunResult)
    assert [f.name for f in dataclasses.fields(result)][:len(common)] == common
    assert result.rounds == 2 and len(result.round_seconds) == 2
    assert len(result.silo_weights) == len(result.silo_test_metric) == silos_.num_silos
    assert result.history[-1][1:] == (result.train_metric, result.test_metric)
