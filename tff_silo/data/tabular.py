"""Loaders for the tabular cross-silo datasets of the NeurIPS'22 paper (thesis app. B.1).

- School: 139 schools, 28 features, exam scores; 80/20 split per silo; targets scaled
  to (y - 1) / 69 as the paper's code does.
- Vehicle: 23 sensors, 100 features, labels +-1; 75/25 split per silo. Read from the
  paper's `vehicle.mat` (X, Y as (23, 1) cells) or the LEAF-style training JSON.
- GLEAM: 38 wearers, 180 features, labels +-1; 75/25 split. `gleam.mat` holds X, Y as
  (1, 38) cells.
Features are standardized with each silo's own training statistics by default, as
the paper does (`standardize='silo'`, outside a DP guarantee: see
`tff_silo.data.preprocessing`); `standardize='none'` leaves them as read, 'public' maps
School's documented feature ranges to [0, 1].
"""

from __future__ import annotations

import json
import os

import numpy as np
import scipy.io

from tff_silo.data.silos import DataError, SiloData, make_silos, split_silo, standardize
from tff_silo.data.preprocessing import PublicRanges

SCHOOL_FILE = "school.mat"
VEHICLE_MAT_FILE = "vehicle.mat"
VEHICLE_JSON_FILE = "vehicle_train_ditto.json"
GLEAM_FILE = "gleam.mat"

SCHOOL_TEST_FRACTION = 0.2
VEHICLE_TEST_FRACTION = 0.25
GLEAM_TEST_FRACTION = 0.25
# School exam scores lie in [1, 70]; the paper's code maps them to [0, 1].
SCHOOL_SCORE_MIN, SCHOOL_SCORE_MAX = 1.0, 70.0
# School's 28 features: binary indicators (exam year, school gender and denomination,
# student gender, VR band, ethnic group), the school's percentages of pupils with
# free school meals and in VR band 1 (columns 3 and 4, in [0, 100]), and a constant 1.
SCHOOL_PERCENT_COLUMNS = (3, 4)
SCHOOL_NUM_FEATURES = 28
LOADER_STANDARDIZE = ("none", "public", "silo")


def school_public_ranges() -> PublicRanges:
  """School's documented feature ranges (no data needed)."""
  high = np.ones(SCHOOL_NUM_FEATURES)
  high[list(SCHOOL_PERCENT_COLUMNS)] = 100.0
  return PublicRanges(np.zeros(SCHOOL_NUM_FEATURES), high)


def _require_file(path: str) -> str:
  if not os.path.isfile(path):
    raise DataError(f"data file not found: {path}")
  return path


def _load_mat_cells(path: str, expect_axis: int, expect_count=None):
  """Reads X, Y cell arrays laid out along `expect_axis` (0: (K,1), 1: (1,K))."""
  _require_file(path)
  try:
    mat = scipy.io.loadmat(path)
  except Exception as e:  # scipy raises MatReadError, ValueError, IndexError, ...
    raise DataError(f"{path} is not a readable MATLAB file ({type(e).__name__}: "
                    f"{e})") from None
  for key in ("X", "Y"):
    if key not in mat:
      found = sorted(k for k in mat if not k.startswith("__"))
      raise DataError(f"{path} has no variable {key!r} (found {found})")
  cells = []
  for key in ("X", "Y"):
    arr = mat[key]
    if arr.dtype != object or arr.ndim != 2 or arr.shape[1 - expect_axis] != 1:
      layout = "(K, 1)" if expect_axis == 0 else "(1, K)"
      raise DataError(f"{path}: {key} must be a {layout} cell array, got "
                      f"{arr.dtype} array of shape {arr.shape}")
    try:
      cells.append([np.asarray(c, dtype=np.float64) for c in arr.reshape(-1)])
    except (TypeError, ValueError) as e:
      raise DataError(f"{path}: a cell of {key} is not a numeric array ({e})") from None
  xs, ys = cells
  if len(xs) != len(ys):
    raise DataError(f"{path}: X has {len(xs)} silos but Y has {len(ys)}")
  if expect_count is not None and len(xs) != expect_count:
    raise DataError(f"{path}: expected {expect_count} silos, found {len(xs)}")
  for i, (x, y) in enumerate(zip(xs, ys)):
    if x.ndim != 2 or x.shape[0] != y.size:
      raise DataError(f"{path}: silo {i} has features {x.shape} and {y.size} labels")
  return [x.astype(np.float64) for x in xs], [y.reshape(-1).astype(np.float64) for y in ys]


