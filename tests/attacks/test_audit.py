"""One-run privacy auditing (`attacks.audit`, `benchmarks.audit`; issue 53 item 5):
the bound's closed form, its validity on the extreme epsilon-DP guesser, the
canaries, and the binary: honest runs (example-level, and UDP-Alg's user-level
mean) stay below their epsilon, a run with a quarter of its noise behind the
accountant's back does not."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from attacks import audit
from tests import binaries


def test_perfect_guesses_without_delta_refute_where_the_binomial_tail_is_alpha():
  # v = r right: P[Bin(r, p) >= r] = p^r, so the bound is where p^r = 0.05.
  eps = audit.epsilon_lower(1000, 200, 200, 0.0, 0.95)
  p = 1 / (1 + math.exp(-eps))
  assert p ** 200 == pytest.approx(0.05, rel=1e-3)
  # without delta the p-value is the binomial tail itself
  assert audit.p_value(1000, 200, 150, 1.0, 0.0) == pytest.approx(
      scipy.stats.binom.sf(149, 200, 1 / (1 + math.exp(-1.0))))
  # delta only weakens it; chance-level guessing refutes nothing
  assert audit.epsilon_lower(1000, 200, 200, 1e-5) < eps
  assert audit.epsilon_lower(1000, 200, 100, 1e-5) == 0.0
  assert (audit.epsilon_lower(1000, 200, 200, 1e-3)
          < audit.epsilon_lower(1000, 200, 200, 1e-5))


def test_the_bound_refutes_a_true_epsilon_at_most_one_time_in_twenty():
  """The extreme epsilon-DP guesser (randomized response: each guess right with
  probability e^eps / (1 + e^eps), independently): over 4,000 simulated audits,
  the lower bound exceeds the true epsilon in at most 5% (plus 3 sd) of them."""
  rng = np.random.default_rng(0)
  eps, r, trials = 1.0, 200, 4000
  right = rng.binomial(r, 1 / (1 + math.exp(-eps)), trials)
  refuted = np.mean([audit.epsilon_lower(1000, r, int(v), 0.0) > eps
                     for v in np.unique(right) for _ in range((right == v).sum())])
  assert refuted <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
  assert refuted > 0.01   # and the bound is not vacuous: it comes close to 5%


def test_canaries_are_one_feature_examples_included_by_the_auditors_seed():
  from tff_silo import data
  silos = data.heterogeneous_linear_silos(num_silos=4, num_examples=20, dim=3, seed=0)
  canaried, canaries = audit.canary_silos(silos, 40, seed=7)
  assert canaried.feature_shape == (43,) and canaries.first == 3
  assert 10 < canaries.included.sum() < 30
  again = audit.canary_silos(silos, 40, seed=7)[1]
  assert np.array_equal(again.included, canaries.included)
  for k in range(4):
    x, y = canaried.x_train[k], canaried.y_train[k]
    real = len(silos.x_train[k])
    np.testing.assert_array_equal(x[:real, :3], silos.x_train[k])
    assert not x[:real, 3:].any() and not x[real:, :3].any()
    mine = np.flatnonzero(canaries.included & (canaries.silo == k))
    np.testing.assert_array_equal(np.argmax(x[real:], 1), 3 + mine)
    assert (y[real:] == audit.CANARY_TARGET).all()
  weights = [[np.arange(43.0)[:, None] + k, np.zeros(1)] for k in range(4)]
  np.testing.assert_array_equal(audit.canary_scores(weights, canaries),
                                3 + np.arange(40) + canaries.silo)
  assert audit.guesses(np.arange(10.0), np.arange(10) >= 5, 2) == (4, 4)
  with pytest.raises(ValueError, match="regression"):
    audit.canary_silos(data.heterogeneous_linear_silos(num_silos=2, num_examples=8,
                                                       classification=True), 4, 0)


@pytest.mark.cli
@pytest.mark.slow
def test_honest_runs_stay_below_their_epsilon_and_a_quarter_noise_does_not(tmp_path):
  out = tmp_path / "audit.csv"
  # 2,000 canaries and 200 guesses a side: with the defaults (1,000; 100) a quarter
  # of the noise is caught in ~95% of draws (156-174 of 200 right over seeds 0-2;
  # 158 refutes epsilon 1), and seed 0's integer noise drew 156
  done = binaries.run("audit", "--methods=local,ifca,hypernet_udp",
                      "--mutations=noise_div4", "--canaries=2000", "--guesses=200",
                      f"--output={out}",
                      f"--plot={tmp_path / 'audit.png'}")
  assert done.returncode == 0, done.stderr[-2000:]
  rows = pd.read_csv(out).set_index(["method", "mutation"])
  ifca = rows.loc[("ifca", "none")]   # its private selections in the ledgers
  assert ifca.epsilon_lower <= ifca.epsilon_reported <= 1.0
  # UDP-Alg's user-level mean, user canaries: honest below, a quarter noise above
  users = rows.loc["hypernet_udp"]
  assert users.loc["none"].epsilon_lower <= users.loc["none"].epsilon_reported
  assert users.loc["noise_div4"].epsilon_lower > users.loc["noise_div4"].epsilon_reported
  honest, broken = rows.loc[("local", "none")], rows.loc[("local", "noise_div4")]
  assert honest.epsilon_reported == pytest.approx(1.0, abs=1e-3)
  assert honest.epsilon_lower <= honest.epsilon_reported
  # the same reported epsilon, refuted
  assert broken.epsilon_reported == honest.epsilon_reported
  assert broken.epsilon_lower > broken.epsilon_reported
  assert (tmp_path / "audit.png").stat().st_size > 0
  assert "AUDIT FAILED" not in done.stdout
  bad = binaries.run("audit", "--guesses=600", f"--output={out}")
  assert bad.returncode == 2 and "--guesses must be at most" in bad.stderr
