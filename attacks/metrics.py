"""How close a reconstruction is: MSE, PSNR and SSIM per image (`tf.image`), label
accuracy, and the matching of a reconstructed batch to its ground truth.

Images are compared in [0, 1]: reconstructions are clipped to that range first, and
PSNR and SSIM use max_val = 1. SSIM's Gaussian window is 11 pixels wide (sigma 1.5),
narrowed to the image for images smaller than that (the 8x8 digits).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from scipy import optimize

SSIM_WINDOW = 11


def _pair(truth, reconstruction):
  truth = tf.convert_to_tensor(truth, tf.float32)
  reconstruction = tf.clip_by_value(tf.convert_to_tensor(reconstruction, tf.float32),
                                    0.0, 1.0)
  if truth.shape != reconstruction.shape or len(truth.shape) != 4:
    raise ValueError(f"truth and reconstruction must both be [batch, H, W, C] images "
                     f"of one shape, got {truth.shape} and {reconstruction.shape}")
  return truth, reconstruction


def mse(truth, reconstruction) -> np.ndarray:
  """Mean squared error of each image pair, [batch]."""
  truth, reconstruction = _pair(truth, reconstruction)
  return tf.reduce_mean(tf.square(truth - reconstruction), axis=[1, 2, 3]).numpy()


def psnr(truth, reconstruction) -> np.ndarray:
  """Peak signal-to-noise ratio in dB, 10 log10(1 / MSE), [batch] (inf if equal)."""
  return tf.image.psnr(*_pair(truth, reconstruction), max_val=1.0).numpy()


def ssim(truth, reconstruction) -> np.ndarray:
  """Structural similarity (Wang et al. 2004) of each pair, [batch], at most 1."""
  truth, reconstruction = _pair(truth, reconstruction)
  window = min(SSIM_WINDOW, *truth.shape[1:3])
  return tf.image.ssim(truth, reconstruction, max_val=1.0, filter_size=window).numpy()


def label_accuracy(true_labels, labels) -> float:
  """Fraction of inferred labels equal to the true ones."""
  true_labels, labels = np.asarray(true_labels), np.asarray(labels)
  if true_labels.shape != labels.shape:
    raise ValueError(f"label shapes differ: {true_labels.shape} and {labels.shape}")
  return float(np.mean(true_labels == labels))


def match(truth, reconstruction) -> np.ndarray:
  """The order of `reconstruction` that pairs it with `truth` at the least total MSE
  (a batch is recovered as a set): `reconstruction[order][i]` goes with `truth[i]`."""
  truth, reconstruction = _pair(truth, reconstruction)
  flat_t = tf.reshape(truth, [truth.shape[0], -1])
  flat_r = tf.reshape(reconstruction, [reconstruction.shape[0], -1])
  cost = tf.reduce_mean(tf.square(flat_t[:, None] - flat_r[None]), axis=-1).numpy()
  _, order = optimize.linear_sum_assignment(cost)
  return order


@dataclasses.dataclass(frozen=True)
class Scores:
  """Per-image scores of a matched reconstruction and its label accuracy; `order`
  is the matching (`reconstruction[order][i]` was scored against `truth[i]`)."""

  order: np.ndarray
  mse: np.ndarray
  psnr: np.ndarray
  ssim: np.ndarray
  label_accuracy: float


def score(truth, true_labels, reconstruction, labels) -> Scores:
  """Matches the batch to the truth, then scores images and labels."""
  order = match(truth, reconstruction)
  reconstruction = np.asarray(reconstruction)[order]
  labels = np.asarray(labels)[order]
  return Scores(order=order, mse=mse(truth, reconstruction),
                psnr=psnr(truth, reconstruction),
                ssim=ssim(truth, reconstruction),
                label_accuracy=label_accuracy(true_labels, labels))
