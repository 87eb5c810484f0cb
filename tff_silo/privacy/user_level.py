"""User-level DP weighted mean: UDP-Alg's server step in plain TensorFlow (Nemala,
Lai, Phan, CIKM'23, Algorithm 1 lines 12-15, eq. 3, Lemma 3.1, eq. 4; the
fixed-denominator estimator of McMahan et al., ICLR'18); `user_level_factory` wraps it
as a `tff.aggregators` factory.

Each sampled user's contribution Delta_u (any structure of float32 tensors) is clipped
to global L2 norm S, weighted by w_u = min(|D_u| / w_hat, 1) (`user_weights`), summed
and divided by q W, where W is the sum of w_u over all N users:

    f = sum_{u in U_t} w_u clip(Delta_u, S) / (q W)                       (eq. 3)

Adding or removing one user moves f by at most max(w) S / (q W) (Lemma 3.1), so
Gaussian noise with standard deviation

    sigma = z max(w) S / (q W)                                            (eq. 4)

makes every round a Poisson-sampled Gaussian mechanism with noise multiplier z and
sampling rate q; `accounting.epsilon_spent(z, q, T, delta)` composes T of them into the
user-level (epsilon, delta) (Theorem 3.2). The noise is the integer Gaussian
mechanism's (`integer_gaussian`): each w_u clip(Delta_u, S) rounded to the grid of
z's grid multiplier (`UserLevelMean.integer_grid`), the sum exact in int64, integer
noise added, then scaled by the grid and 1 / (q W) (`integer_mean`): as private as
the Gaussian at z for the numbers computed, the table's gap charged per coordinate
(`round_event`).

The guarantee assumes what the paper assumes: users are Poisson-sampled with
probability q (the caller's job), W and max(w) are fixed before training and public,
and every round adds the noise, also a round in which no user was sampled. Every
weight is at most 1, so `max_weight=1` (the default) bounds the contribution of any
user a neighbouring population could add; a smaller `max_weight` (the population's
own maximum, as in the paper) only holds for neighbours whose weight does not exceed it.
W from the users' sizes is public only when the sizes are (`UserDPSettings`'s
`public_sizes`); otherwise W is a declared user count (`public_user_count`, every w_u
being at most 1), which scales the step by sum w_u / W against the paper's. Without
either, W = N, the number of users, which adding or removing a user changes: the
scale of every aggregate then reads private data, and `UserDPSettings.covers` says
the guarantee does not hold.

What the user-level epsilon covers in HyperNetFL: the noised aggregates and phi.
Each user's embedding moves with that user's un-noised update, so the embedding, the
model generated from it and its accuracy are that user's own outputs (joint DP):
published, they lie outside the guarantee (`COVERS`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_silo import keys
from tff_silo.privacy import accounting, dp_sgd, integer_gaussian, integer_law


COVERS = ("the noised aggregates and the hypernetwork's shared weights phi; not the "
          "user embeddings, the models generated from them or their accuracies (each "
          "user's own outputs, from its un-noised updates)")


def _check_weight_cap(weight_cap):
  if weight_cap is not None and not (weight_cap > 0 and math.isfinite(weight_cap)):
    raise ValueError(f"weight_cap (w_hat) must be a positive number or None, got "
                     f"{weight_cap}")


def user_weights(num_examples: Sequence[int],
                 weight_cap: Optional[float] = None) -> np.ndarray:
  """w_u = min(|D_u| / w_hat, 1) for every user (Algorithm 1, line 3); all 1 when
  `weight_cap` is None.

  Raises:
    ValueError: `weight_cap` (w_hat) not positive, or a user with no examples.
  """
  _check_weight_cap(weight_cap)
  sizes = np.asarray(num_examples, dtype=np.float64)
  if sizes.ndim != 1 or len(sizes) == 0:
    raise ValueError("num_examples must list the examples of at least one user")
  empty = np.flatnonzero(sizes < 1)
  if len(empty):
    raise ValueError(f"user {int(empty[0])} has no training examples; every user "
                     "needs at least one")
  if weight_cap is None:
    return np.ones_like(sizes)
  return np.minimum(sizes / weight_cap, 1.0)


def noise_stddev(noise_multiplier: float, l2_norm_clip: float, sampling_rate: float,
                 total_weight: float, max_weight: float = 1.0) -> float:
  """sigma = z * max(w) * S / (q W) (eq. 4)."""
  return noise_multiplier * max_weight * l2_norm_clip / (sampling_rate * total_weight)


def _check(l2_norm_clip, noise_multiplier, sampling_rate, total_weight, max_weight):
  if l2_norm_clip is not None and not (l2_norm_clip > 0 and math.isfinite(l2_norm_clip)):
    raise ValueError(f"l2_norm_clip (S) must be positive or None, got {l2_norm_clip}")
  if not noise_multiplier >= 0 or not math.isfinite(noise_multiplier):
    raise ValueError(f"noise_multiplier (z) must be >= 0, got {noise_multiplier}")
  if noise_multiplier > 0 and l2_norm_clip is None:
    raise ValueError("noise_multiplier > 0 needs l2_norm_clip: noise is calibrated to "
                     "the clipped contribution")
  if not 0.0 < sampling_rate <= 1.0:
    raise ValueError(f"sampling_rate (q) must be in (0, 1], got {sampling_rate}")
  if not total_weight > 0 or not math.isfinite(total_weight):
    raise ValueError(f"total_weight (W) must be positive, got {total_weight}")
  if not max_weight > 0 or not math.isfinite(max_weight):
    raise ValueError(f"max_weight must be positive, got {max_weight}")


@dataclasses.dataclass(frozen=True)
class UserLevelMean:
  """Eq. 3 and 4 with their constants, in plain TensorFlow: the one definition of the
  user-level DP mean that the TFF factory (`user_level_factory`) and the vectorized
  hypernetwork round (`hypernet.vectorized`) both compute.

  `l2_norm_clip=None` and `noise_multiplier=0` give the plain estimator
  sum w_u Delta_u / (q W) (noiseless pFedHN). The noise of round t is drawn with the
  key derive(root_key(seed), AGGREGATOR_NOISE, t) (`tff_silo.keys`); `seed=None` (a
  deployment) takes the root from OS entropy, a fixed seed is for simulation only.
  """

  l2_norm_clip: Optional[float]
  noise_multiplier: float
  sampling_rate: float
  total_weight: float
  max_weight: float = 1.0
  seed: Optional[int] = None

  def __post_init__(self):
    _check(self.l2_norm_clip, self.noise_multiplier, self.sampling_rate,
           self.total_weight, self.max_weight)

  @property
  def sigma(self) -> float:
    if self.noise_multiplier == 0:
      return 0.0
    return noise_stddev(self.noise_multiplier, self.l2_norm_clip, self.sampling_rate,
                        self.total_weight, self.max_weight)

  @property
  def normalizer(self) -> float:
    """q W, the fixed denominator of eq. 3."""
    return self.sampling_rate * self.total_weight

  def integer_grid(self, dimension: int):
    """(grid, bound) of the noise over `dimension` coordinates when z > 0: the
    integer Gaussian mechanism (`integer_gaussian.grid_and_bound`) for contributions
    of norm at most max(w) S, drawn at z's grid multiplier
    (`integer_law.grid_noise_multiplier`), as private as eq. 4's Gaussian at z."""
    z = integer_law.grid_noise_multiplier(self.noise_multiplier, int(dimension))
    return integer_gaussian.grid_and_bound(z, self.max_weight * self.l2_norm_clip,
                                           int(dimension))


