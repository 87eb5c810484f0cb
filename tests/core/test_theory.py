"""The closed forms of thesis sec. 1.6 against a Monte-Carlo simulation."""

import math

import numpy as np
import pytest

from tff_silo import theory as T

K, N, SIGMA2, TAU2 = 10, 50, 1.0, 0.05
TRIALS = 40000


@pytest.mark.parametrize("sigma_dp2", [0.0, 400.0])
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0, 3.0, 30.0, math.inf])
def test_monte_carlo_agrees_with_lemma_1_6_7(lam, sigma_dp2):
  sigma_loc2 = T.local_variance(N, SIGMA2, sigma_dp2)
  exact = T.mrmtl_error(lam, K, sigma_loc2, TAU2)
  mc = T.monte_carlo_mrmtl_error(lam, num_silos=K, n=N, sigma2=SIGMA2, tau2=TAU2,
                                 sigma_dp2=sigma_dp2, trials=TRIALS, seed=1)
  # 400,000 squared Gaussian errors (K per trial, weakly correlated through the shared
  # mean): relative standard error ~ sqrt(2 / 400000) * (1 + correlation) < 0.5%;
  # 2% is > 4 standard errors.
  assert mc == pytest.approx(exact, rel=0.02)


def test_optimal_lambda_minimizes_the_error_and_matches_corollary():
  for sigma_dp2 in (0.0, 100.0, 1000.0):
    sigma_loc2 = T.local_variance(N, SIGMA2, sigma_dp2)
    lam_star = T.optimal_lambda(N, SIGMA2, sigma_dp2, TAU2)
    grid = np.geomspace(1e-3, 1e3, 2001)
    errors = [T.mrmtl_error(l, K, sigma_loc2, TAU2) for l in grid]
    assert grid[int(np.argmin(errors))] == pytest.approx(lam_star, rel=0.01)
    assert T.mrmtl_error(lam_star, K, sigma_loc2, TAU2) == pytest.approx(
        T.optimal_error(K, sigma_loc2, TAU2), rel=1e-12)


def test_lambda_star_grows_with_privacy_noise():
  lams = [T.optimal_lambda(N, SIGMA2, s, TAU2) for s in (0.0, 10.0, 100.0, 1000.0)]
  assert all(a < b for a, b in zip(lams, lams[1:]))
  # And the Monte-Carlo optimum moves the same way.
  grid = [0.1, 0.3, 1.0, 3.0, 10.0, 30.0]
  best = []
  for sigma_dp2 in (0.0, 1000.0):
    errs = [T.monte_carlo_mrmtl_error(l, num_silos=K, n=N, sigma2=SIGMA2, tau2=TAU2,
                                      sigma_dp2=sigma_dp2, trials=20000, seed=2)
            for l in grid]
    best.append(grid[int(np.argmin(errs))])
  assert best[0] < best[1]


def test_endpoint_gaps_and_private_gap():
  sigma_loc2 = T.local_variance(N, SIGMA2, 200.0)
  e_star = T.optimal_error(K, sigma_loc2, TAU2)
  assert T.mrmtl_error(0.0, K, sigma_loc2, TAU2) - e_star == pytest.approx(
      T.local_error_gap(K, sigma_loc2, TAU2))
  assert T.mrmtl_error(math.inf, K, sigma_loc2, TAU2) - e_star == pytest.approx(
      T.fedavg_error_gap(K, sigma_loc2, TAU2))
  for lam in (0.0, 1.0, 5.0):
    gap = (T.mrmtl_error(lam, K, T.local_variance(N, SIGMA2, 200.0), TAU2)
           - T.mrmtl_error(lam, K, T.local_variance(N, SIGMA2), TAU2))
    assert gap == pytest.approx(T.private_utility_gap(lam, K, N, 200.0))


def test_weight_and_sigma_dp():
  assert T.mrmtl_weight(0.0, K) == 1.0 and T.mrmtl_weight(math.inf, K) == 1.0 / K
  assert 1.0 / K < T.mrmtl_weight(2.0, K) < 1.0
  assert T.gaussian_sigma_dp(1.0, 0.5, 1e-5) == pytest.approx(
      math.sqrt(2 * math.log(1.25e5)) / 0.5)
  with pytest.raises(ValueError, match="num_silos"):
    T.mrmtl_error(1.0, 1, 0.1, 0.1)
