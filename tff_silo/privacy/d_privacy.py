"""d-privacy with the Euclidean Laplace mechanism (Galli et al., "Group privacy for
personalized federated learning", Lemmas 1-2 and Algorithm 2).

The mechanism adds noise with density proportional to exp(-epsilon * ||x||_2) in R^n;
it is epsilon d-private for the Euclidean metric: outputs for inputs at distance r
are indistinguishable up to a factor exp(epsilon * r). A sample is a radius
r ~ Gamma(shape n, scale 1 / epsilon) (mean n / epsilon) times a direction uniform
on the unit sphere; each component has variance (n + 1) / epsilon^2 (Lemma 2).

`sanitize_update` is Algorithm 2, applied per layer as in the paper's DLG
experiments: for an update delta of a layer with n parameters,
epsilon = n / (nu * ||delta||_2), so the leakage towards the update's own
neighbourhood is epsilon * ||delta|| = n / nu per participation; leakages of repeated
participations add up (Theorem 1).
"""

from __future__ import annotations

import tensorflow as tf


def _unit_directions(shape, seed):
  normal = tf.random.stateless_normal(shape, seed=seed)
  return normal / tf.norm(normal, axis=-1, keepdims=True)


def _gamma_radii(batch_shape, dim, seed):
  """Gamma(shape dim, scale 1) radii, `batch_shape`."""
  return tf.random.stateless_gamma(batch_shape, seed=seed, alpha=float(dim))


def euclidean_laplace_noise(dim: int, epsilon: float, seed, batch_shape=()):
  """Noise `batch_shape + [dim]` with density proportional to exp(-eps ||x||_2).

  Args:
    dim: n, the dimension (>= 1).
    epsilon: the d-privacy parameter (> 0), per unit of Euclidean distance.
    seed: int32[2] stateless seed.
    batch_shape: leading shape of independent samples.
  """
  if int(dim) != dim or dim < 1:
    raise ValueError(f"dim must be a positive integer, got {dim}")
  if not epsilon > 0:
    raise ValueError(f"epsilon must be positive, got {epsilon}")
  batch_shape = list(batch_shape)
  seeds = tf.random.experimental.stateless_split(seed, 2)
  radii = _gamma_radii(batch_shape, dim, seeds[0]) / epsilon
  return radii[..., None] * _unit_directions(batch_shape + [int(dim)], seeds[1])


def sanitize_update(delta_layers, nu: float, seed):
  """Algorithm 2 per layer: returns (sanitized layers, leakage per layer).

  Each layer's update delta (n parameters) gets Euclidean Laplace noise with
  epsilon = n / (nu * ||delta||_2); the leakage of that layer is n / nu. A zero
  update gets no noise (its neighbourhood has radius 0).

  Args:
    delta_layers: list of float32 tensors (model update, one per layer/weight).
    nu: the noise multiplier (> 0); larger is more private.
    seed: int32[2] stateless seed.
  """
  if not nu > 0:
    raise ValueError(f"nu must be positive, got {nu}")
  sanitized, leakage = [], []
  for i, delta in enumerate(delta_layers):
    flat = tf.reshape(delta, [-1])
    n = int(flat.shape[0])
    layer_seed = tf.random.experimental.stateless_fold_in(seed, i)
    seeds = tf.random.experimental.stateless_split(layer_seed, 2)
    # Radius Gamma(n, scale 1/eps) = Gamma(n, 1) * nu * ||delta|| / n (finite at 0).
    radius = _gamma_radii([], n, seeds[0]) * nu * tf.norm(flat) / n
    noise = radius * _unit_directions([n], seeds[1])
    sanitized.append(tf.reshape(flat + noise, tf.shape(delta)))
    leakage.append(n / nu)
  return sanitized, leakage
