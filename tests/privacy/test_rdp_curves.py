"""The vectorized RDP curves (`rdp_curves`) against dp_accounting's own functions, and
the calibration built on them against dp_accounting's accountant."""

import itertools

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from tff_silo.privacy import accounting, node_level, rdp_curves

ORDERS = np.array(accounting.RDP_ORDERS)
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def test_poisson_gaussian_matches_dp_accounting():
  pairs = list(itertools.product([1e-4, 0.01, 0.16, 0.5, 0.9, 0.999, 1.0],
                                 [0.3, 0.8, 1.5, 4.0, 20.0, 100.0]))
  pairs += [(0.0, 1.0), (0.3, 0.0)]
  q, z = map(np.array, zip(*pairs))
  want = np.array([rdp_lib._compute_rdp_poisson_subsampled_gaussian(a, b, ORDERS)
                   for a, b in pairs])
  got = rdp_curves.poisson_gaussian(q, z, ORDERS)
  # Where A_alpha ~ 1 the two sums round differently: 1e-15 absolute on log A.
  np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-13)
  assert (got[-2] == 0).all() and np.isinf(got[-1]).all()


def test_without_replacement_gaussian_matches_dp_accounting():
  pairs = [(0.01, 0.6), (0.05, 2.0), (0.3, 1.0), (0.36, 10.0), (0.9, 3.0), (1.0, 2.0)]
  q, sigma = map(np.array, zip(*pairs))
  want = np.array([rdp_lib._compute_rdp_sample_wor_gaussian(a, b, ORDERS)
                   for a, b in pairs])
  np.testing.assert_allclose(rdp_curves.without_replacement_gaussian(q, sigma, ORDERS),
                             want, rtol=1e-9)


def test_epsilons_match_dp_accounting_conversion():
  rng = np.random.default_rng(0)
  curves = np.concatenate([rng.uniform(0, 3, (20, 1)) * ORDERS / 10,
                           np.zeros((1, len(ORDERS)))])
  deltas = np.concatenate([10 ** rng.uniform(-9, -2, 20), [1e-5]])
  eps, best = rdp_curves.epsilons(ORDERS, curves, deltas)
  for curve, delta, e, b in zip(curves, deltas, eps, best):
    want, order = rdp_lib.compute_epsilon(ORDERS, curve, delta)
    assert e == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert want == 0 or ORDERS[b] == order
  assert np.isinf(rdp_curves.epsilons(ORDERS, curves[:1], [0.0])[0]).all()


def test_event_curves_compose_as_dp_accounting():
  poisson = dp_accounting.ComposedDpEvent([
      dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
          0.05, dp_accounting.GaussianDpEvent(1.1)), 300),
      accounting.selection_event(0.3, 4), dp_accounting.GaussianDpEvent(5.0)])
  node = node_level.training_event(4.0, 200, 5, 20, 30)
  replace = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      500, 40, dp_accounting.GaussianDpEvent(1.5)), 10)
  for event, relation in [(poisson, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE),
                          (node, REPLACE_ONE), (replace, REPLACE_ONE)]:
    factory = lambda: node_level.NodeLevelRdpAccountant(list(ORDERS), relation)
    accountant = factory()
    accountant.compose(event)
    np.testing.assert_allclose(rdp_curves.event_curve(event, factory), accountant._rdp,
                               rtol=1e-9)
  with pytest.raises(ValueError, match="cannot be accounted"):
    rdp_curves.event_curve(replace, lambda: node_level.NodeLevelRdpAccountant(
        list(ORDERS), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE))


SETTINGS = [  # (epsilon, q, steps, options): small to very large epsilons
    (0.3, 0.02, 2000, {}), (3.0, 0.36, 200, {}), (8.0, 0.9, 200, {}),
    (60.0, 0.5, 5, {}), (400.0, 0.3, 3, {}),
    (2.0, 0.05, 1000, dict(selection_epsilon=0.06, num_selections=20)),
    (1.0, 0.1, 100, dict(extra_events=(dp_accounting.GaussianDpEvent(20.0),))),
    (4.0, 0.32, 200, dict(neighbouring="replace_one", dataset_size=100))]


def test_many_settings_calibrate_together_as_one_at_a_time_and_dp_accounting_agrees():
  """Each multiplier meets its target under dp_accounting over all orders, 0.01% less
  noise would not, and the epsilon reported is dp_accounting's over all orders."""
  settings = [accounting.silo_setting(q, steps, 1e-5, **o) for _, q, steps, o in SETTINGS]
  targets = [eps for eps, *_ in SETTINGS]
  z, spent = accounting.calibrate_noise_multipliers(targets, settings)
  for zi, e, target, setting in zip(z, spent, targets, settings):
    exact = accounting._epsilon(float(zi), *setting)
    assert exact <= target and e == pytest.approx(exact, rel=1e-9)
    assert accounting._epsilon(float(zi) * (1 - 1e-4), *setting) > target
    assert np.float32(zi) == zi
  one = [accounting.calibrate_noise_multiplier(eps, 1e-5, q, steps, **o)
         for eps, q, steps, o in SETTINGS]
  np.testing.assert_allclose(z, one, rtol=1e-6)


def test_a_wrong_fast_curve_costs_noise_never_privacy(monkeypatch):
  """dp_accounting confirms every multiplier: with curves 20% too optimistic the
  search proposes too little noise, and the confirmation moves it up."""
  right = rdp_curves.poisson_gaussian
  monkeypatch.setattr(rdp_curves, "poisson_gaussian",
                      lambda *args: 0.8 * right(*args))
  setting = accounting.silo_setting(0.36, 200, 1e-3)
  z, spent = accounting.calibrate_noise_multipliers([3.0], [setting])
  assert accounting._epsilon(float(z[0]), *setting) <= 3.0
  assert spent[0] <= 3.0
