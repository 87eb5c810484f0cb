"""Feature standardization, inside or outside the DP guarantee (`privacy.protocol`).

Modes (`STANDARDIZE`):
- `none`: features as loaded.
- `public`: an affine map fixed without looking at the data (the dataset's documented
  feature ranges mapped to [0, 1]); costs no privacy.
- `dp`: every silo estimates its feature means and standard deviations with one
  Gaussian mechanism and standardizes with them. Each training example contributes
  (c / R, c^2 / R^2, 1), c being its feature vector clipped to L2 norm R, so its
  contribution has norm at most sqrt(3): the noisy sums give the count, the mean and
  the second moment. Under add/remove-one the query's sensitivity is sqrt(3); noise
  of standard deviation z sqrt(3) is a Gaussian mechanism with multiplier z (under
  replace-one the sensitivity is at most 2 sqrt(2) < 2 sqrt(3): multiplier z / 2).
  The noise is the integer Gaussian mechanism's (`integer_gaussian.sum_release`), as
  private as that Gaussian for the numbers computed; the event, with its sampler's
  tail, is charged to the silo's ledger and composed with its DP-SGD.
- `silo`: each silo's exact training mean and standard deviation, as the papers do.
  Adding one example moves every other standardized example, so the per-example
  clip of DP-SGD no longer bounds the sensitivity: this mode is outside the
  guarantee, and rows say so.
Test features are transformed with the training split's map (post-processing).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import dp_accounting
import numpy as np

from tff_silo import keys
from tff_silo.data.silos import SiloData, standardize
from tff_silo.privacy import accounting, events, integer_gaussian

STANDARDIZE = ("none", "public", "dp", "silo")
# Contribution (c / R, c^2 / R^2, 1) of one example: L2 norm at most sqrt(3).
DP_SENSITIVITY = float(np.sqrt(3.0))
# Standard deviations below this (relative to R) are treated as 0 (left unscaled).
_MIN_STD = 1e-3
# Standardization keys hang off round -1 of each silo (before training).
STANDARDIZE_ROUND = -1


def check_mode(mode: str) -> str:
  if mode not in STANDARDIZE:
    raise ValueError(f"standardize must be one of {STANDARDIZE}, got {mode!r}")
  return mode


def inside_guarantee(mode: str) -> bool:
  """Whether a DP run's epsilon covers this preprocessing."""
  return check_mode(mode) != "silo"


@dataclasses.dataclass(frozen=True)
class PublicRanges:
  """Documented per-feature ranges [low, high] (known without the data)."""
  low: np.ndarray
  high: np.ndarray

  def apply(self, x: np.ndarray) -> np.ndarray:
    span = np.where(self.high > self.low, self.high - self.low, 1.0)
    return (x - self.low) / span


def dp_event(noise_multiplier: float, features: int, neighbouring: str = "add_remove"):
  """The `DpEvent` of one silo's DP statistics of `features` features with noise std
  z sqrt(3): the Gaussian mechanism's, beside its 2 d + 1 integer-noise coordinates'
  `IntegerNoiseTail` (a tuple of events: hashable, as the ledgers' cache needs)."""
  factor = 1.0 if neighbouring == "add_remove" else 2.0
  return dp_accounting.ComposedDpEvent((
      dp_accounting.GaussianDpEvent(noise_multiplier / factor),
      events.IntegerNoiseTail(2 * int(features) + 1)))


def dp_noise_multiplier(target_epsilon: float, target_delta: float, share: float,
                        neighbouring: str = "add_remove") -> float:
  """z such that one silo's statistics spend `share` of its epsilon on their own (at
  its delta); the silo's calibration composes the event with DP-SGD."""
  if not 0.0 < share < 1.0:
    raise ValueError(f"the standardization's budget share must be in (0, 1), got {share}")
  z = accounting.calibrate_noise_multiplier(share * target_epsilon, target_delta, 1.0, 1)
  return z if neighbouring == "add_remove" else 2.0 * z


