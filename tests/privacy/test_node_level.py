"""Node-level accounting (thesis Theorem 2.4.4): Table 2.6's reproducible epsilons,
an independent numerical computation of the RDP curve and its conversion, the
full-batch limit against dp_accounting's Gaussian mechanism, composition in the
ledger, and a calibration that never overshoots."""

import math

import dp_accounting
import numpy as np
import pytest

from tff_silo.privacy import PrivacyLedger, accounting, node_level

SMOKE = 2_609_976                        # Smoke: client01 of the example partition
SMOKE_STEPS = 2 * math.ceil(SMOKE / 512)  # two epochs of batches of 512: 10 196


@pytest.mark.parametrize("sigma, s, expected", [
    (0.5, 20, 243.5), (0.5, 21, 248.5), (5.0, 20, 7.78), (5.0, 21, 7.98)])
def test_table_2_6_epsilons_with_the_authors_exponent(sigma, s, expected):
  """PANDEMIC.md 2.10: sigma 0.5 and 5 reproduce the thesis' 245 and 7.87 with the
  code's exponent (add/remove) and order list, delta = 1/n."""
  eps = node_level.epsilon(sigma, SMOKE, s, 512, SMOKE_STEPS, 1 / SMOKE,
                           neighbouring="add_remove")
  assert eps == pytest.approx(expected, rel=5e-3)


def test_the_printed_theorem_is_four_times_the_exponent():
  """replace_one (2 rho^2 / sigma^2) at sigma equals add_remove at sigma / 2."""
  for sigma in (0.8, 5.0):
    printed = node_level.epsilon(sigma, SMOKE, 21, 512, SMOKE_STEPS, 1 / SMOKE)
    code = node_level.epsilon(sigma / 2, SMOKE, 21, 512, SMOKE_STEPS, 1 / SMOKE,
                              neighbouring="add_remove")
    assert printed == pytest.approx(code, rel=1e-9)
  assert node_level.epsilon(5.0, SMOKE, 21, 512, SMOKE_STEPS, 1 / SMOKE) == (
      pytest.approx(18.6, rel=5e-3))   # PANDEMIC.md's printed-theorem column


def _independent_epsilon(sigma, n, s, b, steps, delta, c, orders):
  """The same quantity from first principles: exact hypergeometric terms with
  math.comb, a hand-written log-sum-exp, the conversion of Canonne et al. (Prop.
  12), orders above 1.01 only."""
  best = math.inf
  for alpha in orders:
    if alpha <= 1.01:
      continue
    logs = []
    for rho in range(0, min(s, b) + 1):
      ways = math.comb(s, rho) * math.comb(n - s, b - rho)
      if ways == 0:
        continue
      log_p = math.log(ways) - math.log(math.comb(n, b))
      logs.append(log_p + alpha * (alpha - 1) * c * rho * rho / sigma ** 2)
    top = max(logs)
    gamma = (top + math.log(sum(math.exp(v - top) for v in logs))) / (alpha - 1)
    rdp = steps * gamma
    best = min(best, rdp + math.log1p(-1 / alpha) - math.log(delta * alpha) / (alpha - 1))
  return max(best, 0.0)


@pytest.mark.parametrize("neighbouring, c", [("replace_one", 2.0), ("add_remove", 0.5)])
@pytest.mark.parametrize("sigma, n, s, b, steps", [
    (1.0, 5_000, 21, 64, 160), (3.0, 20_000, 16, 512, 80), (0.7, 3_000, 5, 100, 30)])
def test_epsilon_matches_an_independent_computation(neighbouring, c, sigma, n, s, b,
                                                    steps):
  ours = node_level.epsilon(sigma, n, s, b, steps, 1e-5, neighbouring=neighbouring)
  theirs = _independent_epsilon(sigma, n, s, b, steps, 1e-5, c, node_level.AUTHOR_ORDERS)
  assert ours == pytest.approx(theirs, rel=1e-6)