def weighted_clipped_sum(contributions, weights, l2_norm_clip):
  """sum_u w_u clip(Delta_u, S), eq. 3's numerator: `contributions` are tensors with
  a leading user axis, `weights` [U]; `l2_norm_clip` None does not clip."""
  if l2_norm_clip is not None:
    contributions = dp_sgd.clip_per_example(contributions, l2_norm_clip)
  return [tf.reduce_sum(tf.reshape(weights, [-1] + [1] * (len(c.shape) - 1)) * c, 0)
          for c in contributions]


def flat_contributions(contributions, weights, l2_norm_clip):
  """[U, D]: each user's w_u clip(Delta_u, S) (`contributions` with a leading user
  axis, `weights` [U]), its tensors flattened and concatenated."""
  if l2_norm_clip is not None:
    contributions = dp_sgd.clip_per_example(contributions, l2_norm_clip)
  return dp_sgd.flat_examples(contributions) * tf.cast(weights, tf.float32)[:, None]


def integer_mean(total, grid, normalizer, root, round_num, like, table=None):
  """Eq. 3 and 4 on the integer grid: grid (total + noise) / (q W) in the structure
  of `like` (tensors of static shapes, no user axis), `total` the int64 [D] sum of
  the users' rounded `flat_contributions`; round `round_num`'s draws keyed by
  derive(root, AGGREGATOR_NOISE, round_num) (with `table`: `integer_gaussian.noise`)."""
  shapes = [t.shape for t in like]
  key = keys.derive(root, keys.AGGREGATOR_NOISE, round_num)
  draws = integer_gaussian.noise(tf.convert_to_tensor(key, tf.int32)[None],
                                 sum(s.num_elements() for s in shapes), table)
  flat = integer_gaussian.release(total, draws[0], grid) / normalizer
  return dp_sgd.split_flat(flat, shapes)


