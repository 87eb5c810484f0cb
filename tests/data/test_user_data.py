"""User partitions and image loaders for HyperNetFL: label skew on digits, CIFAR-10's
python batches and TFF's EMNIST SQLite file, both written here in their real format."""

import os
import pickle
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from tff_silo.data import (
    DataError, digits_images, label_skewed_silos, load_cifar10, load_emnist_users)


def test_label_skewed_users_hold_few_classes_and_differ_in_size():
  x, y = digits_images()
  users = label_skewed_silos("digits", x, y, num_classes=10, num_users=30,
                             classes_per_user=2, seed=4)
  assert users.num_silos == 30 and users.feature_shape == (8, 8, 1)
  for train, test in zip(users.y_train, users.y_test):
    assert len(set(train) | set(test)) <= 2
  sizes = users.train_sizes + users.test_sizes
  assert sizes.max() > 1.5 * sizes.min()
  # Every example of a class that some user holds is dealt out exactly once.
  held = set(np.concatenate(users.y_train + users.y_test).astype(int))
  assert sizes.sum() == sum(int((y == c).sum()) for c in held)
  again = label_skewed_silos("digits", x, y, num_classes=10, num_users=30,
                             classes_per_user=2, seed=4)
  assert all(np.array_equal(a, b) for a, b in zip(users.y_train, again.y_train))


def test_label_skew_rejects_more_users_than_the_data_feeds():
  x, y = digits_images()
  with pytest.raises(DataError, match="use fewer users"):
    label_skewed_silos("digits", x[:40], y[:40], num_classes=10, num_users=40,
                       classes_per_user=1)
  with pytest.raises(ValueError, match="classes_per_user must be in"):
    label_skewed_silos("digits", x, y, num_classes=10, num_users=5, classes_per_user=11)


def _write_cifar_batch(path, n, seed):
  rng = np.random.default_rng(seed)
  data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
  with open(path, "wb") as f:
    pickle.dump({b"data": data, b"labels": list(rng.integers(0, 10, n))}, f)
  return data


def test_cifar10_python_batches(tmp_path):
  folder = tmp_path / "cifar-10-batches-py"
  folder.mkdir()
  first = _write_cifar_batch(folder / "data_batch_1", 4, 0)
  for i in range(2, 6):
    _write_cifar_batch(folder / f"data_batch_{i}", 4, i)
  _write_cifar_batch(folder / "test_batch", 3, 9)
  x_train, y_train, x_test, y_test = load_cifar10(str(tmp_path))
  assert x_train.shape == (20, 32, 32, 3) and x_test.shape == (3, 32, 32, 3)
  assert len(y_train) == 20 and y_train.max() < 10
  # Rows are channel-major: the first 1024 bytes are the red plane.
  np.testing.assert_allclose(x_train[0, :, :, 0].ravel(), first[0, :1024] / 255.0)
  np.testing.assert_allclose(x_train[0, 0, 1, 2], first[0, 2048 + 1] / 255.0)
  assert load_cifar10(str(folder))[0].shape == (20, 32, 32, 3)
  os.remove(folder / "test_batch")
  with pytest.raises(DataError, match="CIFAR-10 file not found"):
    load_cifar10(str(tmp_path))


def _example(pixels, label):
  return tf.train.Example(features=tf.train.Features(feature={
      "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=pixels.ravel())),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
  })).SerializeToString()


def test_emnist_users_from_tff_sqlite_file(tmp_path):
  """The layout `tff.simulation.datasets.emnist.load_data` reads from its cache."""
  rng = np.random.default_rng(0)
  db = sqlite3.connect(tmp_path / "emnist_all.sqlite")
  db.execute("CREATE TABLE examples (split_name TEXT, client_id TEXT, "
             "serialized_example_proto BLOB)")
  db.execute("CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, "
             "num_examples INTEGER)")
  sizes = {"w0": 5, "w1": 2, "w2": 4}
  for client, n in sizes.items():
    for split, count in (("all_train", n), ("all_test", 1)):
      db.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (client, split, count))
      for _ in range(count):
        db.execute("INSERT INTO examples VALUES (?, ?, ?)", (
            split, client, _example(rng.random((28, 28), dtype=np.float32),
                                    int(rng.integers(0, 62)))))
  db.commit()
  db.close()
  users = load_emnist_users(str(tmp_path), num_users=2, min_examples=3, seed=0)
  assert users.num_silos == 2 and users.feature_shape == (28, 28, 1)
  assert sorted(users.train_sizes) == [4, 5]   # w1 (2 examples) is dropped
  assert users.num_classes == 62
  with pytest.raises(DataError, match="only 2 writers"):
    load_emnist_users(str(tmp_path), num_users=3, min_examples=3)
