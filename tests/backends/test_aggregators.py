"""`tff_silo.aggregators`: the built-in factories run in a process, the DP ones add
the noise and spend the silo-level epsilon they claim, and bad names fail in one
line."""

import math

import numpy as np
import pytest
from scipy import optimize, stats
import tensorflow_federated as tff

from tff_silo import aggregators, algorithms, data, models
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


def test_tfs_bounded_normals_add_their_tail_to_the_silo_level_delta():
  """TF's normals stop at 5.678 deviations (its 1e-7 clamp): per round a union over
  the aggregate's noise pairs (dp_adaptive: one more, its count) of a radius above
  5.678 - 1/z and of the clamped mass; none without DP."""
  for name, extra in (("dp_fixed", 0), ("dp_adaptive", 1)):
    choice = aggregators.choose(name, num_silos=10, rounds=50, silo_epsilon=2.0,
                                silo_delta=1e-3)
    z = choice.noise_multiplier
    radius = math.sqrt(-2 * math.log(1e-7))
    per_round = (15 + extra) * (math.exp(-(radius - 1 / z) ** 2 / 2) + 1e-7)
    assert choice.silo_delta_tail(50, 29) == pytest.approx(50 * per_round, rel=1e-12)
  assert aggregators.choose("mean", num_silos=10, rounds=50).silo_delta_tail(50, 29) == 0


def test_dp_fixed_adds_the_noise_it_is_accounted_for():
  """The mean of 6 zero updates: N(0, (z clip / 6)^2) in every coordinate."""
  choice = aggregators.choose("dp_fixed", num_silos=6, rounds=4, silo_epsilon=1.0,
                              silo_delta=1e-3, clip=0.5)
  value_type = tff.TensorType(np.float32, [4000])
  process = choice.factory.create(value_type)
  output = process.next(process.initialize(), [np.zeros(4000, np.float32)] * 6)
  noise = np.asarray(output.result)
  expected = choice.noise_multiplier * 0.5 / 6
  # the sample std of 4,000 normals is within 5% of sigma with probability ~0.998
  assert abs(noise.std() / expected - 1) < 0.05
  assert abs(noise.mean()) < 4 * expected / math.sqrt(4000)


@pytest.mark.parametrize("name", aggregators.BUILTINS)
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


def test_the_trimmed_mean_runs_by_module_path():
  choice = aggregators.choose("tff_silo.trimmed_mean:TrimmedMeanFactory", num_silos=6,
                              rounds=3)
  definition = algorithms.mrmtl_algorithm(
      models.linear_regression(3), (3,), client_learning_rate=0.1, batch_size=8,
      lam=1.0, aggregator=choice.factory)
  assert np.isfinite(run_simulation(definition, SILOS, rounds=3, backend="tff").test_metric)
  assert not choice.weighted
