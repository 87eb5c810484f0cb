"""`tff_silo.aggregators`: the built-in factories run in a process, the DP ones add
the noise and spend the silo-level epsilon they claim, and bad names fail in one
line."""

import math

import numpy as np
import pytest
from scipy import optimize, stats
import tensorflow_federated as tff

from tff_silo import aggregators, algorithms, data, models
from tff_silo.privacy import integer_law, user_level_factory
from tff_silo.simulation import run_simulation

SILOS = data.heterogeneous_linear_silos(num_silos=6, num_examples=40, dim=3, tau=0.5,
                                        seed=0)


def _gaussian_delta(epsilon, mu):
  """The exact delta(epsilon) of a Gaussian mechanism of sensitivity / std = mu
  (Balle & Wang 2018, Thm. 8); T releases of multiplier z are one with
  mu = sqrt(T) / z."""
  return (stats.norm.cdf(-epsilon / mu + mu / 2)
          - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2))


@pytest.mark.parametrize("epsilon, rounds", [(0.5, 10), (2.0, 200), (8.0, 50)])
def test_the_silo_level_calibration_meets_its_target_by_the_exact_gaussian_bound(
    epsilon, rounds):
  choice = aggregators.choose("dp_fixed", num_silos=10, rounds=rounds,
                              silo_epsilon=epsilon, silo_delta=1e-5)
  z = choice.noise_multiplier
  assert 0.99 * epsilon < choice.silo_epsilon(rounds, 1e-5) <= epsilon
  # RDP is an upper bound: the exact delta at the claimed epsilon is below 1e-5
  assert _gaussian_delta(epsilon, math.sqrt(rounds) / z) <= 1e-5
  # and not wasteful: within 15% of the least noise the exact bound allows (RDP
  # costs 6-9% here)
  exact = optimize.brentq(
      lambda zz: _gaussian_delta(epsilon, math.sqrt(rounds) / zz) - 1e-5, 0.01, 1e4)
  assert exact <= z < 1.15 * exact


def test_each_samplers_tail_is_added_to_the_silo_level_delta():
  """dp_adaptive (TF's normals, which stop at 5.678 deviations: its 1e-7 clamp):
  per round a union over the aggregate's noise pairs and its count of a radius
  above 5.678 - 1/z and of the clamped mass; dp_fixed (integer noise): the table's
  gap over every coordinate released; none without DP."""
  choice = aggregators.choose("dp_adaptive", num_silos=10, rounds=50, silo_epsilon=2.0,
                              silo_delta=1e-3)
  z = choice.noise_multiplier
  radius = math.sqrt(-2 * math.log(1e-7))
  per_round = 16 * (math.exp(-(radius - 1 / z) ** 2 / 2) + 1e-7)
  assert choice.silo_delta_tail(50, 29) == pytest.approx(50 * per_round, rel=1e-12)
  fixed = aggregators.choose("dp_fixed", num_silos=10, rounds=50, silo_epsilon=2.0,
                             silo_delta=1e-3)
  assert fixed.silo_delta_tail(50, 29) == integer_law.release_tail(50 * 29)
  assert aggregators.choose("mean", num_silos=10, rounds=50).silo_delta_tail(50, 29) == 0


@pytest.mark.tff
def test_dp_fixed_adds_the_noise_it_is_accounted_for():
  """The mean of 6 zero updates: integer noise of std z_g clip / 6 in every
  coordinate, z_g >= z the grid multiplier of z over 4,000 coordinates; a clipped
  update's mean is the clipped mean (up to the noise and the grid)."""
  choice = aggregators.choose("dp_fixed", num_silos=6, rounds=4, silo_epsilon=1.0,
                              silo_delta=1e-3, clip=0.5)
  value_type = tff.TensorType(np.float32, [4000])
  process = choice.factory.create(value_type)
  output = process.next(process.initialize(), [np.zeros(4000, np.float32)] * 6)
  noise = np.asarray(output.result)
  z_g = integer_law.grid_noise_multiplier(choice.noise_multiplier, 4000)
  assert choice.noise_multiplier <= z_g < 1.02 * choice.noise_multiplier   # 1.1%
  expected = z_g * 0.5 / 6
  # the sample std of 4,000 normals is within 5% of sigma with probability ~0.998
  assert abs(noise.std() / expected - 1) < 0.05
  assert abs(noise.mean()) < 4 * expected / math.sqrt(4000)
  # the same round's noise (seeded) on clipped updates: their mean, within the grid
  seeded = user_level_factory.DPMeanFactory(noise_multiplier=2.0, clients_per_round=3,
                                            clip=1.0, seed=5)
  process = seeded.create(tff.TensorType(np.float32, [3]))
  updates = [np.array([3.0, 0.0, 4.0], np.float32), np.array([0.1, 0.2, 0.0], np.float32),
             np.zeros(3, np.float32)]
  released = process.next(process.initialize(), updates).result
  alone = process.next(process.initialize(), [np.zeros(3, np.float32)] * 3).result
  grid = integer_law.grid_noise_multiplier(2.0, 3) / integer_law.SIGMA
  np.testing.assert_allclose(np.asarray(released) - np.asarray(alone),
                             (np.array([0.6, 0.0, 0.8]) + [0.1, 0.2, 0.0]) / 3,
                             atol=grid)


