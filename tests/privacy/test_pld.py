"""The PLD accountant beside RDP (`tff_silo.privacy.pld`, issue 53 item 4): its
calibration against dp_accounting's own PLD accountant on a finer grid, the smaller
bound reported, ledgers that let a PLD-calibrated run finish and refuse more, and
the events PLD cannot express."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from tff_silo.privacy import accounting, ledger as ledger_lib, pld
from tff_silo.privacy.protocol import PAPER, PrivacyProtocol
from tff_silo.privacy.silo_accounts import SiloAccounts, charge_round


def _independent_pld(z, q, steps, delta, extra=()):
  """dp_accounting's PLD accountant on a 10x finer grid, at delta less the tail."""
  event = accounting.silo_event(z, q, steps, extra_events=extra)
  accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(event)
  return accountant.get_epsilon(accounting.delta_after_tail(
      delta, accounting.sampler_tail(event)))


@pytest.mark.parametrize("target, q, steps, delta, extra", [
    (1.0, 32 / 88, 600, 1e-3, ()),                       # School, epsilon 1
    (4.0, 16 / 48, 300, 1e-3, ()),                       # the quick preset
    (3.0, 0.0032, 3000, 1e-5, ()),                       # a large silo
    (2.0, 0.1, 200, 1e-5, (dp_accounting.GaussianDpEvent(20.0),)),   # DP statistics
])
def test_pld_calibration_needs_less_noise_and_never_overshoots(target, q, steps, delta,
                                                                extra):
  setting = accounting.silo_setting(q, steps, delta, extra_events=extra)
  (z_rdp,), (spent_rdp,) = accounting.calibrate_noise_multipliers([target], [setting])
  (z,), (spent,) = accounting.calibrate_noise_multipliers([target], [setting], "pld")
  assert 0.75 * z_rdp < z < z_rdp and spent <= target < spent_rdp * (1 + 1e-3)
  # dp_accounting's own PLD, independently on a finer grid, confirms the target
  assert _independent_pld(z, q, steps, delta, extra) <= target
  # and the calibration is tight: 1% less noise would overshoot
  assert _independent_pld(z * 0.99, q, steps, delta, extra) > target * 0.995
  # the reported epsilon is the smaller bound
  rdp = accounting.epsilons_spent([z], [setting])[0]
  assert spent == pytest.approx(min(rdp, accounting.epsilons_spent(
      [z], [setting], "pld")[0])) and spent < rdp


def test_settings_pld_cannot_express_stay_on_rdp():
  """Selections (Gaussian only in RDP) and sampling without replacement: RDP."""
  select = accounting.silo_setting(0.2, 100, 1e-3, selection_epsilon=0.5,
                                   num_selections=3)
  assert not accounting.pld_expressible(select)
  rdp = accounting.calibrate_noise_multipliers([3.0], [select])
  assert np.array_equal(accounting.calibrate_noise_multipliers([3.0], [select], "pld")[0],
                        rdp[0])
  assert pld.primitives(accounting.selection_event(0.5, 2)) is None
  assert pld.primitives(dp_accounting.SampledWithoutReplacementDpEvent(
      10, 2, dp_accounting.GaussianDpEvent(1.0))) is None
  with pytest.raises(ValueError, match="add_remove"):
    PrivacyProtocol("replace_one", accountant="pld")
  with pytest.raises(ValueError, match="accountant must be one of"):
    PrivacyProtocol(accountant="moments")
  assert PrivacyProtocol(public_silo_sizes=True, accountant="pld").name == PAPER.name


def test_primitives_count_steps_and_prefixes_inherit_a_proven_bound():
  step = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
  stats = dp_accounting.GaussianDpEvent(5.0)
  run = dp_accounting.ComposedDpEvent([stats,
                                      dp_accounting.SelfComposedDpEvent(step, 50)])
  counts = pld.primitives(run, 2)
  assert counts == {stats: 2, step: 100}
  eps = pld.epsilon(counts, 1e-5)
  assert pld.known_bound({stats: 2, step: 60}, 1e-5) <= eps   # a prefix
  assert pld.known_bound({stats: 2, step: 60}, 1e-6) == math.inf   # smaller delta
  assert pld.known_bound({stats: 3, step: 60}, 1e-5) == math.inf   # not a prefix
  assert pld.epsilon({stats: 2, step: 60}, 1e-5) < eps


def test_a_pld_calibrated_run_finishes_on_pld_ledgers_and_no_further():
  """RDP alone would stop a PLD-calibrated run before its last rounds; its pld
  ledgers let it finish within the budget, report PLD's epsilon, and refuse one
  round more."""
  rounds = 40
  kwargs = dict(private=True, batch_size=16, epochs_per_round=1, rounds=rounds,
                target_epsilon=2.0, target_delta=1e-3)
  accounts = SiloAccounts([48] * 3, protocol=PrivacyProtocol(
      assumed_silo_size=48, accountant="pld"), **kwargs)
  rdp_only = SiloAccounts([48] * 3, protocol=PrivacyProtocol(assumed_silo_size=48),
                          **kwargs)
  assert (accounts.noise_multipliers < rdp_only.noise_multipliers).all()
  active = [True]
  for r in range(1, rounds + 1):
    charge_round([accounts], active, r)
  assert active == [True]
  spent = ledger_lib.epsilons(accounts.ledgers)
  assert (spent <= 2.0).all() and (spent > 1.99).all()
  ledger = accounts.ledgers[0]
  assert ledger.epsilon() == spent[0]
  rdp = ledger_lib.PrivacyLedger(ledger.target_delta)   # the same charges, RDP alone
  for r in range(1, rounds + 1):
    rdp.charge(accounts.round_charges(r)[0][1], "training_round")
  assert spent[0] < 2.0 < rdp.epsilon()
  charge_round([accounts], active, rounds + 1)
  assert active == [False] and accounts.stopped_because == "budget"
