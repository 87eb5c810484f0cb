"""Label-skewed user partitions of a labelled dataset (pFedHN, Shamsian et al. 2021,
sec. 5; Nemala et al. 2023, sec. 4.1: non-iid users of unequal sizes).

Every user draws `classes_per_user` distinct classes at random. The examples of each
class are dealt to the users holding it in random proportions (uniform on
[1 - imbalance, 1 + imbalance] before normalization), so users differ in their
classes and in their sizes. Each user's examples are then split into train and test
at random, so a user is tested on its own distribution.
"""

from __future__ import annotations

import numpy as np

from tff_silo.data.silos import DataError, SiloData, make_silos, split_silo

MIN_EXAMPLES_PER_USER = 2   # one train and one test example


def label_skewed_silos(name: str, x: np.ndarray, y: np.ndarray, *, num_classes: int,
                       num_users: int, classes_per_user: int = 2,
                       imbalance: float = 0.5, test_fraction: float = 0.2,
                       seed: int = 0) -> SiloData:
  """Partitions (x, y) (labels 0..num_classes-1) into `num_users` label-skewed users.

  Raises:
    ValueError: bad arguments.
    DataError: a user would get fewer than 2 examples (too many users for the data).
  """
  if int(num_users) != num_users or num_users < 1:
    raise ValueError(f"num_users must be a positive integer, got {num_users}")
  if not 1 <= classes_per_user <= num_classes:
    raise ValueError(f"classes_per_user must be in [1, {num_classes}], got "
                     f"{classes_per_user}")
  if not 0.0 <= imbalance < 1.0:
    raise ValueError(f"imbalance must be in [0, 1), got {imbalance}")
  y = np.asarray(y).astype(np.int64)
  if len(x) != len(y):
    raise DataError(f"{name}: {len(x)} examples but {len(y)} labels")
  if y.min() < 0 or y.max() >= num_classes:
    raise DataError(f"{name}: labels must lie in [0, {num_classes - 1}]")
  rng = np.random.default_rng(seed)
  user_classes = [rng.choice(num_classes, classes_per_user, replace=False)
                  for _ in range(num_users)]
  members = [[] for _ in range(num_users)]
  for c in range(num_classes):
    holders = [u for u in range(num_users) if c in user_classes[u]]
    if not holders:
      continue
    idx = rng.permutation(np.flatnonzero(y == c))
    shares = rng.uniform(1 - imbalance, 1 + imbalance, len(holders))
    cuts = np.round(np.cumsum(shares) / shares.sum() * len(idx)).astype(int)
    for u, part in zip(holders, np.split(idx, cuts[:-1])):
      members[u].extend(part.tolist())
  parts = ([], [], [], [])
  for u, idx in enumerate(members):
    if len(idx) < MIN_EXAMPLES_PER_USER:
      raise DataError(f"{name}: user {u} gets {len(idx)} example(s) with "
                      f"num_users={num_users}; use fewer users or more classes per user")
    for part, value in zip(parts, split_silo(x[idx], y[idx].astype(np.float32),
                                             test_fraction, rng)):
      part.append(value)
  return make_silos(name, "multiclass", *parts, num_classes=num_classes)
