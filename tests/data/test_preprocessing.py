"""Standardization modes: public ranges, the DP estimate (mechanism and accounting)
and the papers' per-silo statistics."""

import dp_accounting
import numpy as np
import pytest

from tff_silo import algorithms, data, keys, models
from tff_silo import batched_random as br
from tff_silo.backends.tff import process_for
from tff_silo.data import preprocessing
from tff_silo.privacy import PrivacyProtocol, accounting, integer_gaussian, integer_law
from tff_silo.simulation import run_simulation


def test_dp_sums_are_the_integer_gaussian_mechanism():
  """dp_sums' noise is sqrt(3) times the integer mechanism's: grid z_g / 2^14 times
  the integer draws of the release's key (z_g the grid multiplier of z = 1.5 over
  7 coordinates), up to the contributions' rounding (50 rows, half a grid each);
  over 4,000 release keys those draws have std z_g sqrt(3) >= z sqrt(3)."""
  x = np.random.default_rng(0).normal(size=(50, 3))
  exact = preprocessing.dp_sums(x, 2.0, 0.0, keys.fold_in([0, 0], 0))
  z_g = integer_law.grid_noise_multiplier(1.5, 7)
  grid = np.float32(z_g) / np.float32(integer_law.SIGMA)
  for i in range(4):
    key = keys.fold_in([0, 0], i)
    draws = integer_gaussian.noise(np.asarray(key)[None], 7).numpy()[0]
    noise = np.sqrt(3.0) * grid * draws
    np.testing.assert_allclose(preprocessing.dp_sums(x, 2.0, 1.5, key) - exact, noise,
                               rtol=1e-5, atol=50 * grid * np.sqrt(3.0) / 2 + 1e-4)
  release_keys = br.fold_in(np.zeros([4000, 2], np.int32), np.arange(4000))
  np.testing.assert_array_equal(release_keys[3], keys.fold_in([0, 0], 3))
  draws = np.sqrt(3.0) * grid * integer_gaussian.noise(release_keys, 7).numpy()
  # 4,000 draws per coordinate: the sample std has relative s.e. 1.1%; 5% is 4.4 s.e.
  np.testing.assert_allclose(draws.std(0), 1.5 * np.sqrt(3.0), rtol=0.05)
  assert z_g >= 1.5 and np.all(np.abs(draws.mean(0)) < 4 * 1.5 * np.sqrt(3) / 63)
  assert exact[-1] == 50 and np.all(exact[:3] * 2.0 <= 50 * 2.0)


def test_each_example_moves_the_sums_by_at_most_sqrt3():
  x = np.random.default_rng(1).normal(scale=10.0, size=(20, 4))
  a = preprocessing.dp_sums(x, 3.0, 0.0, [0, 0])
  b = preprocessing.dp_sums(x[:-1], 3.0, 0.0, [0, 0])
  assert np.linalg.norm(a - b) <= preprocessing.DP_SENSITIVITY + 1e-9


def test_dp_statistics_are_close_with_little_noise():
  x = np.random.default_rng(2).normal(loc=[1.0, -2.0], scale=[0.5, 2.0], size=(5000, 2))
  mean, std = preprocessing.dp_statistics(x, 50.0, 0.01, keys.fold_in([0, 0], 1))
  np.testing.assert_allclose(mean, [1.0, -2.0], atol=0.1)
  np.testing.assert_allclose(std, [0.5, 2.0], rtol=0.1)


def test_dp_noise_multiplier_spends_the_share():
  z = preprocessing.dp_noise_multiplier(6.0, 1e-3, 0.05)
  accountant = dp_accounting.rdp.RdpAccountant(list(accounting.RDP_ORDERS))
  accountant.compose(preprocessing.dp_event(z, 4))
  assert 0.99 * 0.3 < accountant.get_epsilon(1e-3) <= 0.3
  gaussian, tail = preprocessing.dp_event(z, 4, "replace_one").events
  assert gaussian.noise_multiplier == pytest.approx(z / 2) and tail.coordinates == 9


def test_school_modes(shared_data):
  public = data.load_school(shared_data, standardize="public")
  assert all(0.0 <= x.min() and x.max() <= 1.0 for x in public.x_train)
  silo = data.load_school(shared_data)   # the papers' default
  assert abs(float(np.mean(silo.x_train[0][:, 5]))) < 1e-5
  raw = data.load_school(shared_data, standardize="none")
  assert raw.x_train[0][:, 3].max() > 1.0
  with pytest.raises(ValueError, match="dp: tff_silo.data.standardize_silos"):
    data.load_school(shared_data, standardize="dp")


def test_vehicle_has_no_public_ranges(shared_data):
  with pytest.raises(ValueError, match="no documented feature ranges"):
    data.load_vehicle(shared_data, standardize="public")


@pytest.mark.tff
def test_dp_standardization_is_charged_and_composed():
  silos = data.heterogeneous_linear_silos(num_silos=3, num_examples=40, dim=3, tau=1.0,
                                          seed=0)
  z = preprocessing.dp_noise_multiplier(2.0, 1e-4, 0.1)
  standardized = data.standardize_silos(silos, "dp", clip=5.0, noise_multipliers=[z] * 3,
                                        seed=0)
  assert not np.allclose(standardized.x_train[0], silos.x_train[0])
  process = process_for(
      algorithms.mrmtl_algorithm(
models.linear_regression(3), silos.feature_shape, client_learning_rate=0.1,
batch_size=8, l2_norm_clip=1.0))
  events = [preprocessing.dp_event(z, 3)] * 3
  result = run_simulation(process, standardized, rounds=2, target_epsilon=2.0,
                          target_delta=1e-4, protocol=PrivacyProtocol(assumed_silo_size=30),
                          preprocessing_events=events)
  privacy = result.privacy
  for k in range(3):
    accountant = dp_accounting.rdp.RdpAccountant(list(accounting.RDP_ORDERS))
    accountant.compose(dp_accounting.ComposedDpEvent([
        events[k], accounting.dp_sgd_event(privacy.noise_multipliers[k],
                                           privacy.sampling_rates[k],
                                           int(privacy.steps[k]))]))
    assert privacy.epsilon_spent[k] == pytest.approx(accountant.get_epsilon(1e-4),
                                                     rel=1e-9)
    assert privacy.epsilon_spent[k] <= 2.0
