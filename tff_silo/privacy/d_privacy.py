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

A radius is drawn as the sum of n Exp(1) draws (a Gamma of integer shape n; XLA has no
Gamma kernel), -ln(1 - u) of TF's float64 uniforms u computed in float32 arithmetic
(`batched_random.exponentials`, within 2^-21 relative) and summed pairwise (within
log2(n) 2^-24 relative), so the round holds no float64, which TPUs lack; the direction
is `gaussian.normal`'s normals, normalized. Outside the guarantee, not accounted: the
uniforms lie on a 2^-52 grid, so an Exp(1) draw stops at 52 ln 2 (~36.04; a draw past
it has probability 2^-52, n 2^-52 a radius), and the draws and their sum are floats on
a grid, with the roundings above (Mironov 2012); the leakage printed is the
real-valued mechanism's. Negligible next to the leakages reported, but not zero:
d-privacy here has no delta to charge it to.

Keys: `seed` is an int32[2] key (`tff_silo.keys`), one per release; None draws from OS
entropy. A fixed key is for reproducible simulation only. The batched forms
(`sanitize_updates`) draw row k with key k, as the single ones draw with it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys
from tff_silo.privacy import gaussian


def _sample(row_keys, dim: int, scale):
  """[K, dim]: row k a radius Gamma(shape dim, scale[k]) times a direction uniform
  on the unit sphere (density proportional to exp(-||x||_2 / scale[k])), drawn with
  int32[2] key `row_keys[k]`."""
  radii = _pairwise_sum(br.exponentials(br.fold_in(row_keys, 0), dim)) * scale
  normal = gaussian.normal(br.fold_in(row_keys, 1), dim)
  return radii[:, None] * normal / tf.norm(normal, axis=1, keepdims=True)


def _pairwise_sum(terms):
  """Row sums of float32 [K, n] by halving (zeros pad n to a power of two): for
  non-negative terms the rounding stays within log2(n) 2^-24 relative, where a running
  sum's (XLA's reduce on a CPU) grows with n."""
  width = 1 << max(terms.shape[1] - 1, 0).bit_length()
  terms = tf.pad(terms, [[0, 0], [0, width - terms.shape[1]]])
  while width > 1:
    width //= 2
    terms = terms[:, :width] + terms[:, width:]
  return terms[:, 0]


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
  batch_shape = [int(b) for b in batch_shape]
  count = int(np.prod(batch_shape, dtype=np.int64))
  row_keys = br.fold_in(tf.tile(keys.key_or_fresh(seed)[None], [count, 1]),
                        tf.range(count, dtype=tf.int64))
  return tf.reshape(_sample(row_keys, int(dim), tf.constant(1.0 / epsilon, tf.float32)),
                    batch_shape + [int(dim)])


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
  layers = [tf.convert_to_tensor(d, tf.float32) for d in delta_layers]
  sanitized = sanitize_updates([d[None] for d in layers], nu,
                               keys.key_or_fresh(seed)[None])
  return [s[0] for s in sanitized], [d.shape.num_elements() / nu for d in layers]


def sanitize_updates(delta_layers, nu: float, release_keys):
  """`sanitize_update` of K updates at once: layers [K, ...], update k's release
  drawn with int32[2] key `release_keys[k]`; returns the sanitized layers."""
  if not nu > 0:
    raise ValueError(f"nu must be positive, got {nu}")
  sanitized = []
  for i, delta in enumerate(delta_layers):
    n = int(np.prod(delta.shape[1:], dtype=np.int64))
    flat = tf.reshape(delta, [-1, n])
    # Scale 1/eps = nu * ||delta|| / n, finite (and zero) for a zero update.
    noise = _sample(br.fold_in(release_keys, i), n, nu * tf.norm(flat, axis=1) / n)
    sanitized.append(tf.reshape(flat + noise, tf.shape(delta)))
  return sanitized
