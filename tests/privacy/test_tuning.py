"""The privacy cost of tuning (`tff_silo.privacy.tuning`): the distributions of the
number of trials against scipy, the sampler statistically, the RDP bounds against
dp_accounting's RepeatAndSelectDpEvent, the calibration never overshooting."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.stats

from tff_silo.privacy import accounting
from tff_silo.privacy.tuning import (PoissonTrials, TruncatedNegativeBinomial,
                                     calibrate_noise, calibrate_trial_epsilon,
                                     draw_trials, gaussian_rdp,
                                     expected_best, repeat_and_select_epsilon,
                                     repeat_and_select_rdp, tuned_epsilon)

ETAS = (-0.5, 0.0, 0.5, 1.0, 2.0, 5.0)   # thesis Fig. 1.7
ORDERS = np.array(accounting.RDP_ORDERS)


@pytest.mark.parametrize("eta", ETAS)
def test_the_distribution_has_the_mean_it_was_made_for(eta):
  trials = TruncatedNegativeBinomial.with_mean(eta, 10.0)
  assert trials.mean == pytest.approx(10.0, rel=1e-9)
  pmf = trials.pmf(200_000)
  assert pmf.min() >= 0
  assert pmf.sum() == pytest.approx(1.0, abs=1e-6)
  assert np.sum(np.arange(1, len(pmf) + 1) * pmf) == pytest.approx(10.0, rel=1e-3)


@pytest.mark.parametrize("eta", [0.0, 0.5, 2.0, 5.0])
def test_the_pmf_is_scipys_truncated_at_one(eta):
  """eta = 0: the logarithmic distribution; eta > 0: the negative binomial
  (failures before the eta-th success, success probability gamma) given h >= 1."""
  trials = TruncatedNegativeBinomial(eta, 0.2)
  h = np.arange(1, 60)
  if eta == 0:
    expected = scipy.stats.logser.pmf(h, 1 - trials.gamma)
  else:
    expected = (scipy.stats.nbinom.pmf(h, eta, trials.gamma)
                / (1 - trials.gamma ** eta))
  np.testing.assert_allclose(trials.pmf(59), expected, rtol=1e-10)


def _chi_square_p(draws, pmf, first):
  """p-value of draws against pmf (P[first], P[first + 1], ...; the rest of the mass
  beyond), cells merged from both ends until each expects at least 5 draws."""
  expected = np.append(pmf, max(0.0, 1 - pmf.sum())) * len(draws)
  observed = np.bincount(np.clip(draws - first, 0, len(pmf)), minlength=len(pmf) + 1)
  cells_e, cells_o, e, o = [], [], 0.0, 0
  for ei, oi in zip(expected, observed):
    e, o = e + ei, o + oi
    if e >= 5:
      cells_e.append(e)
      cells_o.append(o)
      e, o = 0.0, 0
  cells_e[-1] += e
  cells_o[-1] += o
  return scipy.stats.chisquare(cells_o, np.array(cells_e) * len(draws) / sum(cells_e)).pvalue


@pytest.mark.parametrize("trials", [TruncatedNegativeBinomial.with_mean(-0.5, 10.0),
                                    TruncatedNegativeBinomial.with_mean(2.0, 10.0),
                                    PoissonTrials(10.0)])
def test_the_sampler_draws_from_the_distribution(trials):
  rng = np.random.default_rng(0)
  draws = np.array([trials.sample(rng) for _ in range(20_000)])
  if isinstance(trials, PoissonTrials):
    p = _chi_square_p(draws, scipy.stats.poisson.pmf(np.arange(0, 40), trials.mu), 0)
  else:
    assert draws.min() >= 1
    p = _chi_square_p(draws, trials.pmf(200), 1)
  assert p > 1e-3
  assert draws.mean() == pytest.approx(trials.mean,
                                       abs=5 * draws.std() / math.sqrt(len(draws)))


def test_the_chi_square_check_can_fail():
  """Draws of another distribution (E[h] = 12 instead of 10) are told apart."""
  rng = np.random.default_rng(0)
  other = TruncatedNegativeBinomial.with_mean(2.0, 12.0)
  draws = np.array([other.sample(rng) for _ in range(20_000)])
  assert _chi_square_p(draws, TruncatedNegativeBinomial.with_mean(2.0, 10.0).pmf(200),
                       1) < 1e-6


def _dp_accounting_rdp(event, mean, shape):
  accountant = dp_accounting.rdp.RdpAccountant(list(ORDERS))
  accountant.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(event, mean, shape))
  return accountant._rdp   # pylint: disable=protected-access


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0, 5.0, math.inf])
@pytest.mark.parametrize("event", [
    dp_accounting.GaussianDpEvent(3.0),
    dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.05, dp_accounting.GaussianDpEvent(1.1)), 400)])
def test_the_bounds_are_dp_accountings_where_it_has_them(eta, event):
  base = dp_accounting.rdp.RdpAccountant(list(ORDERS))
  base.compose(event)
  rdp = base._rdp   # pylint: disable=protected-access
  trials = (PoissonTrials(10.0) if eta == math.inf
            else TruncatedNegativeBinomial.with_mean(eta, 10.0))
  ours = repeat_and_select_rdp(ORDERS, rdp, trials)
  theirs = _dp_accounting_rdp(event, trials.mean, eta)
  # dp_accounting makes only the TNB bound monotone in the order (RDP never falls
  # as the order grows); ours is monotone for Poisson too, so tighter at low orders.
  assert np.all(ours <= theirs * (1 + 1e-6))
  np.testing.assert_allclose(ours, np.minimum.accumulate(theirs[::-1])[::-1], rtol=1e-6)
  theirs_epsilon = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(
      ORDERS, theirs, 1e-5)[0]
  assert repeat_and_select_epsilon(ORDERS, rdp, trials, 1e-5) == pytest.approx(
      theirs_epsilon, rel=1e-6)


def test_tuning_costs_more_than_one_run_and_less_with_smaller_eta():
  """Thesis app. E.2: at a fixed E[h], a smaller eta gives a tighter guarantee."""
  rdp = gaussian_rdp(5.0, ORDERS)
  one_run = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(ORDERS, rdp,
                                                                     1e-5)[0]
  tuned = [repeat_and_select_epsilon(ORDERS, rdp,
                                     TruncatedNegativeBinomial.with_mean(eta, 10.0),
                                     1e-5) for eta in ETAS]
  assert all(e > one_run for e in tuned)
  assert tuned == sorted(tuned)
  # and far less than releasing all ~10 runs (10-fold composition).
  all_runs = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(ORDERS, 10 * rdp,
                                                                      1e-5)[0]
  assert tuned[ETAS.index(1.0)] < all_runs


@pytest.mark.parametrize("trials", [None, TruncatedNegativeBinomial.with_mean(0.5, 10.0),
                                    PoissonTrials(10.0)])
def test_the_calibration_never_overshoots_and_is_tight(trials):
  z = calibrate_noise(0.25, 1e-5, dp_accounting.GaussianDpEvent, trials)
  orders = np.array(accounting.RDP_ORDERS + (512.0, 1024.0, 2048.0, 4096.0, 8192.0))

  def epsilon(noise):
    rdp = gaussian_rdp(noise, orders)
    if trials is None:
      return dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(orders, rdp,
                                                                       1e-5)[0]
    return repeat_and_select_epsilon(orders, rdp, trials, 1e-5)

  assert epsilon(z) <= 0.25
  assert epsilon(z * (1 - 1e-5)) > 0.25
  if trials is not None:
    assert z > calibrate_noise(0.25, 1e-5, dp_accounting.GaussianDpEvent)


def test_draw_trials_plans_h_random_candidates():
  rng = np.random.default_rng(1)
  plans = [draw_trials(TruncatedNegativeBinomial.with_mean(1.0, 4.0), 7, rng)
           for _ in range(2000)]
  assert min(len(p) for p in plans) >= 1
  flat = np.concatenate(plans)
  assert flat.min() >= 0 and flat.max() <= 6
  assert scipy.stats.chisquare(np.bincount(flat, minlength=7)).pvalue > 1e-3


@pytest.mark.parametrize("make, message", [
    (lambda: TruncatedNegativeBinomial(-1.0, 0.5), "eta must be"),
    (lambda: TruncatedNegativeBinomial(1.0, 1.0), "gamma must be"),
    (lambda: TruncatedNegativeBinomial.with_mean(1.0, 1.0), "mean number of trials"),
    (lambda: PoissonTrials(0.0), "mu"),
    (lambda: repeat_and_select_rdp([3.0, 2.0], [1.0, 1.0], PoissonTrials(2.0)),
     "increasing"),
    (lambda: calibrate_noise(0.0, 1e-5, dp_accounting.GaussianDpEvent),
     "target_epsilon"),
    (lambda: draw_trials(PoissonTrials(2.0), 0, np.random.default_rng(0)),
     "num_candidates"),
])
def test_bad_arguments_are_named(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_expected_best_is_the_mean_best_of_random_draws():
  """`expected_best` against sampling `draw_trials` plans."""
  errors = np.array([0.5, 0.1, 0.3, 0.2, 0.9])
  rng = np.random.default_rng(3)
  for trials in (TruncatedNegativeBinomial.with_mean(-0.5, 3.0), PoissonTrials(1.5)):
    best = [errors[plan].min() if plan else errors[0]   # h = 0: lambda = 0
            for plan in (draw_trials(trials, len(errors), rng) for _ in range(40_000))]
    assert expected_best(errors, trials) == pytest.approx(
        np.mean(best), abs=4 * np.std(best) / math.sqrt(len(best)))


def _tuning_cost(*flags):
  from tests import binaries
  return binaries.run("tuning_cost", *flags, timeout=300)


@pytest.mark.cli
def test_the_tuning_cost_binary_writes_rows_and_a_figure(tmp_path):
  import pandas as pd
  out, plot = tmp_path / "t.csv", tmp_path / "t.png"
  proc = _tuning_cost("--num_lambdas=4", "--monte_carlo_trials=200", "--etas=0,1",
                      f"--output={out}", f"--plot={plot}")
  assert proc.returncode == 0, proc.stderr
  rows = pd.read_csv(out)
  assert set(rows.condition) == {"non_private", "private", "tnb_eta=0", "tnb_eta=1",
                                 "poisson"}
  assert len(rows) == 5 * 5 and plot.stat().st_size > 0
  z = rows.groupby("condition").noise_multiplier.first()
  assert z["non_private"] == 0 and z["private"] < z["tnb_eta=0"] < z["tnb_eta=1"]
  # the closed form and its Monte Carlo check agree (200 trials x 20 silos)
  np.testing.assert_allclose(rows.error_monte_carlo, rows.error, rtol=0.15)
  assert "tuned_error" in proc.stdout


@pytest.mark.cli
@pytest.mark.parametrize("flag, message", [
    ("--etas=-1", "--etas must be > -1"), ("--mean_trials=1", "--mean_trials must be > 1"),
    ("--delta=0", "--delta must be in (0, 1)"), ("--plot=x.txt", "--plot x.txt must end"),
])
def test_the_tuning_cost_binary_refuses_bad_flags_in_one_line(flag, message):
  proc = _tuning_cost(flag)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_a_dp_sgd_trial_calibrated_for_tuning_meets_the_target():
  """DP-SGD (Poisson-subsampled Gaussian) composed with a Gaussian score release,
  tuned with h ~ TNB: the calibrated z meets the target by dp_accounting's own
  RepeatAndSelectDpEvent, and is tight."""
  score = dp_accounting.GaussianDpEvent(20.0)
  trial = lambda z: dp_accounting.ComposedDpEvent([accounting.dp_sgd_event(z, 0.2, 150),
                                                   score])
  trials = TruncatedNegativeBinomial.with_mean(1.0, 10.0)
  z = calibrate_noise(4.0, 1e-3, trial, trials)
  assert tuned_epsilon(trial(z), trials, 1e-3) <= 4.0 < tuned_epsilon(
      trial(z * (1 - 1e-5)), trials, 1e-3)
  orders = list(accounting.RDP_ORDERS + (512.0, 1024.0, 2048.0, 4096.0, 8192.0))
  accountant = dp_accounting.rdp.RdpAccountant(orders)
  accountant.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(trial(z),
                                                                    trials.mean, 1.0))
  assert accountant.get_epsilon(1e-3) == pytest.approx(4.0, rel=1e-3)
  assert z > calibrate_noise(4.0, 1e-3, trial)   # tuning costs noise


def test_a_trial_budget_for_tuning_never_overshoots_and_is_tight():
  """The per-trial epsilon of a tuning: DP-SGD calibrated to it, with selections at
  a share of it, then tuned, meets the target; a little more budget would not."""
  trials = TruncatedNegativeBinomial.with_mean(1.0, 10.0)

  def event_for(e):
    z = accounting.calibrate_noise_multiplier(e, 1e-3, 0.3, 60,
                                              selection_epsilon=0.03 * e,
                                              num_selections=2)
    return accounting.silo_event(z, 0.3, 60, selection_epsilon=0.03 * e,
                                 num_selections=2)

  e = calibrate_trial_epsilon(3.0, 1e-3, event_for, trials)
  assert 0 < e < 3.0
  assert tuned_epsilon(event_for(e), trials, 1e-3) <= 3.0
  assert tuned_epsilon(event_for(e * 1.01), trials, 1e-3) > 3.0
