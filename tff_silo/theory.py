"""Federated mean estimation: the closed forms of thesis sec. 1.6 and app. D.

Model: K silos, each with n samples x_ki = w_k + N(0, sigma^2) around a silo center
w_k = theta + N(0, tau^2). Each silo releases its Gaussian-mechanism mean
w_hat_k = (xi_k + sum_i x_ki) / n with xi_k ~ N(0, sigma_dp^2), so its "local
variance" is sigma_loc^2 = sigma^2 / n + sigma_dp^2 / n^2 (eq. 1.9).
The MR-MTL estimate (Lemma 1.6.1) is alpha * w_hat_k + (1 - alpha) * w_hat_\\k with
alpha = (K + lam) / ((1 + lam) K), w_hat_\\k the mean of the other silos' estimates.
`monte_carlo_mrmtl_error` samples this model to check the formulas.
"""

from __future__ import annotations

import math

import numpy as np


def _check(num_silos=None, **positive):
  if num_silos is not None and (int(num_silos) != num_silos or num_silos < 2):
    raise ValueError(f"num_silos must be an integer >= 2, got {num_silos}")
  for name, value in positive.items():
    if not value >= 0:
      raise ValueError(f"{name} must be >= 0, got {value}")


def gaussian_sigma_dp(l2_norm_clip: float, epsilon: float, delta: float) -> float:
  """Noise std of the classical Gaussian mechanism, c * sqrt(2 ln(1.25 / delta)) / eps
  (thesis sec. 1.6, valid for epsilon < 1)."""
  if not (epsilon > 0 and 0 < delta < 1 and l2_norm_clip > 0):
    raise ValueError("need l2_norm_clip > 0, epsilon > 0 and delta in (0, 1)")
  return l2_norm_clip * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def local_variance(n: int, sigma2: float, sigma_dp2: float = 0.0) -> float:
  """sigma_loc^2 = sigma^2 / n + sigma_dp^2 / n^2 (eq. 1.9)."""
  _check(sigma2=sigma2, sigma_dp2=sigma_dp2)
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  return sigma2 / n + sigma_dp2 / n ** 2


def mrmtl_weight(lam: float, num_silos: int) -> float:
  """alpha = (K + lam) / ((1 + lam) K), the weight on the silo's own estimate
  (Lemma 1.6.1); alpha in (1/K, 1]."""
  _check(num_silos, lam=lam)
  if math.isinf(lam):
    return 1.0 / num_silos
  return (num_silos + lam) / ((1.0 + lam) * num_silos)


def optimal_lambda(n: int, sigma2: float, sigma_dp2: float, tau2: float) -> float:
  """lambda* = (sigma^2 + sigma_dp^2 / n) / (n tau^2) = sigma_loc^2 / tau^2
  (Theorem 1.6.3)."""
  _check(sigma2=sigma2, sigma_dp2=sigma_dp2)
  if not tau2 > 0:
    raise ValueError(f"tau2 must be > 0, got {tau2}")
  return (sigma2 + sigma_dp2 / n) / (n * tau2)


def optimal_error(num_silos: int, sigma_loc2: float, tau2: float) -> float:
  """E* = sigma_loc^2 (sigma_loc^2 + K tau^2) / (K (sigma_loc^2 + tau^2))
  (Corollary 1.6.4)."""
  _check(num_silos, sigma_loc2=sigma_loc2, tau2=tau2)
  k = num_silos
  return sigma_loc2 * (sigma_loc2 + k * tau2) / (k * (sigma_loc2 + tau2))


def local_error_gap(num_silos: int, sigma_loc2: float, tau2: float) -> float:
  """E_loc - E* = (1 - 1/K) sigma_loc^4 / (sigma_loc^2 + tau^2) (Proposition 1.6.5)."""
  _check(num_silos, sigma_loc2=sigma_loc2, tau2=tau2)
  return (1.0 - 1.0 / num_silos) * sigma_loc2 ** 2 / (sigma_loc2 + tau2)


def fedavg_error_gap(num_silos: int, sigma_loc2: float, tau2: float) -> float:
  """E_fed - E* = (1 - 1/K) tau^4 / (sigma_loc^2 + tau^2) (Proposition 1.6.6)."""
  _check(num_silos, sigma_loc2=sigma_loc2, tau2=tau2)
  return (1.0 - 1.0 / num_silos) * tau2 ** 2 / (sigma_loc2 + tau2)


def mrmtl_error(lam: float, num_silos: int, sigma_loc2: float, tau2: float) -> float:
  """E(lam) = (1 - 1/K) (sigma_loc^2 + lam^2 tau^2) / (lam + 1)^2 + sigma_loc^2 / K
  (Lemma 1.6.7); lam = 0 gives local training's sigma_loc^2, lam -> inf FedAvg's."""
  _check(num_silos, lam=lam, sigma_loc2=sigma_loc2, tau2=tau2)
  if math.isinf(lam):
    return (1.0 - 1.0 / num_silos) * tau2 + sigma_loc2 / num_silos
  k = num_silos
  return (1.0 - 1.0 / k) * (sigma_loc2 + lam ** 2 * tau2) / (lam + 1.0) ** 2 + sigma_loc2 / k


def private_utility_gap(lam: float, num_silos: int, n: int, sigma_dp2: float) -> float:
  """Delta_DP(lam) = (1 - 1/K) sigma_dp^2 / ((lam + 1)^2 n^2) + sigma_dp^2 / (K n^2)
  (Theorem 1.6.8): the error privacy adds, shrinking with lam by up to a factor K."""
  _check(num_silos, lam=lam, sigma_dp2=sigma_dp2)
  k = num_silos
  return ((1.0 - 1.0 / k) / (lam + 1.0) ** 2 + 1.0 / k) * sigma_dp2 / n ** 2


def monte_carlo_mrmtl_error(lam: float, *, num_silos: int, n: int, sigma2: float,
                            tau2: float, sigma_dp2: float = 0.0, trials: int = 20000,
                            seed: int = 0) -> float:
  """Mean over trials and silos of (w_k - w_hat_k(lam))^2, sampling the model above.

  The sample mean of n N(w_k, sigma^2) draws is drawn directly as N(w_k, sigma^2/n).
  """
  _check(num_silos, lam=lam, sigma2=sigma2, tau2=tau2, sigma_dp2=sigma_dp2)
  rng = np.random.default_rng(seed)
  k = num_silos
  centers = math.sqrt(tau2) * rng.standard_normal((trials, k))  # theta = 0
  sample_means = centers + math.sqrt(sigma2 / n) * rng.standard_normal((trials, k))
  local = sample_means + math.sqrt(sigma_dp2) / n * rng.standard_normal((trials, k))
  others = (local.sum(axis=1, keepdims=True) - local) / (k - 1)
  alpha = mrmtl_weight(lam, k)
  estimate = alpha * local + (1.0 - alpha) * others
  return float(np.mean((estimate - centers) ** 2))
