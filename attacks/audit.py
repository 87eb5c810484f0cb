"""An empirical lower bound on epsilon from one training run (Steinke, Nasr &
Jagielski, "Privacy auditing with one (1) training run", NeurIPS 2023).

m canaries, each in the training data with probability 1/2 (S_j = +-1, drawn from
a key the auditor keeps); after training, a score per canary; the auditor guesses
"in" for the k highest scores and "out" for the k lowest (r = 2k guesses) and
counts its correct guesses v. If the training is (epsilon, delta)-DP for adding or
removing any one canary, then (Thm. 3.1 there)

    P[v right] <= P[Bin(r, p) >= v]
                  + 2 m delta max_{1 <= i <= v} P[v > Bin(r, p) >= v - i] / i,
    p = e^eps / (1 + e^eps),

so every epsilon whose bound falls below 1 - confidence is refuted, and the largest
such epsilon is a lower bound on the true one at that confidence (`epsilon_lower`).
A lower bound above the epsilon a run reports shows a bug (in the accounting, the
sampling or the noise); one below it shows nothing more than that this attack did
not find more (it says nothing of other canaries or attacks).

Canaries here are data-level and white-box on the model's parameters
(`canary_silos`): the linear models get one extra feature per canary, zero for
every real example; canary j is one example whose only non-zero feature is its own,
with a target far from any prediction, so its clipped gradient points along its own
coordinate in every step that samples it. Its score is that coordinate of its
silo's released model (`canary_scores`): the final model, no intermediate updates
(a weaker adversary than one who sees every round).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np
import scipy.stats

# Canary examples: the feature value on the canary's own coordinate and the target.
# Their gradients (err * x, err ~ -target) stay far above any clip used here.
CANARY_FEATURE = 10.0
CANARY_TARGET = 1e4


class Canaries(NamedTuple):
  """Where the canaries are: silo of each, whether it was included, and the first
  canary coordinate of the features (canary j's is `first + j`)."""
  silo: np.ndarray       # int [m]
  included: np.ndarray   # bool [m]
  first: int


def inclusions(num_canaries: int, seed: int) -> np.ndarray:
  """Which canaries are in: Bernoulli(1/2) each, from the auditor's `seed`."""
  return np.random.default_rng([seed, 0x0A0D17]).random(num_canaries) < 0.5


def canary_silos(silos, num_canaries: int, seed: int):
  """(`silos` with `num_canaries` canary features appended (zero for the real
  examples) and the included canaries added to their silos' training data,
  `Canaries`). Canary j goes to silo j mod K; inclusion is Bernoulli(1/2) from
  `seed` (the auditor's). Regression silos of flat features only."""
  from tff_silo.data import silos as silos_lib
  if silos.task != "regression" or len(silos.feature_shape) != 1:
    raise ValueError("canaries are built for regression silos of flat features, got "
                     f"{silos.task} with features {silos.feature_shape}")
  if num_canaries < 2:
    raise ValueError(f"num_canaries must be >= 2, got {num_canaries}")
  included = inclusions(num_canaries, seed)
  silo = np.arange(num_canaries) % silos.num_silos
  first = silos.feature_shape[0]
  width = first + num_canaries
  pad = lambda x: np.concatenate([x, np.zeros((len(x), num_canaries), x.dtype)], 1)
  x_train, y_train = [], []
  for k in range(silos.num_silos):
    mine = np.flatnonzero(included & (silo == k))
    canary_x = np.zeros((len(mine), width), np.float32)
    canary_x[np.arange(len(mine)), first + mine] = CANARY_FEATURE
    x_train.append(np.concatenate([pad(silos.x_train[k]), canary_x]))
    y_train.append(np.concatenate([silos.y_train[k],
                                   np.full(len(mine), CANARY_TARGET, np.float32)]))
  out = silos_lib.make_silos(f"{silos.name}+canaries", silos.task, x_train, y_train,
                             [pad(x) for x in silos.x_test], silos.y_test)
  return out, Canaries(silo, included, first)


def canary_scores(silo_weights, canaries: Canaries) -> np.ndarray:
  """Canary j's score: its coordinate of its silo's model's kernel (its gradient
  steps push it up)."""
  kernels = [np.asarray(weights[0]).reshape(-1) for weights in silo_weights]
  j = np.arange(len(canaries.silo))
  return np.array([kernels[k][canaries.first + i] for k, i in zip(canaries.silo, j)])


def guesses(scores, included, k: int) -> tuple:
  """(r, v): the k highest scores guessed in, the k lowest out (ties broken by
  index), and how many of the r = 2k guesses are right."""
  if not 1 <= 2 * k <= len(scores):
    raise ValueError(f"2 k guesses must be in [2, {len(scores)}], got k={k}")
  order = np.argsort(scores, kind="stable")
  right = included[order[-k:]].sum() + (~included[order[:k]]).sum()
  return 2 * k, int(right)


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
  """The most likely v or more right guesses of r are, for any (epsilon, delta)-DP
  training with m canaries (module docstring)."""
  if not 0 <= v <= r <= m:
    raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
  p = 1.0 / (1.0 + math.exp(-epsilon))
  tail = scipy.stats.binom.sf(v - 1, r, p)
  below = np.cumsum(scipy.stats.binom.pmf(np.arange(v - 1, -1, -1), r, p))
  worst = (below / np.arange(1, v + 1)).max() if v else 0.0
  return min(1.0, float(tail + 2.0 * m * delta * worst))


def epsilon_lower(m: int, r: int, v: int, delta: float, confidence: float = 0.95,
                  tolerance: float = 1e-4) -> float:
  """The largest epsilon refuted at `confidence` (the p-value rises with epsilon; a
  bisection kept on the refuted side), 0 when none is."""
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  alpha = 1.0 - confidence
  if p_value(m, r, v, 0.0, delta) >= alpha:
    return 0.0
  lo, hi = 0.0, 1.0
  while p_value(m, r, v, hi, delta) < alpha:
    lo, hi = hi, 2.0 * hi
    if hi > 1e3:
      return math.inf
  while hi - lo > tolerance:
    mid = (lo + hi) / 2.0
    lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < alpha else (lo, mid)
  return lo


def user_level_scores(settings, rounds: int, included, real_users: int, seed: int,
                      sampling_rate=None, noise_scale: float = 1.0) -> np.ndarray:
  """UDP-Alg's server step audited with user canaries (white-box on every round's
  released aggregate f_t, the quantity its user-level epsilon covers): canary user j
  contributes the clip S along its own coordinate j (a Dirac canary), each of
  `real_users` a random direction in the other coordinates; users are sampled as
  HyperNetFL samples them (`driver.PoissonUsers`, at `sampling_rate`, default the
  settings'), f_t is `user_level.integer_mean` of their clipped, weighted sum with
  the settings' W and noise multiplier (times `noise_scale`: 1 but in a
  deliberately broken run), and canary j's score is the sum over rounds of f_t's
  coordinate j."""
  import tensorflow as tf
  from tff_silo import driver, keys
  from tff_silo.privacy import integer_gaussian, user_level
  m = len(included)
  present = np.concatenate([np.flatnonzero(included), m + np.arange(real_users)])
  rng = np.random.default_rng([seed, 0x05E25])
  directions = rng.standard_normal((real_users, real_users + 1))
  mean = dataclasses.replace(settings.mean([1] * len(present), seed=seed),
                             noise_multiplier=settings.noise_multiplier * noise_scale)
  like = [tf.zeros([m + real_users + 1])]
  grid, bound = mean.integer_grid(m + real_users + 1)
  users = driver.PoissonUsers(len(present), settings.sampling_rate
                              if sampling_rate is None else sampling_rate, seed)
  root = keys.root_key(seed)
  clip = settings.l2_norm_clip
  scores = np.zeros(m)
  for t in range(1, rounds + 1):
    ids = present[users.sample(t)]
    rows = np.zeros((len(ids), m + real_users + 1), np.float32)
    canary = ids < m
    rows[np.flatnonzero(canary), ids[canary]] = clip
    rows[np.flatnonzero(~canary), m:] = directions[ids[~canary] - m] * clip
    flat = user_level.flat_contributions([tf.constant(rows)], tf.ones([len(ids)]), clip)
    total = integer_gaussian.integer_sums(flat, grid, bound)
    released = user_level.integer_mean(total, grid, mean.normalizer, root, t, like)[0]
    scores += released.numpy()[:m]
  return scores
