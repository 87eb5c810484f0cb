"""Synthetic silos.

- `mean_estimation_silos`: the federated mean-estimation model of thesis sec. 1.6:
  silo centers w_k = theta + N(0, tau^2), samples x_ki = w_k + N(0, sigma^2). The
  samples are the regression targets and the single feature is a constant zero, so a
  linear regression's bias is the silo's mean estimate.
- `heterogeneous_linear_silos`: y = x^T w_k (+ N(0, sigma^2)) with
  w_k = w_0 + N(0, tau^2 I), x ~ N(0, I); regression targets, or labels sign(x^T w_k)
  in {-1, +1} for classification.
- `two_cluster_linear_silos`: Galli et al. sec. 5.1, y = x^T theta*_g + U[0, 1) with
  theta*_1 = (5, 6), theta*_2 = (4, -4.5); each user draws its cluster g at random
  (`groups`). x ~ N(0, I) is this library's choice (the paper does not say).
"""

from __future__ import annotations

import numpy as np

from tff_silo.data.silos import make_silos, split_silo, SiloData


def _check_positive(**kwargs):
  for name, value in kwargs.items():
    if value <= 0:
      raise ValueError(f"{name} must be positive, got {value}")


def mean_estimation_silos(*, num_silos: int = 20, num_examples: int = 50,
                          sigma: float = 1.0, tau: float = 0.5, theta: float = 0.0,
                          test_fraction: float = 0.2, seed: int = 0) -> SiloData:
  _check_positive(num_silos=num_silos, num_examples=num_examples, sigma=sigma)
  if tau < 0:
    raise ValueError(f"tau must be >= 0, got {tau}")
  rng = np.random.default_rng(seed)
  centers = theta + tau * rng.standard_normal(num_silos)
  parts = ([], [], [], [])
  for k in range(num_silos):
    y = centers[k] + sigma * rng.standard_normal(num_examples)
    for part, value in zip(parts, split_silo(np.zeros((num_examples, 1)), y,
                                             test_fraction, rng)):
      part.append(value)
  return make_silos("mean_estimation", "regression", *parts)


def heterogeneous_linear_silos(*, num_silos: int = 20, num_examples: int = 200,
                               dim: int = 10, tau: float = 0.5, sigma: float = 0.1,
                               classification: bool = False, test_fraction: float = 0.25,
                               seed: int = 0) -> SiloData:
  _check_positive(num_silos=num_silos, num_examples=num_examples, dim=dim)
  if tau < 0 or sigma < 0:
    raise ValueError(f"tau and sigma must be >= 0, got tau={tau}, sigma={sigma}")
  rng = np.random.default_rng(seed)
  w0 = rng.standard_normal(dim)
  parts = ([], [], [], [])
  for _ in range(num_silos):
    w = w0 + tau * rng.standard_normal(dim)
    x = rng.standard_normal((num_examples, dim))
    y = x @ w + sigma * rng.standard_normal(num_examples)
    if classification:
      y = np.where(y >= 0, 1.0, -1.0)
    for part, value in zip(parts, split_silo(x, y, test_fraction, rng)):
      part.append(value)
  task = "binary_pm1" if classification else "regression"
  return make_silos("synthetic", task, *parts)


GALLI_THETAS = ((5.0, 6.0), (4.0, -4.5))


def two_cluster_linear_silos(*, num_users: int = 100, num_examples: int = 10,
                             test_examples: int = 10, thetas=GALLI_THETAS,
                             seed=0) -> SiloData:
  """Users of Galli et al.'s synthetic experiment: `num_examples` training and
  `test_examples` held-out examples each; `seed` may be an int or a sequence."""
  _check_positive(num_users=num_users, num_examples=num_examples,
                  test_examples=test_examples)
  thetas = np.asarray(thetas, np.float64)
  if thetas.ndim != 2 or len(thetas) < 1:
    raise ValueError(f"thetas must be a (clusters, dim) array, got shape {thetas.shape}")
  rng = np.random.default_rng(seed)
  groups = rng.integers(len(thetas), size=num_users)
  parts = ([], [], [], [])
  total = num_examples + test_examples
  for g in groups:
    x = rng.standard_normal((total, thetas.shape[1]))
    y = x @ thetas[g] + rng.random(total)
    for part, value in zip(parts, (x[:num_examples], y[:num_examples],
                                   x[num_examples:], y[num_examples:])):
      part.append(value)
  return make_silos("two_cluster", "regression", *parts, groups=groups)
