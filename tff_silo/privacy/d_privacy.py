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

Keys: `seed` is an int32[2] key (`tff_silo.keys`), one per release; None draws from OS
entropy. A fixed key is for reproducible simulation only.
"""

from __future__ import annotations

import tensorflow as tf

from tff_silo import keys


def _sample(batch_shape, dim: int, scale, seed):
  """`batch_shape + [dim]` draws of radius Gamma(shape dim, scale) times a direction
  uniform on the unit sphere: density proportional to exp(-||x||_2 / scale)."""
  radii = tf.random.stateless_gamma(batch_shape, seed=keys.fold_in(seed, 0),
                                    alpha=float(dim)) * scale
  normal = tf.random.stateless_normal(batch_shape + [dim], seed=keys.fold_in(seed, 1))
  return radii[..., None] * normal / tf.norm(normal, axis=-1, keepdims=True)


def euclidean_laplace_noise(dim: int, epsilon: float, seed=None, batch_shape=()):
  """Noise `batch_shape + [dim]` with density proportional to exp(-eps ||x||_2).

  Args:
    dim: n, the dimension (>= 1).
    epsilon: the d-privacy parameter (> 0), per unit of Euclidean distance.
    seed: int32[2] key; None: OS entropy.
    batch_shape: leading shape of independent samples.
  """
  if int(dim) != dim or dim < 1:
    raise ValueError(f"dim must be a positive integer, got {dim}")
  if not epsilon > 0:
    raise ValueError(f"epsilon must be positive, got {epsilon}")
  return _sample(list(batch_shape), int(dim), 1.0 / epsilon, keys.key_or_fresh(seed))


def sanitize_update(delta_layers, nu: float, seed=None):
  """Algorithm 2 per layer: returns (sanitized layers, leakage per layer).

  Each layer's update delta (n parameters) gets Euclidean Laplace noise with
  epsilon = n / (nu * ||delta||_2); the leakage of that layer is n / nu. A zero
  update gets no noise (its neighbourhood has radius 0).

  Args:
    delta_layers: list of float32 tensors (model update, one per layer/weight).
    nu: the noise multiplier (> 0); larger is more private.
    seed: int32[2] key of this release; None: OS entropy.
  """
  if not nu > 0:
    raise ValueError(f"nu must be positive, got {nu}")
  seed = keys.key_or_fresh(seed)
  sanitized, leakage = [], []
  for i, delta in enumerate(delta_layers):
    flat = tf.reshape(delta, [-1])
    n = int(flat.shape[0])
    # Scale 1/eps = nu * ||delta|| / n, finite (and zero) for a zero update.
    noise = _sample([], n, nu * tf.norm(flat) / n,
                    keys.fold_in(seed, i))
    sanitized.append(tf.reshape(flat + noise, tf.shape(delta)))
    leakage.append(n / nu)
  return sanitized, leakage
