"""Privacy ledgers, neighbouring relations and calibration, against independent
`dp_accounting` computations."""

import functools
import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tff_silo import algorithms, data, models
from tff_silo.backends.tff import process_for
from tff_silo.privacy import PAPER, PrivacyLedger, PrivacyProtocol, accounting
from tff_silo.privacy.ledger import over_budget
from tff_silo.simulation import run_simulation

ORDERS = list(accounting.RDP_ORDERS)
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def _independent(event, delta, relation=ADD_REMOVE):
  accountant = dp_accounting.rdp.RdpAccountant(ORDERS, relation)
  accountant.compose(event)
  return accountant.get_epsilon(delta)


def test_ledger_round_by_round_equals_one_composition():
  step = dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(1.1))
  per_round = dp_accounting.SelfComposedDpEvent(step, 3)
  selection = accounting.selection_event(0.2, 1)
  standardize = dp_accounting.GaussianDpEvent(8.0)
  ledger = PrivacyLedger(1e-5)
  ledger.charge(standardize, "standardize")
  for r in range(200):
    ledger.charge(per_round, "dp_sgd")
    if r < 20:
      ledger.charge(selection, "selection")
  whole = dp_accounting.ComposedDpEvent([
      standardize, dp_accounting.SelfComposedDpEvent(step, 600),
      accounting.selection_event(0.2, 20)])
  assert ledger.epsilon() == pytest.approx(_independent(whole, 1e-5), rel=1e-9)
  assert ledger.charges == {"standardize": 1, "dp_sgd": 200, "selection": 20}


def test_replace_one_ledger_uses_sampling_without_replacement():
  event = accounting.dp_sgd_event(1.5, 16 / 80, 50, neighbouring="replace_one",
                                  dataset_size=80)
  ledger = PrivacyLedger(1e-5, neighbouring="replace_one")
  ledger.charge(event, "dp_sgd")
  # Noise z C on a clipped sum whose replace-one sensitivity is 2C: multiplier z / 2.
  want = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      80, 16, dp_accounting.GaussianDpEvent(0.75)), 50)
  assert ledger.epsilon() == pytest.approx(_independent(want, 1e-5, REPLACE_ONE), rel=1e-9)
  with pytest.raises(ValueError, match="cannot be accounted under the add_remove"):
    PrivacyLedger(1e-5).charge(event, "dp_sgd")
  with pytest.raises(ValueError, match="replace_one"):
    PrivacyLedger(1e-5, neighbouring="replace_one").charge(
        accounting.dp_sgd_event(1.5, 0.2, 5), "dp_sgd")


def test_ledger_budget_and_leakage():
  ledger = PrivacyLedger(1e-5, budget=1.0)
  strong = dp_accounting.GaussianDpEvent(10.0)
  assert not ledger.would_exceed(strong)
  ledger.charge(strong, "q")
  assert ledger.would_exceed(dp_accounting.GaussianDpEvent(0.5))
  assert ledger.epsilon() <= 1.0
  ledger.charge_leakage(0.4, "d_privacy")
  ledger.charge_leakage(0.4, "d_privacy")
  assert ledger.leakage == pytest.approx(0.8) and ledger.charges["d_privacy"] == 2
  assert PrivacyLedger(1e-5).epsilon() == 0.0
  fresh = [PrivacyLedger(1e-5, budget=1.0), PrivacyLedger(1e-5, budget=1.0)]
  assert over_budget(fresh, [strong, dp_accounting.GaussianDpEvent(0.5)]) == [1]
  assert over_budget(fresh, [None, strong]) == []
  leakage_only = PrivacyLedger(None)
  leakage_only.charge_leakage(0.4, "d_privacy")
  assert leakage_only.epsilon() == 0.0 and leakage_only.leakage == 0.4
  leakage_only.charge(strong, "q")
  with pytest.raises(ValueError, match="no target_delta"):
    leakage_only.epsilon()


@settings(max_examples=25, deadline=None)
@given(target=st.floats(0.05, 20.0), q=st.floats(0.01, 1.0), steps=st.integers(1, 3000),
       delta=st.sampled_from([1e-3, 1e-5, 1e-7]))
def test_calibration_never_overshoots_after_the_float32_cast(target, q, steps, delta):
  z = accounting.calibrate_noise_multiplier(target, delta, q, steps)
  assert float(np.float32(z)) == z     # what the processes will run with
  assert accounting.epsilon_spent(z, q, steps, delta) <= target


def test_calibration_rounds_up_to_float32():
  z = accounting.calibrate_noise_multiplier(6.0, 1e-3, 32 / 88, 400)
  assert np.float32(z) == z and accounting.epsilon_spent(z, 32 / 88, 400, 1e-3) <= 6.0
  assert accounting.float32_at_least(1.0 + 1e-9) > 1.0 + 1e-9
  assert accounting.float32_at_least(1.0) == 1.0


