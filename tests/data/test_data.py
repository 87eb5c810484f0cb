import json

import numpy as np
import pytest
import scipy.io
from sklearn.datasets import load_digits

from tff_silo import data
from tff_silo.data import DataError
from tff_silo.data.digits import silo_mask

from tests.matfiles import cells, write_mat


def test_school_real_file(shared_data):
  s = data.load_school(shared_data, seed=0)
  assert s.num_silos == 139 and s.feature_shape == (28,)
  assert s.train_sizes.sum() + s.test_sizes.sum() == 15362
  # 80/20 split of every silo.
  np.testing.assert_allclose(s.test_sizes / (s.train_sizes + s.test_sizes), 0.2, atol=0.03)
  # Scores 1..70 scaled to [0, 1].
  assert min(y.min() for y in s.y_train) >= 0 and max(y.max() for y in s.y_train) <= 1
  # Standardized with each silo's own training statistics.
  np.testing.assert_allclose(s.x_train[5].mean(axis=0), 0.0, atol=1e-5)
  assert s.x_train[5].dtype == np.float32


def test_school_split_is_seeded(shared_data):
  a, b = data.load_school(shared_data, seed=1), data.load_school(shared_data, seed=1)
  c = data.load_school(shared_data, seed=2)
  np.testing.assert_array_equal(a.y_test[0], b.y_test[0])
  assert not np.array_equal(a.y_test[0], c.y_test[0])


def test_vehicle_json_real_file(shared_data):
  v = data.load_vehicle(shared_data, seed=0)
  assert v.num_silos == 23 and v.feature_shape == (100,) and v.task == "binary_pm1"
  assert v.train_sizes.sum() + v.test_sizes.sum() == 1860
  np.testing.assert_allclose(v.test_sizes / (v.train_sizes + v.test_sizes), 0.25, atol=0.1)
  assert set(np.unique(np.concatenate(v.y_train))) == {-1.0, 1.0}


def test_vehicle_mat_and_gleam_layouts(tmp_path):
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 100)) for n in (20, 30, 40)]
  ys = [rng.choice([-1.0, 1.0], size=(len(x), 1)) for x in xs]
  write_mat(tmp_path / "vehicle.mat", xs, ys, axis=0)
  v = data.load_vehicle(str(tmp_path), seed=0)
  assert v.num_silos == 3 and list(v.train_sizes + v.test_sizes) == [20, 30, 40]
  xs = [rng.normal(size=(n, 180)) for n in (12, 16)]
  ys = [rng.choice([-1.0, 1.0], size=(1, len(x))) for x in xs]
  write_mat(tmp_path / "gleam.mat", xs, ys, axis=1)
  g = data.load_gleam(str(tmp_path), seed=0)
  assert g.num_silos == 2 and g.feature_shape == (180,)


@pytest.mark.parametrize("mutate, message", [
    ("missing", "not found"),
    ("layout", "cell array"),
    ("empty", "empty"),
    ("nan", "NaN"),
    ("dims", "disagree"),
    ("no_y", "no variable 'Y'"),
])
def test_bad_school_files(tmp_path, mutate, message):
  rng = np.random.default_rng(0)
  xs = [rng.integers(0, 5, size=(n, 28)).astype(float) for n in (10, 12)]
  ys = [rng.integers(1, 70, size=(1, len(x))).astype(float) for x in xs]
  if mutate == "missing":
    pass
  elif mutate == "no_y":
    scipy.io.savemat(tmp_path / "school.mat", {"X": cells(xs, 1)})
  elif mutate == "layout":
    scipy.io.savemat(tmp_path / "school.mat", {"X": np.zeros((3, 28)), "Y": np.zeros(3)})
  else:
    if mutate == "empty":
      xs[1], ys[1] = np.zeros((0, 28)), np.zeros((1, 0))
    elif mutate == "nan":
      xs[0][3, 4] = np.nan
    elif mutate == "dims":
      xs[1] = xs[1][:, :20]
    write_mat(tmp_path / "school.mat", xs, ys, axis=1)
  with pytest.raises(DataError, match=message):
    data.load_school(str(tmp_path))


