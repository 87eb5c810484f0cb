"""Rotated & masked Fashion-MNIST at the thesis' scale (app. B.1, Table B.1: 40 silos
of 1,500 train / 250 test 28x28 images in 4 rotation groups, silo-specific masks of
2x2 white patches), users rotated or not (Galli et al. sec. 5.3's rotated FEMNIST
writers), and label-skewed Fashion-MNIST silos (the heterogeneous CIFAR-10 stand-in of
thesis Fig. 1.3(d): every silo holds a few random classes).

The images are read from the four IDX files of Fashion-MNIST (`train-images-idx3-ubyte`,
`train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each
optionally gzipped), e.g. from Debian's `dataset-fashion-mnist` package; nothing is
downloaded.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from tff_silo.data.digits import NUM_ROTATION_GROUPS, WHITE, silo_mask
from tff_silo.data.partition import label_skewed_silos
from tff_silo.data.silos import DataError, SiloData, make_silos

FILES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
         "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
NUM_CLASSES = 10
MAX_PIXEL = 255.0
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
              0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
  """The array of an IDX file (LeCun's format: two zero bytes, a type code, the number
  of dimensions, each dimension as a big-endian int32, the data), gzipped or not."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
    raise DataError(f"{path} is not an IDX file (bad magic number)")
  ndim = raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise DataError(f"{path}: the IDX header is cut off")
  shape = tuple(int(d) for d in np.frombuffer(raw, ">i4", ndim, 4))
  dtype = np.dtype(_IDX_TYPES[raw[2]])
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) - header != expected:
    raise DataError(f"{path}: {len(raw) - header} data bytes for shape {shape}, "
                    f"expected {expected}")
  return np.frombuffer(raw, dtype, offset=header).reshape(shape)


def _find(data_dir: str, stem: str) -> str:
  for name in (stem, stem + ".gz"):
    path = os.path.join(data_dir, name)
    if os.path.isfile(path):
      return path
  raise DataError(f"{data_dir} has no {stem} (or {stem}.gz): give the folder with "
                  "Fashion-MNIST's IDX files")


def load_fashion_mnist(data_dir: str):
  """(x_train, y_train, x_test, y_test): images [n, 28, 28] in [0, 1] (float32) and
  labels 0..9 (float32) of Fashion-MNIST's train and test sets."""
  arrays = {part: read_idx(_find(data_dir, stem)) for part, stem in FILES.items()}
  for split in ("train", "test"):
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
      raise DataError(f"{data_dir}: {split} images {x.shape} and labels {y.shape} do "
                      "not form (n, rows, cols) and (n,)")
    if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
      raise DataError(f"{data_dir}: {split} labels outside 0..{NUM_CLASSES - 1}")
  return (arrays["x_train"].astype(np.float32) / MAX_PIXEL,
          arrays["y_train"].astype(np.float32),
          arrays["x_test"].astype(np.float32) / MAX_PIXEL,
          arrays["y_test"].astype(np.float32))


def rotated_masked_fmnist_silos(data_dir: str, *, num_silos: int = 40,
                                train_per_silo: int = 1500, test_per_silo: int = 250,
                                mask_probability: float = 0.1, patch_size: int = 2,
                                seed: int = 0) -> SiloData:
  """Thesis app. B.1 on Fashion-MNIST: the train and test images shuffled and dealt
  `train_per_silo` / `test_per_silo` to each silo, the silos split at random into 4
  equal rotation groups (0/90/180/270 degrees; `groups`), and each silo's own mask of
  `patch_size` x `patch_size` white patches (each with `mask_probability`) applied
  to all its images."""
  return _rotated_silos("fmnist", data_dir, num_silos, train_per_silo, test_per_silo,
                        NUM_ROTATION_GROUPS, (mask_probability, patch_size), seed)


def rotated_fmnist_users(data_dir: str, *, num_users: int = 200,
                         train_per_user: int = 250, test_per_user: int = 40,
                         seed: int = 0) -> SiloData:
  """Galli et al. sec. 5.3's rotated FEMNIST writers on Fashion-MNIST: the images
  dealt `train_per_user` / `test_per_user` to each user, and half the users, chosen at
  random, see theirs rotated 90 degrees counter-clockwise (group 1; the paper draws
  Bernoulli(0.5) per user, here the halves are equal); no masks."""
  return _rotated_silos("fmnist_rotated", data_dir, num_users, train_per_user,
                        test_per_user, 2, None, seed)


def _rotated_silos(name, data_dir, num_silos, train_per_silo, test_per_silo,
                   rotation_groups, masks, seed) -> SiloData:
  """Images dealt to silos in `rotation_groups` equal groups (group g rotated g x 90
  degrees); `masks` = (probability, patch size) of each silo's white patches, or
  None."""
  if num_silos < rotation_groups or num_silos % rotation_groups:
    raise ValueError(f"num_silos must be a positive multiple of {rotation_groups}, "
                     f"got {num_silos}")
  if train_per_silo < 1 or test_per_silo < 1:
    raise ValueError("train_per_silo and test_per_silo must be >= 1")
  x_train, y_train, x_test, y_test = load_fashion_mnist(data_dir)
  for split, n, per in (("train", len(y_train), train_per_silo),
                        ("test", len(y_test), test_per_silo)):
    if n < num_silos * per:
      raise DataError(f"{data_dir}: {n} {split} images, fewer than {num_silos} silos "
                      f"x {per}")
  rng = np.random.default_rng(seed)
  train_order, test_order = rng.permutation(len(y_train)), rng.permutation(len(y_test))
  groups = rng.permutation(np.arange(num_silos) % rotation_groups)
  parts = ([], [], [], [])
  for silo in range(num_silos):
    mask = None if masks is None else silo_mask(x_train.shape[1], masks[1], masks[0], rng)
    for i, (x, y, order, per) in enumerate(((x_train, y_train, train_order, train_per_silo),
                                            (x_test, y_test, test_order, test_per_silo))):
      idx = order[silo * per:(silo + 1) * per]
      images = np.rot90(x[idx], k=int(groups[silo]), axes=(1, 2)).copy()
      if mask is not None:
        images[:, mask] = WHITE
      parts[2 * i].append(images[..., None])
      parts[2 * i + 1].append(y[idx])
  return make_silos(name, "multiclass", *parts, num_classes=NUM_CLASSES, groups=groups)


def label_skewed_fmnist_silos(data_dir: str, *, num_silos: int = 30,
                              classes_per_silo: int = 5, seed: int = 0) -> SiloData:
  """Fashion-MNIST (train and test images pooled) dealt to `num_silos` silos of
  `classes_per_silo` random classes each (`data.label_skewed_silos`): thesis Fig.
  1.3(d)'s heterogeneous CIFAR-10 (30 silos, 5 classes each) on images this library
  can read offline."""
  x_train, y_train, x_test, y_test = load_fashion_mnist(data_dir)
  x = np.concatenate([x_train, x_test])[..., None]
  y = np.concatenate([y_train, y_test])
  return label_skewed_silos("fmnist_hetero", x, y, num_classes=NUM_CLASSES,
                            num_users=num_silos, classes_per_user=classes_per_silo,
                            seed=seed)
