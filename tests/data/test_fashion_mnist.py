"""The Fashion-MNIST loaders on small IDX files the tests write (the real files are
not shipped; `conftest.idx_files`): the IDX reader, rotated & masked silos at a
small scale, label skew."""

import numpy as np
import pytest

from tff_silo import data
from tff_silo.data import DataError


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trips(tmp_path, gz, idx_files):
  _write, _idx = idx_files
  arrays = _write(tmp_path, gz=gz)
  x_train, y_train, x_test, y_test = data.load_fashion_mnist(str(tmp_path))
  np.testing.assert_allclose(x_train, arrays["train-images-idx3-ubyte"] / 255.0, atol=1e-7)
  np.testing.assert_array_equal(y_test, arrays["t10k-labels-idx1-ubyte"])
  assert x_test.shape == (24, 28, 28) and y_train.dtype == np.float32
  big = np.arange(6, dtype=np.int32).reshape(2, 3)
  (tmp_path / "i.idx").write_bytes(_idx(big))
  np.testing.assert_array_equal(data.read_idx(str(tmp_path / "i.idx")), big)


def test_rotated_masked_silos_rotate_groups_and_mask_each_silo(tmp_path, idx_files):
  arrays = idx_files[0](tmp_path)
  silos = data.rotated_masked_fmnist_silos(str(tmp_path), num_silos=4, train_per_silo=20,
                                           test_per_silo=6, mask_probability=0.3, seed=1)
  assert silos.num_silos == 4 and sorted(silos.groups) == [0, 1, 2, 3]
  assert all(len(y) == 20 for y in silos.y_train) and all(len(y) == 6 for y in silos.y_test)
  source = arrays["train-images-idx3-ubyte"] / 255.0
  for k in range(4):
    images = np.concatenate([silos.x_train[k], silos.x_test[k]])[..., 0]
    white = np.all(images == 1.0, axis=0)   # the silo's mask: white in every image
    assert white.any()
    # undoing the rotation finds each training image among the source images
    back = np.rot90(silos.x_train[k][..., 0], k=-silos.groups[k], axes=(1, 2))
    unmasked = ~np.rot90(white, k=-silos.groups[k])
    for image in back[:3]:
      assert np.any(np.all(np.abs(source[:, unmasked] - image[unmasked]) < 1e-6, axis=1))
  masks = [np.all(np.concatenate([silos.x_train[k], silos.x_test[k]])[..., 0] == 1.0,
                  axis=0) for k in range(4)]
  assert len({m.tobytes() for m in masks}) == 4   # every silo its own mask


def test_rotated_users_are_half_turned_a_quarter_and_unmasked(tmp_path, idx_files):
  arrays = idx_files[0](tmp_path, n_train=60, n_test=20)
  users = data.rotated_fmnist_users(str(tmp_path), num_users=6, train_per_user=10,
                                    test_per_user=3, seed=2)
  assert users.name == "fmnist_rotated" and users.num_silos == 6
  assert sorted(users.groups) == [0, 0, 0, 1, 1, 1]
  assert all(len(y) == 10 for y in users.y_train) and all(len(y) == 3 for y in users.y_test)
  source = arrays["train-images-idx3-ubyte"] / 255.0
  seen = []
  for k in range(6):
    # undoing a quarter turn counter-clockwise gives source images, unmasked
    back = np.rot90(users.x_train[k][..., 0], k=-users.groups[k], axes=(1, 2))
    for image, label in zip(back, users.y_train[k]):
      match = np.flatnonzero(np.all(np.abs(source - image) < 1e-6, axis=(1, 2)))
      assert len(match) == 1 and arrays["train-labels-idx1-ubyte"][match[0]] == label
      seen.append(match[0])
  assert len(set(seen)) == 60   # every image dealt once
  with pytest.raises(ValueError, match="multiple of 2"):
    data.rotated_fmnist_users(str(tmp_path), num_users=5)
  with pytest.raises(DataError, match="fewer than 200 silos"):
    data.rotated_fmnist_users(str(tmp_path))


def test_label_skewed_silos_hold_few_classes(tmp_path, idx_files):
  idx_files[0](tmp_path, n_train=400, n_test=100)
  silos = data.label_skewed_fmnist_silos(str(tmp_path), num_silos=6, classes_per_silo=3)
  for y_train, y_test in zip(silos.y_train, silos.y_test):
    assert len(set(np.concatenate([y_train, y_test]))) <= 3


def test_bad_idx_files_are_named(tmp_path, idx_files):
  _write, _idx = idx_files
  _write(tmp_path, gz=False)
  path = tmp_path / "train-labels-idx1-ubyte"
  path.write_bytes(b"\x01\x02\x03\x04")
  with pytest.raises(DataError, match="not an IDX file"):
    data.load_fashion_mnist(str(tmp_path))
  path.write_bytes(_idx(np.zeros(80, np.uint8))[:-3])
  with pytest.raises(DataError, match="data bytes for shape"):
    data.load_fashion_mnist(str(tmp_path))
  _write(tmp_path, gz=False)
  (tmp_path / "t10k-images-idx3-ubyte").unlink()
  with pytest.raises(DataError, match="has no t10k-images-idx3-ubyte"):
    data.load_fashion_mnist(str(tmp_path))
  _write(tmp_path)
  with pytest.raises(DataError, match="fewer than 40 silos"):
    data.rotated_masked_fmnist_silos(str(tmp_path))