def test_bad_vehicle_json(tmp_path):
  with open(tmp_path / "vehicle_train_ditto.json", "w") as f:
    json.dump({"users": ["a"], "user_data": {"a": {"x": [[1.0, 2.0]], "y": [3.0]}}}, f)
  with pytest.raises(DataError, match=r"\+1/-1"):
    data.load_vehicle(str(tmp_path))
  with open(tmp_path / "vehicle_train_ditto.json", "w") as f:
    f.write("{not json")
  with pytest.raises(DataError, match="JSON"):
    data.load_vehicle(str(tmp_path))


def test_make_silos_rejects_infinite_and_mismatched():
  x, y = np.ones((4, 2)), np.ones(4)
  with pytest.raises(DataError, match="infinite"):
    data.make_silos("t", "regression", [x], [np.array([1, 2, np.inf, 4.0])], [x], [y])
  with pytest.raises(DataError, match="feature shape"):
    data.make_silos("t", "regression", [x, np.ones((4, 3))], [y, y], [x, x], [y, y])


def test_digits_groups_rotations_and_masks():
  d = data.load_rotated_masked_digits(num_silos=40, mask_probability=0.0, seed=0)
  assert d.num_silos == 40 and d.feature_shape == (8, 8, 1) and d.num_classes == 10
  assert np.bincount(d.groups).tolist() == [10, 10, 10, 10]
  assert sum(d.train_sizes) + sum(d.test_sizes) == 1797
  # Silos of group g hold load_digits images rotated by g * 90 degrees.
  originals = {im.tobytes() for im in (load_digits().images / 16.0).astype(np.float32)}
  for x, g in zip(d.x_train, d.groups):
    back = np.rot90(x[..., 0], k=-g, axes=(1, 2))
    assert all(np.ascontiguousarray(im).tobytes() in originals for im in back)
  full = data.load_rotated_masked_digits(num_silos=40, mask_probability=1.0, seed=0)
  assert all(np.all(x == 1.0) for x in full.x_train)  # every patch white


def test_silo_mask_probability():
  rng = np.random.default_rng(0)
  masks = [silo_mask(8, 2, 0.3, rng) for _ in range(2000)]
  frac = np.mean([m.mean() for m in masks])
  # Each of 16 cells is white w.p. 0.3; the mean of 2000 masks has std ~0.0026.
  assert abs(frac - 0.3) < 0.015
  assert all(np.array_equal(m[::2, ::2], m[1::2, 1::2]) for m in masks[:20])


def test_synthetic_generators():
  m = data.mean_estimation_silos(num_silos=5, num_examples=40, seed=0)
  assert m.num_silos == 5 and m.feature_shape == (1,)
  c = data.heterogeneous_linear_silos(num_silos=3, classification=True, seed=0)
  assert c.task == "binary_pm1"
  with pytest.raises(ValueError, match="num_silos"):
    data.mean_estimation_silos(num_silos=0)


def test_corrupt_labels_scales_the_first_silos_training_targets_only():
  silos = data.heterogeneous_linear_silos(num_silos=5, num_examples=20, seed=0)
  bad = data.corrupt_labels(silos, 2, -10.0)
  for k in range(5):
    factor = -10.0 if k < 2 else 1.0
    np.testing.assert_array_equal(bad.y_train[k], silos.y_train[k] * np.float32(factor))
    np.testing.assert_array_equal(bad.y_test[k], silos.y_test[k])
    np.testing.assert_array_equal(bad.x_train[k], silos.x_train[k])
  with pytest.raises(ValueError, match=r"num_silos must be in \[0, 5\)"):
    data.corrupt_labels(silos, 5, -10.0)
  with pytest.raises(ValueError, match="scales regression targets"):
    data.corrupt_labels(data.load_rotated_masked_digits(num_silos=4, seed=0), 1, -1.0)