def dp_sums(x: np.ndarray, clip: float, noise_multiplier: float, key) -> np.ndarray:
  """The noisy sums of (c / R, c^2 / R^2, 1) over the rows of `x` ([2 d + 1]): the
  integer Gaussian mechanism on the contributions scaled to norm 1 (by 1 / sqrt(3)),
  scaled back: as private as noise of std z sqrt(3) on the sums. z = 0: the exact
  sums (no release).

  Args:
    x: the silo's training features `[n, d]`.
    clip: R, the L2 clip of a feature vector.
    noise_multiplier: z.
    key: int32[2] key of this release (`tff_silo.keys`).
  """
  x = np.asarray(x, np.float64)
  norms = np.linalg.norm(x, axis=1, keepdims=True)
  c = x * np.minimum(1.0, clip / np.maximum(norms, 1e-12)) / clip
  rows = np.concatenate([c, c * c, np.ones([len(x), 1])], axis=1)
  if noise_multiplier == 0:
    return rows.sum(0)
  released = integer_gaussian.sum_release(rows / DP_SENSITIVITY, 1.0, noise_multiplier,
                                          key)
  return DP_SENSITIVITY * released.numpy().astype(np.float64)


def dp_statistics(x: np.ndarray, clip: float, noise_multiplier: float, key):
  """(mean, std) of the rows of `x` from `dp_sums` (post-processing only)."""
  noisy = dp_sums(x, clip, noise_multiplier, key)
  d = np.shape(x)[1]
  count = max(noisy[-1], 1.0)
  mean = clip * noisy[:d] / count
  second = clip ** 2 * noisy[d:2 * d] / count
  std = np.sqrt(np.maximum(second - mean ** 2, 0.0))
  return mean, np.where(std > _MIN_STD * clip, std, 1.0)


def standardize_silos(silos: SiloData, mode: str, *,
                      public_ranges: Optional[PublicRanges] = None,
                      clip: Optional[float] = None,
                      noise_multipliers: Optional[Sequence[float]] = None,
                      seed: Optional[int] = 0) -> SiloData:
  """`silos` (loaded with `standardize='none'`) standardized by `mode`.

  Args:
    public_ranges: for `public`.
    clip, noise_multipliers: for `dp`: R and each silo's z (`dp_noise_multiplier`).
    seed: the run's seed: silo k's noise uses derive(unit_key(k), -1, STANDARDIZE, 0).
  """
  check_mode(mode)
  if mode == "none":
    return silos
  x_train, x_test = [], []
  if mode == "public":
    if public_ranges is None:
      raise ValueError(f"{silos.name} has no documented feature ranges: standardize "
                       "must be none, dp or silo")
    x_train = [public_ranges.apply(x) for x in silos.x_train]
    x_test = [public_ranges.apply(x) for x in silos.x_test]
  elif mode == "silo":
    for tr, te in zip(silos.x_train, silos.x_test):
      a, b = standardize(tr, te)
      x_train.append(a)
      x_test.append(b)
  else:
    if clip is None or not clip > 0:
      raise ValueError(f"dp standardization needs a positive clip R, got {clip}")
    if noise_multipliers is None or len(noise_multipliers) != silos.num_silos:
      raise ValueError("dp standardization needs one noise multiplier per silo")
    root = keys.root_key(seed)
    for k, (tr, te) in enumerate(zip(silos.x_train, silos.x_test)):
      key = keys.derive(keys.unit_key(root, k), STANDARDIZE_ROUND, keys.STANDARDIZE, 0)
      mean, std = dp_statistics(tr.reshape(len(tr), -1), clip, noise_multipliers[k], key)
      shape = tr.shape[1:]
      x_train.append(((tr.reshape(len(tr), -1) - mean) / std).reshape(-1, *shape))
      x_test.append(((te.reshape(len(te), -1) - mean) / std).reshape(-1, *shape))
  cast = lambda arrays: tuple(np.asarray(x, np.float32) for x in arrays)
  return dataclasses.replace(silos, x_train=cast(x_train), x_test=cast(x_test))