@dataclasses.dataclass(frozen=True)
class UserDPSettings:
  """User sampling and user-level DP of one training run (Algorithm 1's inputs).

  Attributes:
    sampling_rate: q, each user's probability of taking part in a round.
    l2_norm_clip: S, the clip of a user's contribution; None: no clipping.
    noise_multiplier: z; 0 adds no noise (then there is no DP guarantee).
    weight_cap: w_hat in w_u = min(|D_u| / w_hat, 1); None gives every user weight 1.
    public_sizes: with `weight_cap`, W = sum_u w_u from the users' sizes, which are
      then declared public (the paper's assumption).
    public_user_count: otherwise W, a user count fixed before training and public
      (the population's declared size); None: W = N, the users present, which is
      private under add/remove-one-user (`covers` says so).
  """

  sampling_rate: float
  l2_norm_clip: Optional[float] = None
  noise_multiplier: float = 0.0
  weight_cap: Optional[float] = None
  public_sizes: bool = False
  public_user_count: Optional[int] = None

  def __post_init__(self):
    _check(self.l2_norm_clip, self.noise_multiplier, self.sampling_rate, 1.0, 1.0)
    _check_weight_cap(self.weight_cap)
    count = self.public_user_count
    if count is not None and not (int(count) == count and count >= 1):
      raise ValueError(f"public_user_count must be a positive integer, got {count}")

  @property
  def total_weight_public(self) -> bool:
    """Whether W is public: from public sizes, or a declared user count."""
    return (self.weight_cap is not None and self.public_sizes
            ) or self.public_user_count is not None

  @property
  def covers(self) -> str:
    """What the user-level epsilon covers (`COVERS`), or, with W = N read from the
    population, that it covers nothing."""
    if self.total_weight_public:
      return COVERS
    return ("no guarantee at the printed epsilon: W = N, the number of users present, "
            "scales every aggregate and changes when a user is added or removed (give "
            "a public user count)")

  @property
  def private(self) -> bool:
    return self.noise_multiplier > 0

  def weights(self, num_examples: Sequence[int]) -> np.ndarray:
    """Every user's w_u (all 1 without `weight_cap`)."""
    return user_weights(num_examples, self.weight_cap)

  def total_weight(self, num_examples: Sequence[int]) -> float:
    """W: the sum of the weights when they are public (`public_sizes`), else the
    declared `public_user_count`, else N, the number of users (every w_u is at most
    1; without `weight_cap` the sum of the weights is N as well)."""
    weights = self.weights(num_examples)
    if self.weight_cap is not None and self.public_sizes:
      return float(weights.sum())
    if self.public_user_count is not None:
      return float(self.public_user_count)
    return float(len(weights))

  def mean(self, num_examples: Sequence[int],
           seed: Optional[int] = None) -> UserLevelMean:
    """The user-level DP mean for a population with these per-user example counts;
    `seed` None draws the noise from OS entropy, a fixed seed is for simulation
    only."""
    return UserLevelMean(self.l2_norm_clip, self.noise_multiplier, self.sampling_rate,
                         self.total_weight(num_examples), seed=seed)

  def round_event(self, coordinates: int):
    """One round's `DpEvent`: the Poisson-sampled Gaussian mechanism (q, z), with
    the `IntegerNoiseTail` of its `coordinates` noisy coordinates (phi's size)."""
    return accounting.dp_sgd_event(self.noise_multiplier, self.sampling_rate, 1,
                                   integer_coordinates=int(coordinates))

  def epsilon(self, rounds: int, target_delta: float, coordinates: int) -> float:
    """User-level epsilon at `target_delta` after `rounds` rounds releasing
    `coordinates` noisy coordinates each (inf without noise)."""
    return accounting.epsilon_spent(self.noise_multiplier, self.sampling_rate, rounds,
                                    target_delta, integer_coordinates=int(coordinates))
