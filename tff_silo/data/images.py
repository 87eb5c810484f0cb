"""Real image datasets for user partitions: CIFAR-10 and EMNIST (the offline digits
are `tff_silo.data.digits.digits_images`).

- `load_cifar10`: the CIFAR-10 python distribution (`cifar-10-batches-py`: pickled
  `data_batch_1..5` and `test_batch`), from `data_dir` or, without one, from Keras'
  cache (`~/.keras/datasets`).
- `load_emnist_users`: FEMNIST's writers as users, read with TFF's
  `tff.simulation.datasets.emnist.load_data(cache_dir=...)` from `emnist_all.sqlite`
  in `cache_dir` (default `~/.tff`). Writers with fewer than `min_examples` training
  examples are dropped (Nemala et al. drop those under 30).
Neither downloads: a missing file is a `DataError` saying where it must be and where
to get it.
"""

from __future__ import annotations

import os
import pickle
from typing import Optional

import numpy as np

from tff_silo.data.silos import DataError, SiloData, make_silos

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
KERAS_CACHE = os.path.join("~", ".keras", "datasets")
EMNIST_FILE = "emnist_all.sqlite"
EMNIST_URL = "https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma"
TFF_CACHE = os.path.join("~", ".tff")
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_SHAPE = (3, 32, 32)    # channel-major rows of the pickled arrays
CIFAR10_CLASSES = 10
EMNIST_CLASSES = {True: 10, False: 62}
FEMNIST_MIN_EXAMPLES = 30


def _cifar_batch(path):
  try:
    with open(path, "rb") as f:
      batch = pickle.load(f, encoding="bytes")
  except FileNotFoundError:
    raise DataError(f"CIFAR-10 file not found: {path} (get {CIFAR10_URL} and unpack "
                    f"it there)") from None
  except OSError as e:
    raise DataError(f"{path} cannot be read: {e.strerror or e}") from None
  except Exception as e:  # unpickling garbage raises anything from UnpicklingError on
    raise DataError(f"{path} is not a CIFAR-10 python batch ({type(e).__name__}: "
                    f"{e})") from None
  if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
    raise DataError(f"{path} lacks the b'data' and b'labels' entries of a CIFAR-10 batch")
  data = np.asarray(batch[b"data"], dtype=np.uint8)
  if data.ndim != 2 or data.shape[1] != int(np.prod(CIFAR10_SHAPE)):
    raise DataError(f"{path}: data has shape {data.shape}, expected (n, 3072)")
  x = data.reshape(-1, *CIFAR10_SHAPE).transpose(0, 2, 3, 1).astype(np.float32) / 255.0
  return x, np.asarray(batch[b"labels"], dtype=np.int64)


def load_cifar10(data_dir: Optional[str] = None):
  """(x_train, y_train, x_test, y_test); images [n, 32, 32, 3] in [0, 1].

  Args:
    data_dir: a folder holding `cifar-10-batches-py/` (or that folder itself); None
      reads Keras' cache, `~/.keras/datasets`.
  """
  if data_dir is None:
    data_dir = os.path.expanduser(KERAS_CACHE)
  folder = data_dir if os.path.basename(os.path.normpath(data_dir)) == CIFAR10_DIR \
      else os.path.join(data_dir, CIFAR10_DIR)
  train = [_cifar_batch(os.path.join(folder, name)) for name in CIFAR10_TRAIN_FILES]
  x_test, y_test = _cifar_batch(os.path.join(folder, CIFAR10_TEST_FILE))
  return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]),
          x_test, y_test)


def _client_arrays(client_data, client_id):
  pixels, labels = [], []
  for element in client_data.create_tf_dataset_for_client(client_id):
    pixels.append(element["pixels"].numpy())
    labels.append(int(element["label"].numpy()))
  return np.asarray(pixels, np.float32), np.asarray(labels, np.float32)


def load_emnist_users(cache_dir: Optional[str] = None, *, num_users: int,
                      only_digits: bool = False,
                      min_examples: int = FEMNIST_MIN_EXAMPLES,
                      seed: int = 0) -> SiloData:
  """`num_users` FEMNIST writers (random among those with >= `min_examples` training
  examples and at least one test example), images [n, 28, 28, 1]."""
  if int(num_users) != num_users or num_users < 1:
    raise ValueError(f"num_users must be a positive integer, got {num_users}")
  cache_dir = os.path.expanduser(TFF_CACHE if cache_dir is None else cache_dir)
  path = os.path.join(cache_dir, EMNIST_FILE)
  if not os.path.isfile(path):
    raise DataError(f"EMNIST file not found: {path} (get {EMNIST_URL}, unpack it with "
                    f"`unxz` into {cache_dir})")
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  try:
    train, test = tff.simulation.datasets.emnist.load_data(only_digits=only_digits,
                                                           cache_dir=cache_dir)
  except Exception as e:  # sqlite3 or TF errors on a damaged file
    raise DataError(f"{path} is not TFF's EMNIST database ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''})") from None
  rng = np.random.default_rng(seed)
  candidates = rng.permutation(sorted(set(train.client_ids) & set(test.client_ids)))
  parts = ([], [], [], [])
  for client_id in candidates:
    x_tr, y_tr = _client_arrays(train, client_id)
    if len(y_tr) < min_examples:
      continue
    x_te, y_te = _client_arrays(test, client_id)
    if len(y_te) == 0:
      continue
    for part, value in zip(parts, (x_tr[..., None], y_tr, x_te[..., None], y_te)):
      part.append(value)
    if len(parts[0]) == num_users:
      break
  if len(parts[0]) < num_users:
    raise DataError(f"EMNIST has only {len(parts[0])} writers with >= {min_examples} "
                    f"training examples, num_users={num_users} requested")
  return make_silos("femnist", "multiclass", *parts,
                    num_classes=EMNIST_CLASSES[only_digits])
