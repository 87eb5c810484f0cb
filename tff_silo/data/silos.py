"""The per-silo dataset container shared by every loader, and its validation.

A cross-silo dataset is K silos, each with its own train and test arrays. Labels are
float32 for every task (regression targets, +-1 for SVMs, 0/1 for logistic regression,
class indices for multiclass) so that one TFF type serves all silos.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

TASKS = ("regression", "binary_pm1", "binary_01", "multiclass")


class DataError(ValueError):
  """Raised for data that cannot be used: missing file, bad layout or values."""


@dataclasses.dataclass(frozen=True)
class SiloData:
  """Train/test arrays of K silos.

  Attributes:
    name: dataset name.
    task: one of `TASKS`.
    x_train, y_train, x_test, y_test: per-silo arrays (float32); features of every
      silo share one shape after the leading example dimension.
    num_classes: classes for `multiclass`, else 1 (one model output).
    groups: optional true cluster id of every silo (e.g. rotation group).
  """

  name: str
  task: str
  x_train: tuple
  y_train: tuple
  x_test: tuple
  y_test: tuple
  num_classes: int = 1
  groups: Optional[tuple] = None

  def __post_init__(self):
    validate_silos(self)

  @property
  def num_silos(self) -> int:
    return len(self.x_train)

  @property
  def feature_shape(self) -> tuple:
    return tuple(self.x_train[0].shape[1:])

  @property
  def train_sizes(self) -> np.ndarray:
    return np.array([len(y) for y in self.y_train])

  @property
  def test_sizes(self) -> np.ndarray:
    return np.array([len(y) for y in self.y_test])


def validate_silos(data: SiloData) -> None:
  """Checks shapes, sizes and values; raises `DataError` naming the problem."""
  if data.task not in TASKS:
    raise DataError(f"task must be one of {TASKS}, got {data.task!r}")
  parts = {"x_train": data.x_train, "y_train": data.y_train,
           "x_test": data.x_test, "y_test": data.y_test}
  k = len(data.x_train)
  if k == 0:
    raise DataError(f"dataset {data.name!r} has no silos")
  for part, arrays in parts.items():
    if len(arrays) != k:
      raise DataError(f"{data.name}: {part} has {len(arrays)} silos, x_train has {k}")
  feature_shape = tuple(np.shape(data.x_train[0])[1:])
  for i in range(k):
    for split in ("train", "test"):
      x, y = parts[f"x_{split}"][i], parts[f"y_{split}"][i]
      if len(y) == 0:
        raise DataError(f"{data.name}: silo {i} has no {split} examples")
      if np.ndim(x) < 2 or len(x) != len(y) or np.ndim(y) != 1:
        raise DataError(
            f"{data.name}: silo {i} {split} features {np.shape(x)} and labels "
            f"{np.shape(y)} do not form (n, features...) and (n,)")
      if tuple(np.shape(x)[1:]) != feature_shape:
        raise DataError(
            f"{data.name}: silo {i} has feature shape {tuple(np.shape(x)[1:])}, "
            f"silo 0 has {feature_shape}")
      for what, arr in (("features", x), ("labels", y)):
        if not np.all(np.isfinite(arr)):
          raise DataError(f"{data.name}: silo {i} {split} {what} contain NaN or "
                          "infinite values")
  if data.groups is not None and len(data.groups) != k:
    raise DataError(f"{data.name}: groups has {len(data.groups)} entries for {k} silos")


def make_silos(name: str, task: str, x_train: Sequence, y_train: Sequence,
               x_test: Sequence, y_test: Sequence, **kwargs) -> SiloData:
  """Builds a validated `SiloData`, casting every array to float32."""
  cast = lambda arrays: tuple(np.asarray(a, dtype=np.float32) for a in arrays)
  groups = kwargs.pop("groups", None)
  return SiloData(name=name, task=task, x_train=cast(x_train), y_train=cast(y_train),
                  x_test=cast(x_test), y_test=cast(y_test),
                  groups=None if groups is None else tuple(int(g) for g in groups),
                  **kwargs)


def split_silo(x: np.ndarray, y: np.ndarray, test_fraction: float,
               rng: np.random.Generator):
  """Shuffles one silo and splits it; both parts keep at least one example."""
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  n = len(y)
  if n < 2:
    raise DataError(f"a silo with {n} example(s) cannot be split into train and test")
  num_test = min(max(1, int(round(n * test_fraction))), n - 1)
  order = rng.permutation(n)
  test, train = order[:num_test], order[num_test:]
  return x[train], y[train], x[test], y[test]


def validation_split(data: SiloData, fraction: float, seed):
  """Each silo's *training* examples split again for tuning: (the silos to train a
  trial on, their train arrays the rest and their test arrays `data`'s own;
  validation features per silo; validation labels per silo). `data`'s test split is
  never tuned on (thesis app. B.4 tunes on validation, reports test).

  Every training example goes to validation with probability `fraction`, on its own
  coin (a silo may draw no validation example: its arrays are then empty). Unlike a
  fixed count, independent coins keep the neighbouring relation: adding an example
  leaves every other example where it was, so a trial's DP-SGD and a DP score on
  the validation part see neighbouring inputs and their guarantees compose. Raises
  `DataError` if a silo draws no example to train on."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"fraction must be in (0, 1), got {fraction}")
  rng = np.random.default_rng(seed)
  x_fit, y_fit, x_val, y_val = [], [], [], []
  for k, (x, y) in enumerate(zip(data.x_train, data.y_train)):
    held = rng.random(len(y)) < fraction
    if held.all():
      raise DataError(f"{data.name}: silo {k} drew all its {len(y)} training examples "
                      "for validation; use a smaller fraction")
    x_fit.append(x[~held])
    y_fit.append(y[~held])
    x_val.append(x[held])
    y_val.append(y[held])
  fit = dataclasses.replace(data, name=f"{data.name} (less validation)",
                            x_train=tuple(x_fit), y_train=tuple(y_fit))
  return fit, tuple(x_val), tuple(y_val)