@pytest.mark.parametrize("name", aggregators.BUILTINS)
@pytest.mark.tff
def test_every_builtin_runs_mrmtl_on_tffs_runtime(name):
  dp = (dict(silo_epsilon=4.0, silo_delta=1e-3) if name in aggregators.DP_BUILTINS
        else {})
  choice = aggregators.choose(name, num_silos=6, rounds=3, **dp)
  definition = algorithms.mrmtl_algorithm(
      models.linear_regression(3), (3,), client_learning_rate=0.1, batch_size=8,
      lam=1.0, aggregator=choice.factory)
  result = run_simulation(definition, SILOS, rounds=3, backend="tff")
  assert np.isfinite(result.test_metric)
  assert choice.silo_level_dp == (name in aggregators.DP_BUILTINS)
  # what TFF's factories measure comes back with the result
  expected = {"robust": {"zeroed_count", "zeroing_norm", "zeroing/clipping_norm",
                         "zeroing/clipped_count"},
              "dp_fixed": {"sigma"},
              "dp_adaptive": {"dp_query_metrics/clip"}}.get(name, set())
  assert set(result.aggregator_measurements) == expected


def test_a_users_factory_by_module_path():
  choice = aggregators.choose(
      "tensorflow_federated.python.aggregators.mean:UnweightedMeanFactory",
      num_silos=6, rounds=3)
  assert isinstance(choice.factory, tff.aggregators.UnweightedMeanFactory)
  assert choice.silo_epsilon(3, 1e-3) == math.inf


@pytest.mark.parametrize("spec, kwargs, message", [
    ("median", {}, "aggregator must be one of mean, unweighted_mean, robust"),
    ("", {}, "aggregator must be one of"),
    ("dp_fixed", {}, "aggregator=dp_fixed: give its silo_epsilon"),
    ("robust", dict(silo_epsilon=1.0), "silo_epsilon applies to dp_fixed, dp_adaptive"),
    ("dp_fixed", dict(silo_epsilon=1.0), "needs silo_delta in (0, 1)"),
    ("no_such_module_x:f", {}, "cannot import no_such_module_x"),
    ("math:no_such", {}, "math has no 'no_such'"),
    ("math:pi", {}, "math:pi is neither a tff.aggregators factory nor callable"),
    ("tensorflow:constant", {}, "tensorflow:constant: calling it with no arguments"),
])
def test_bad_aggregators_fail_in_one_line(spec, kwargs, message):
  with pytest.raises((ValueError, TypeError)) as raised:
    aggregators.choose(spec, num_silos=6, rounds=3, **kwargs)
  assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.tff
def test_the_trimmed_mean_is_scipys_per_coordinate():
  from tff_silo.trimmed_mean import TrimmedMeanFactory
  value_type = tff.to_type((tff.TensorType(np.float32, [3]),
                            tff.TensorType(np.float32, [2, 2])))
  process = TrimmedMeanFactory(0.2).create(value_type)
  rng = np.random.default_rng(0)
  values = [(rng.normal(size=3).astype(np.float32),
             rng.normal(size=(2, 2)).astype(np.float32)) for _ in range(7)]
  values[3] = (np.full(3, 1e6, np.float32), np.full((2, 2), -1e6, np.float32))
  result = process.next(process.initialize(), values).result
  for leaf, got in enumerate(result):
    expected = stats.trim_mean(np.stack([v[leaf] for v in values]), 0.2, axis=0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert np.all(np.abs(got) < 3)   # the outlier silo is trimmed away
  with pytest.raises(ValueError, match=r"trim_fraction must be in \[0, 0.5\)"):
    TrimmedMeanFactory(0.5)


@pytest.mark.tff
def test_the_trimmed_mean_runs_by_module_path():
  choice = aggregators.choose("tff_silo.trimmed_mean:TrimmedMeanFactory", num_silos=6,
                              rounds=3)
  definition = algorithms.mrmtl_algorithm(
      models.linear_regression(3), (3,), client_learning_rate=0.1, batch_size=8,
      lam=1.0, aggregator=choice.factory)
  assert np.isfinite(run_simulation(definition, SILOS, rounds=3, backend="tff").test_metric)
  assert not choice.weighted
