"""The paper's small CNN (thesis app. B.1): Conv 3x3 (32) - ReLU - MaxPool 2x2/2 -
Conv 3x3 (64) - ReLU - MaxPool 2x2/2 - Linear. The paper uses no padding on 28x28 and
32x32 inputs; for inputs too small for two unpadded stages (the 8x8 digits) the
convolutions use SAME padding. Weights use Glorot-uniform initialization, biases zero.

With `hidden` set, a ReLU dense layer of that width precedes the output layer: the
LeNet-style target of HyperNetFL (two conv + two dense layers, Shamsian et al. 2021;
Nemala et al. 2023 sec. 4.2).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo.models import functional as F

KERNEL = 3
POOL = 2


def _stage_out(size: int, padding: str) -> int:
  conv = size if padding == "SAME" else size - KERNEL + 1
  return conv // POOL


def _padding_for(size: int) -> str:
  valid = _stage_out(_stage_out(size, "VALID"), "VALID")
  return "VALID" if valid >= 1 else "SAME"


def small_cnn(input_shape, num_classes: int, *, channels=(32, 64),
              hidden: int | None = None) -> F.SiloModel:
  """Builds the CNN for `input_shape` = (H, W, C) images and `num_classes` outputs;
  `hidden` adds a dense ReLU layer of that width before the output layer."""
  if len(input_shape) != 3 or min(input_shape) < 1:
    raise ValueError(f"input_shape must be (height, width, channels), got {input_shape}")
  if num_classes < 2:
    raise ValueError(f"num_classes must be >= 2, got {num_classes}")
  if hidden is not None and hidden < 1:
    raise ValueError(f"hidden must be a positive width or None, got {hidden}")
  h, w, c = input_shape
  padding = _padding_for(min(h, w))
  out_h = _stage_out(_stage_out(h, padding), padding)
  out_w = _stage_out(_stage_out(w, padding), padding)
  c1, c2 = channels
  flat = out_h * out_w * c2
  dense = ((flat, num_classes), (num_classes,)) if hidden is None else (
      (flat, hidden), (hidden,), (hidden, num_classes), (num_classes,))
  shapes = ((KERNEL, KERNEL, c, c1), (c1,), (KERNEL, KERNEL, c1, c2), (c2,)) + dense

  def init_fn(seed):
    rng = np.random.default_rng(seed)
    weights = []
    for shape in shapes:
      if len(shape) == 1:
        weights.append(np.zeros(shape, np.float32))
        continue
      fan_in = int(np.prod(shape[:-1]))
      fan_out = shape[-1] * (int(np.prod(shape[:-2])) if len(shape) == 4 else 1)
      limit = np.sqrt(6.0 / (fan_in + fan_out))
      weights.append(rng.uniform(-limit, limit, shape).astype(np.float32))
    return tuple(weights)

  def apply_fn(weights, x):
    k1, b1, k2, b2, *dense_weights = weights
    y = tf.nn.relu(tf.nn.conv2d(x, k1, 1, padding) + b1)
    y = tf.nn.max_pool2d(y, POOL, POOL, "VALID")
    y = tf.nn.relu(tf.nn.conv2d(y, k2, 1, padding) + b2)
    y = tf.nn.max_pool2d(y, POOL, POOL, "VALID")
    y = tf.reshape(y, [-1, flat])
    for i in range(0, len(dense_weights) - 2, 2):
      y = tf.nn.relu(tf.matmul(y, dense_weights[i]) + dense_weights[i + 1])
    return tf.matmul(y, dense_weights[-2]) + dense_weights[-1]

  return F.SiloModel(name="small_cnn" if hidden is None else "lenet", weight_shapes=shapes, init_fn=init_fn,
                     apply_fn=apply_fn, loss_fn=F.softmax_cross_entropy,
                     metric="accuracy", predict_fn=F.argmax_prediction)