def corrupt_labels(data: SiloData, num_silos: int, factor: float) -> SiloData:
  """`data` with the first `num_silos` silos misbehaving: their training targets
  multiplied by `factor` (regression only), so their updates point elsewhere
  (factor < 0: the opposite way, |factor| times as far). Their test data is left as
  it was; a robustness experiment judges the other, honest silos."""
  if data.task != "regression":
    raise ValueError(f"corrupt_labels scales regression targets; {data.name} is "
                     f"{data.task}")
  if not 0 <= num_silos < data.num_silos:
    raise ValueError(f"num_silos must be in [0, {data.num_silos}) (at least one honest "
                     f"silo); got {num_silos}")
  y_train = tuple(y * np.float32(factor) if k < num_silos else y
                  for k, y in enumerate(data.y_train))
  return dataclasses.replace(data, y_train=y_train)


def standardize(x_train: np.ndarray, x_test: np.ndarray):
  """Standardizes features with the silo's own training mean and std.

  Features constant in the training split are centered and left unscaled (as
  scikit-learn's StandardScaler does), so they become zero.
  """
  mean = x_train.mean(axis=0)
  std = x_train.std(axis=0)
  std = np.where(std > 0, std, 1.0)
  return (x_train - mean) / std, (x_test - mean) / std


def padded_stack(arrays: Sequence, rows: Optional[int] = None) -> np.ndarray:
  """float32 [len(arrays), rows, ...]: the arrays stacked, each zero-padded along its
  first axis to `rows` (default: the longest) — silos of different sizes as one
  tensor (the vectorized backend, batched evaluation)."""
  rows = max(len(a) for a in arrays) if rows is None else rows
  out = np.zeros((len(arrays), rows, *np.shape(arrays[0])[1:]), np.float32)
  for i, a in enumerate(arrays):
    out[i, :len(a)] = a
  return out
