"""Rotated & masked digits: the thesis' Rotated & Masked MNIST (app. B.1) built offline.

scikit-learn's bundled `load_digits` (1,797 8x8 images, 10 classes) is shuffled and
split evenly into K silos; the silos are split at random into 4 groups rotated by
0/90/180/270 degrees (the true clusters); every silo then draws its own mask: each
cell of a grid of non-overlapping `patch_size` x `patch_size` patches is painted white
with probability `mask_probability`, the same mask for all images of the silo.
"""

from __future__ import annotations

import numpy as np

from tff_silo.data.silos import SiloData, make_silos, split_silo

NUM_ROTATION_GROUPS = 4
DIGITS_MAX_PIXEL = 16.0   # load_digits pixel values lie in 0..16
WHITE = 1.0               # pixels are scaled to [0, 1]
NUM_CLASSES = 10


def silo_mask(image_size: int, patch_size: int, probability: float,
              rng: np.random.Generator) -> np.ndarray:
  """A boolean (image_size, image_size) mask of random white patches."""
  cells = image_size // patch_size
  chosen = rng.random((cells, cells)) < probability
  mask = np.zeros((image_size, image_size), dtype=bool)
  mask[:cells * patch_size, :cells * patch_size] = np.kron(
      chosen, np.ones((patch_size, patch_size), dtype=bool))
  return mask


def digits_images():
  """(x [1797, 8, 8, 1] in [0, 1], y [1797] int): scikit-learn's digits, offline."""
  # Imported here: scikit-learn takes ~0.4 s to import, and only digits runs need it.
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  digits = load_digits()
  x = (digits.images.astype(np.float32) / DIGITS_MAX_PIXEL)[..., None]
  return x, digits.target.astype(np.int64)


MASK_PROBABILITY = 0.1   # each white 2x2 patch's probability (thesis sec. 1.5)


def load_rotated_masked_digits(*, num_silos: int = 40,
                               mask_probability: float = MASK_PROBABILITY,
                               patch_size: int = 2, test_fraction: float = 0.2,
                               seed: int = 0) -> SiloData:
  """Builds the silos; `groups` holds each silo's rotation group (0..3)."""
  if num_silos < NUM_ROTATION_GROUPS:
    raise ValueError(f"num_silos must be at least {NUM_ROTATION_GROUPS}, got {num_silos}")
  if not 0.0 <= mask_probability <= 1.0:
    raise ValueError(f"mask_probability must be in [0, 1], got {mask_probability}")
  if patch_size < 1:
    raise ValueError(f"patch_size must be >= 1, got {patch_size}")
  images, labels = digits_images()
  images, labels = images[..., 0], labels.astype(np.float32)
  if num_silos > len(labels) // 2:
    raise ValueError(f"num_silos must be at most {len(labels) // 2}, got {num_silos}")
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(labels))
  groups = rng.permutation(np.arange(num_silos) % NUM_ROTATION_GROUPS)
  parts = ([], [], [], [])
  for silo, idx in enumerate(np.array_split(order, num_silos)):
    x = np.rot90(images[idx], k=int(groups[silo]), axes=(1, 2)).copy()
    x[:, silo_mask(x.shape[1], patch_size, mask_probability, rng)] = WHITE
    split = split_silo(x[..., None], labels[idx], test_fraction, rng)
    for part, value in zip(parts, split):
      part.append(value)
  return make_silos("digits", "multiclass", *parts, num_classes=NUM_CLASSES,
                    groups=groups)