def _split_all(name, task, xs, ys, test_fraction, seed, *, transform_y=None,
               standardize_mode="silo", public_ranges=None):
  if standardize_mode not in LOADER_STANDARDIZE:
    raise ValueError(f"standardize must be one of {LOADER_STANDARDIZE} when loading "
                     f"(dp: tff_silo.data.standardize_silos after loading), got {standardize_mode!r}")
  if standardize_mode == "public" and public_ranges is None:
    raise ValueError(f"{name} has no documented feature ranges: standardize must be "
                     "none, dp or silo")
  rng = np.random.default_rng(seed)
  dims = {x.shape[1] for x in xs}
  if len(dims) > 1:
    raise DataError(f"{name}: silos disagree on the feature dimension: {sorted(dims)}")
  parts = ([], [], [], [])
  for i, (x, y) in enumerate(zip(xs, ys)):
    if len(y) == 0:
      raise DataError(f"{name}: silo {i} is empty")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
      raise DataError(f"{name}: silo {i} contains NaN or infinite values")
    try:
      x_tr, y_tr, x_te, y_te = split_silo(x, y, test_fraction, rng)
    except DataError as e:
      raise DataError(f"{name}: silo {i}: {e}") from None
    if standardize_mode == "silo":
      x_tr, x_te = standardize(x_tr, x_te)
    elif standardize_mode == "public":
      x_tr, x_te = public_ranges.apply(x_tr), public_ranges.apply(x_te)
    if transform_y is not None:
      y_tr, y_te = transform_y(y_tr), transform_y(y_te)
    for part, value in zip(parts, (x_tr, y_tr, x_te, y_te)):
      part.append(value)
  return make_silos(name, task, *parts)


def _check_pm1(name, ys):
  for i, y in enumerate(ys):
    bad = set(np.unique(y)) - {-1.0, 1.0}
    if bad:
      raise DataError(f"{name}: silo {i} has labels {sorted(bad)}; expected +1/-1")


def load_school(data_dir: str, *, seed: int = 0,
                test_fraction: float = SCHOOL_TEST_FRACTION,
                standardize: str = "silo") -> SiloData:
  """School (`school.mat`: X, Y as (1, 139) cells); regression on scaled scores."""
  xs, ys = _load_mat_cells(os.path.join(data_dir, SCHOOL_FILE), expect_axis=1)
  scale = lambda y: (y - SCHOOL_SCORE_MIN) / (SCHOOL_SCORE_MAX - SCHOOL_SCORE_MIN)
  ranges = school_public_ranges() if xs[0].shape[1] == SCHOOL_NUM_FEATURES else None
  return _split_all("school", "regression", xs, ys, test_fraction, seed,
                    transform_y=scale, standardize_mode=standardize,
                    public_ranges=ranges)


def load_gleam(data_dir: str, *, seed: int = 0,
               test_fraction: float = GLEAM_TEST_FRACTION,
               standardize: str = "silo") -> SiloData:
  """GLEAM (`gleam.mat`: X, Y as (1, 38) cells); binary +-1 labels."""
  xs, ys = _load_mat_cells(os.path.join(data_dir, GLEAM_FILE), expect_axis=1)
  _check_pm1("gleam", ys)
  return _split_all("gleam", "binary_pm1", xs, ys, test_fraction, seed,
                    standardize_mode=standardize)


def _load_vehicle_json(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      blob = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f"{path} is not valid JSON: {e}") from None
  except OSError as e:
    raise DataError(f"{path} cannot be read: {e.strerror or e}") from None
  if (not isinstance(blob, dict) or not isinstance(blob.get("users"), list)
      or not isinstance(blob.get("user_data"), dict)):
    raise DataError(f"{path}: expected a LEAF-style object with a 'users' list and a "
                    "'user_data' object")
  xs, ys = [], []
  for user in blob["users"]:
    record = blob["user_data"].get(user) if isinstance(user, str) else None
    if not isinstance(record, dict) or "x" not in record or "y" not in record:
      raise DataError(f"{path}: user {user!r} has no 'x'/'y' record")
    try:
      x = np.asarray(record["x"], dtype=np.float64)
      y = np.asarray(record["y"], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
      raise DataError(f"{path}: user {user!r} has non-numeric or ragged data ({e})") \
          from None
    if len(y) == 0:
      raise DataError(f"{path}: user {user!r} has no examples")
    if x.ndim != 2 or len(x) != len(y):
      raise DataError(f"{path}: user {user!r} has features {x.shape} and {len(y)} labels")
    xs.append(x)
    ys.append(y)
  return xs, ys


def load_vehicle(data_dir: str, *, seed: int = 0,
                 test_fraction: float = VEHICLE_TEST_FRACTION,
                 standardize: str = "silo") -> SiloData:
  """Vehicle from `vehicle.mat` if present, else the LEAF-style training JSON."""
  mat_path = os.path.join(data_dir, VEHICLE_MAT_FILE)
  json_path = os.path.join(data_dir, VEHICLE_JSON_FILE)
  if os.path.isfile(mat_path):
    xs, ys = _load_mat_cells(mat_path, expect_axis=0)
  elif os.path.isfile(json_path):
    xs, ys = _load_vehicle_json(json_path)
  else:
    raise DataError(f"data file not found: neither {mat_path} nor {json_path}")
  _check_pm1("vehicle", ys)
  return _split_all("vehicle", "binary_pm1", xs, ys, test_fraction, seed,
                    standardize_mode=standardize)
