"""User-level DP (UDP-Alg, Nemala et al. 2023): weights, eq. 4's sigma, the aggregator
factory (exact noise-free path, noise statistics) and the accounting."""

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_silo.privacy import accounting, gaussian_tail, integer_law, user_level
from tff_silo.privacy.user_level import UserDPSettings, noise_stddev, user_weights
from tff_silo.privacy.user_level_factory import UserLevelDPMeanFactory


def test_user_weights_cap_at_one():
  np.testing.assert_allclose(user_weights([5, 10, 40], 20.0), [0.25, 0.5, 1.0])
  np.testing.assert_allclose(user_weights([5, 10]), [1.0, 1.0])


@pytest.mark.parametrize("sizes, cap, message", [
    ([5, 0, 3], 10.0, "user 1 has no training examples"),
    ([5], 0.0, "weight_cap (w_hat) must be a positive number"),
    ([5], -2.0, "weight_cap (w_hat) must be a positive number"),
])
def test_user_weights_reject_bad_input(sizes, cap, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    user_weights(sizes, cap)


def test_sigma_is_z_max_weight_clip_over_q_total_weight():
  factory = UserLevelDPMeanFactory(l2_norm_clip=0.1, noise_multiplier=5.0,
                                   sampling_rate=0.2, total_weight=12.5, max_weight=0.5)
  assert factory.sigma == pytest.approx(5.0 * 0.5 * 0.1 / (0.2 * 12.5), rel=1e-12)
  assert noise_stddev(10.0, 0.2, 0.05, 40.0) == pytest.approx(10.0 * 0.2 / (0.05 * 40.0))


@pytest.mark.parametrize("kwargs, message", [
    (dict(sampling_rate=0.0), "sampling_rate (q) must be in (0, 1]"),
    (dict(sampling_rate=1.5), "sampling_rate (q) must be in (0, 1]"),
    (dict(sampling_rate=0.1, l2_norm_clip=0.0), "l2_norm_clip (S) must be positive"),
    (dict(sampling_rate=0.1, l2_norm_clip=-1.0), "l2_norm_clip (S) must be positive"),
    (dict(sampling_rate=0.1, l2_norm_clip=0.1, noise_multiplier=-1.0),
     "noise_multiplier (z) must be >= 0"),
    (dict(sampling_rate=0.1, noise_multiplier=5.0), "needs l2_norm_clip"),
    (dict(sampling_rate=0.1, weight_cap=0.0), "weight_cap (w_hat) must be a positive"),
])
def test_settings_reject_bad_input(kwargs, message):
  with pytest.raises(ValueError) as error:
    UserDPSettings(**kwargs)
  assert message in str(error.value)


def test_epsilon_equals_an_independent_dp_accounting_computation():
  q, z, rounds, delta = 0.1, 5.0, 300, 1e-5
  settings = UserDPSettings(sampling_rate=q, l2_norm_clip=0.1, noise_multiplier=z)
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
  independent = dp_accounting.rdp.RdpAccountant(list(accounting.RDP_ORDERS))
  independent.compose(event)
  # delta less the tails: 10 integer-noise coordinates a round (the table's gap) and
  # the Gaussian event's own sampler tail, charged too (an upper bound)
  tail = rounds * (integer_law.release_tail(10)
                   + q * gaussian_tail.release_tail(1.0 / z))
  assert settings.epsilon(rounds, delta, 10) == pytest.approx(
      independent.get_epsilon(delta - tail), rel=1e-12)
  # dp_accounting's own default orders land within a few percent.
  default = dp_accounting.rdp.RdpAccountant()
  default.compose(event)
  assert settings.epsilon(rounds, delta, 10) == pytest.approx(
      default.get_epsilon(delta), rel=0.05)
  assert math.isinf(UserDPSettings(sampling_rate=q).epsilon(rounds, delta, 10))


def test_calibrated_noise_multiplier_meets_a_user_level_target():
  z = accounting.calibrate_noise_multiplier(3.0, 1e-5, 0.1, 300)
  spent = UserDPSettings(sampling_rate=0.1, l2_norm_clip=0.1,
                         noise_multiplier=z).epsilon(300, 1e-5, 10)
  assert spent <= 3.0
  assert spent == pytest.approx(3.0, rel=1e-3)


VALUE_TYPE = tff.StructWithPythonType(
    [tff.TensorType(np.float32, [3]), tff.TensorType(np.float32, [2, 2])], tuple)


def _aggregate(factory, values, weights, value_type=VALUE_TYPE):
  process = factory.create(value_type, tff.TensorType(np.float32))
  output = process.next(process.initialize(), values, weights)
  return output.result, output.measurements["sigma"], output.state


@pytest.mark.tff
def test_noise_free_aggregate_is_the_clipped_weighted_sum_over_q_total_weight():
  values = [(np.array([3.0, 0.0, 4.0], np.float32), np.zeros([2, 2], np.float32)),
            (np.array([0.1, 0.0, 0.0], np.float32), np.full([2, 2], 0.05, np.float32))]
  factory = UserLevelDPMeanFactory(l2_norm_clip=1.0, noise_multiplier=0.0,
                                   sampling_rate=0.5, total_weight=4.0)
  result, sigma, state = _aggregate(factory, values, [1.0, 0.5])
  # user 0 has norm 5 -> scaled by 1/5; user 1 has norm sqrt(0.02) < 1 -> unchanged.
  expected_0 = (1.0 * np.array([0.6, 0.0, 0.8]) + 0.5 * np.array([0.1, 0, 0])) / 2.0
  expected_1 = 0.5 * np.full([2, 2], 0.05) / 2.0
  np.testing.assert_allclose(result[0], expected_0, rtol=1e-6)
  np.testing.assert_allclose(result[1], expected_1, rtol=1e-6)
  assert sigma == 0.0 and state == 1
  unclipped = UserLevelDPMeanFactory(l2_norm_clip=None, noise_multiplier=0.0,
                                     sampling_rate=0.5, total_weight=4.0)
  result, _, _ = _aggregate(unclipped, values, [1.0, 0.5])
  np.testing.assert_allclose(result[0], (values[0][0] + 0.5 * values[1][0]) / 2.0,
                             rtol=1e-6)


@pytest.mark.tff
def test_noise_has_the_calibrated_standard_deviation_even_without_users():
  dim = 20000
  value_type = tff.TensorType(np.float32, [dim])
  factory = UserLevelDPMeanFactory(l2_norm_clip=0.2, noise_multiplier=5.0,
                                   sampling_rate=0.1, total_weight=20.0, seed=3)
  result, sigma, _ = _aggregate(factory, [], [], value_type)
  assert sigma == pytest.approx(factory.sigma)
  # No users: f = 0 and the result is the integer noise alone, at the grid
  # multiplier z_g >= z that pays for the contributions' rounding (2.2% above z
  # over 20,000 coordinates). With 20000 draws the sample std is within 3% of
  # z_g S / (q W) with overwhelming probability (its sd is ~0.5%), and the mean
  # within 0.03 sigma (its sd is sigma / 141 = 0.007 sigma).
  z_g = integer_law.grid_noise_multiplier(5.0, dim)
  assert 5.0 < z_g < 5.0 * 1.025
  assert np.std(result) == pytest.approx(factory.sigma * z_g / 5.0, rel=0.03)
  assert abs(np.mean(result)) < 0.03 * factory.sigma
  again, _, _ = _aggregate(factory, [], [], value_type)
  np.testing.assert_array_equal(result, again)   # seeded: reproducible


def test_factory_rejects_non_float_values():
  factory = UserLevelDPMeanFactory(l2_norm_clip=1.0, noise_multiplier=1.0,
                                   sampling_rate=0.5, total_weight=2.0)
  with pytest.raises(TypeError, match="float"):
    factory.create(tff.TensorType(np.int32, [2]), tff.TensorType(np.float32))


def test_the_total_weight_is_public_or_the_number_of_users():
  """With a weight cap, W = sum w_u needs the users' sizes public; otherwise W = N
  (every w_u <= 1), whatever the sizes."""
  sizes = [5, 40, 12, 100]
  capped = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=1.0,
                          weight_cap=20.0)
  assert capped.total_weight(sizes) == 4.0
  assert capped.total_weight([1, 1, 1, 1]) == 4.0   # no size moves it
  public = dataclasses.replace(capped, public_sizes=True)
  assert public.total_weight(sizes) == pytest.approx(0.25 + 1 + 0.6 + 1)
  assert UserDPSettings(sampling_rate=0.5).total_weight(sizes) == 4.0


def test_w_is_public_only_from_public_sizes_or_a_declared_user_count():
  """W = N, the users present, moves when a user is added or removed: only public
  sizes or a declared user count make it public, and the settings say whether the
  printed epsilon holds (`covers`)."""
  sizes = [5, 40, 12, 100]
  plain = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=1.0)
  assert not plain.total_weight_public and "no guarantee" in plain.covers
  declared = dataclasses.replace(plain, public_user_count=10)
  assert declared.total_weight(sizes) == 10.0   # whoever is present
  assert declared.total_weight(sizes[:3]) == 10.0
  assert declared.total_weight_public and declared.covers == user_level.COVERS
  capped = dataclasses.replace(plain, weight_cap=20.0, public_sizes=True)
  assert capped.total_weight_public and capped.covers == user_level.COVERS
  for bad in (0, 2.5, -3):
    with pytest.raises(ValueError, match="public_user_count"):
      dataclasses.replace(plain, public_user_count=bad)