def test_a_full_batch_is_the_gaussian_mechanism_with_sensitivity_s():
  """b = n: every step holds all S examples of a node (rho = S), the Gaussian
  mechanism of sensitivity S (add/remove: noise multiplier sigma / S)."""
  orders = list(accounting.RDP_ORDERS)
  ours = node_level.NodeLevelRdpAccountant(orders).compose(
      node_level.training_event(4.0, 300, 6, 300, 7))
  theirs = dp_accounting.rdp.RdpAccountant(orders).compose(
      dp_accounting.GaussianDpEvent(4.0 / 6), 7)
  np.testing.assert_allclose(ours._rdp, theirs._rdp, rtol=1e-9)   # pylint: disable=protected-access


def test_the_ledger_composes_node_steps_with_other_queries():
  event = node_level.training_event(2.0, 10_000, 21, 256, 40)
  selection = accounting.selection_event(0.3, 2)
  ledger = PrivacyLedger(1e-4, neighbouring="replace_one")
  ledger.charge(event, "node_level_training")
  ledger.charge(selection, "selection")
  accountant = node_level.NodeLevelRdpAccountant(
      list(accounting.RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(dp_accounting.ComposedDpEvent([event, selection]))
  assert ledger.epsilon() == pytest.approx(accountant.get_epsilon(1e-4), rel=1e-12)
  assert ledger.epsilon() > node_level.epsilon(2.0, 10_000, 21, 256, 40, 1e-4,
                                               orders=accounting.RDP_ORDERS)


@pytest.mark.parametrize("target", [1.0, 8.0, 250.0])
def test_calibration_never_overshoots_and_is_nearly_tight(target):
  args = (50_000, 21, 512, 2 * math.ceil(50_000 / 512), 1 / 50_000)
  sigma = node_level.calibrate_noise_multiplier(target, *args)
  assert node_level.epsilon(sigma, *args) <= target
  assert node_level.epsilon(sigma * (1 - 2e-4), *args) > target


@pytest.mark.parametrize("change, message", [
    (dict(noise_multiplier=0.0), "noise_multiplier must be > 0"),
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(max_neighbourhoods=20, num_nodes=10, batch_size=5), "must be at most num_nodes"),
])
def test_bad_events_are_refused_in_one_line(change, message):
  settings = dict(dict(noise_multiplier=1.0, num_nodes=100, max_neighbourhoods=5,
                       batch_size=10), **change)
  with pytest.raises(ValueError, match=message):
    node_level.epsilon(settings["noise_multiplier"], settings["num_nodes"],
                       settings["max_neighbourhoods"], settings["batch_size"], 3, 1e-5)


def test_a_node_level_run_charges_each_silo_the_theorem():
  """The driver under PrivacyProtocol(replace_one, node_examples=S): every silo's
  noise is calibrated to its target and its ledger holds exactly the node-level
  epsilon of its steps (fixed batches drawn without replacement)."""
  from tff_silo import algorithms, data, models
  from tff_silo.privacy import PrivacyProtocol
  from tff_silo.simulation import run_simulation
  silos = data.heterogeneous_linear_silos(seed=0)
  definition = algorithms.mrmtl_algorithm(
      models.model_for(silos), silos.feature_shape, client_learning_rate=0.05,
      batch_size=8, lam=0.1, l2_norm_clip=1.0, sampling="without_replacement")
  protocol = PrivacyProtocol("replace_one", node_examples=4)
  result = run_simulation(definition, silos, rounds=3, target_epsilon=6.0,
                          target_delta=1e-4, protocol=protocol, backend="vectorized")
  privacy = result.privacy
  for k, n in enumerate(silos.train_sizes):
    b = min(8, int(n))
    expected = node_level.epsilon(privacy.noise_multipliers[k], int(n), 4, b,
                                  3 * (int(n) // b), 1e-4, orders=accounting.RDP_ORDERS)
    assert privacy.epsilon_spent[k] == pytest.approx(expected, rel=1e-9)
    assert privacy.epsilon_spent[k] <= 6.0
  example_level = run_simulation(definition, silos, rounds=3, target_epsilon=6.0,
                                 target_delta=1e-4, backend="vectorized",
                                 protocol=PrivacyProtocol("replace_one")).privacy
  assert (privacy.noise_multipliers > example_level.noise_multipliers).all()
  with pytest.raises(ValueError, match="node_examples must be a positive integer with "
                     "replace_one"):
    PrivacyProtocol("add_remove", public_silo_sizes=True, node_examples=4)