def test_replace_one_calibration_meets_dp_accountings_figure():
  z = accounting.calibrate_noise_multiplier(2.0, 1e-5, 0.25, 100,
                                            neighbouring="replace_one", dataset_size=40)
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      40, 10, dp_accounting.GaussianDpEvent(z / 2)), 100)
  eps = _independent(event, 1e-5, REPLACE_ONE)
  assert 0.99 * 2.0 < eps <= 2.0


def test_epsilon_spent_edge_cases():
  selections = accounting.selection_event(1.0, 5)
  want = _independent(selections, 1e-5)
  # No DP-SGD steps (with or without noise): the selections alone.
  assert accounting.epsilon_spent(0.0, 0.1, 0, 1e-5, selection_epsilon=1.0,
                                  num_selections=5) == pytest.approx(want)
  assert accounting.epsilon_spent(2.0, 0.1, 0, 1e-5, selection_epsilon=1.0,
                                  num_selections=5) == pytest.approx(want)
  assert accounting.epsilon_spent(0.0, 0.1, 0, 1e-5) == 0.0
  assert math.isinf(accounting.epsilon_spent(0.0, 0.1, 3, 1e-5, selection_epsilon=1.0,
                                             num_selections=5))
  extra = (dp_accounting.GaussianDpEvent(4.0),)
  assert accounting.epsilon_spent(0.0, 0.1, 0, 1e-5, extra_events=extra) == pytest.approx(
      _independent(extra[0], 1e-5))


SILOS = data.heterogeneous_linear_silos(num_silos=3, num_examples=40, dim=3, tau=1.0,
                                        seed=0)
MODEL = models.linear_regression(3)


@functools.lru_cache(maxsize=None)
def _dp_mrmtl(sampling):
  """The DP MR-MTL process with `sampling` (built once per sampling: the runs of a
  test differ in their data and protocol only)."""
  return process_for(algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=1.0,
                                                client_learning_rate=0.1, batch_size=8,
                                                l2_norm_clip=1.0, sampling=sampling))


@pytest.mark.tff
def test_replace_one_run_spends_dp_accountings_epsilon():
  result = run_simulation(_dp_mrmtl("without_replacement"), SILOS, rounds=3,
                          target_epsilon=2.0, target_delta=1e-4,
                          protocol=PrivacyProtocol("replace_one"))
  privacy = result.privacy
  for k, n in enumerate(int(n) for n in SILOS.train_sizes):
    batch = min(8, n)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(
            n, batch, dp_accounting.GaussianDpEvent(privacy.noise_multipliers[k] / 2)),
        3 * max(1, n // batch))
    assert privacy.epsilon_spent[k] == pytest.approx(
        _independent(event, 1e-4, REPLACE_ONE), rel=1e-9)
    assert privacy.epsilon_spent[k] <= 2.0
  np.testing.assert_array_equal(privacy.sizes, SILOS.train_sizes)


def _one_fewer(silos, silo):
  """`silos` with the last training example of `silo` removed (an add/remove
  neighbour)."""
  x = list(silos.x_train)
  y = list(silos.y_train)
  x[silo], y[silo] = x[silo][:-1], y[silo][:-1]
  return data.make_silos(silos.name, silos.task, x, y, silos.x_test, silos.y_test)


@pytest.mark.tff
def test_add_remove_run_releases_nothing_that_depends_on_silo_sizes():
  protocol = PrivacyProtocol(assumed_silo_size=30)
  runs = [run_simulation(_dp_mrmtl("poisson"), silos, rounds=2, target_epsilon=2.0,
                         target_delta=1e-4, protocol=protocol)
          for silos in (SILOS, _one_fewer(SILOS, 1))]
  a, b = runs[0].privacy, runs[1].privacy
  for field in ("noise_multipliers", "sampling_rates", "steps", "epsilon_spent", "sizes"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
  np.testing.assert_array_equal(a.sizes, [30, 30, 30])
  # The paper's protocol uses n_k: the neighbour's calibration differs.
  paper = [run_simulation(_dp_mrmtl("poisson"), silos, rounds=2, target_epsilon=2.0,
                          target_delta=1e-4, protocol=PAPER)
           for silos in (SILOS, _one_fewer(SILOS, 1))]
  assert paper[0].privacy.sampling_rates[1] != paper[1].privacy.sampling_rates[1]


@pytest.mark.tff
def test_shuffled_runs_are_marked_unbounded_and_ledger_csv(tmp_path):
  path = tmp_path / "ledger.csv"
  result = run_simulation(_dp_mrmtl("shuffle"), SILOS, rounds=2, target_epsilon=2.0,
                          target_delta=1e-4, protocol=PAPER, ledger_csv=str(path))
  assert not result.privacy.bounded
  import pandas as pd
  ledger = pd.read_csv(path)
  assert list(ledger["round"].unique()) == [1, 2] and len(ledger) == 6
  last = ledger[ledger["round"] == 2].epsilon.to_numpy()
  np.testing.assert_allclose(last, result.privacy.epsilon_spent)
  assert np.all(ledger[ledger["round"] == 1].epsilon.to_numpy() < last)
