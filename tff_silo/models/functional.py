"""Functional models: weights are a tuple of float32 tensors, so TFF types, DP-SGD
and aggregation treat every model alike.

A `SiloModel` gives the initial weights, the forward pass, the per-example training
loss and the evaluation metric. Losses follow the paper's code (thesis app. B):
0.5 * squared error for regression, hinge for linear SVMs (labels +-1), binary
cross-entropy for logistic regression (labels 0/1), softmax cross-entropy for CNNs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

METRICS = ("mse", "accuracy")


@dataclasses.dataclass(frozen=True)
class SiloModel:
  """A model as pure functions of its weights.

  Attributes:
    name: model name.
    weight_shapes: shape of every weight tensor, in order.
    init_fn: `seed -> tuple of np.float32 arrays` with `weight_shapes`.
    apply_fn: `(weights, x) -> outputs` (`[n]` for one output, `[n, C]` for C).
    loss_fn: `(outputs, y) -> [n]` per-example training loss.
    metric: `mse` (lower is better) or `accuracy` (higher is better).
    predict_fn: `outputs -> predictions` comparable to labels (for accuracy).
    per_example_gradients_fn: optional `(weights, x, y) -> per-example gradients`
      (one tensor per weight, leading axis the examples), a faster closed form of
      what DP-SGD otherwise computes with `tf.vectorized_map`.
    mean_transform: optional `mean loss -> objective`: the training objective is
      this function of the mean per-example loss, not the mean itself (Galli et
      al.'s RMSE, eq. 10: `root`). Such an objective is not a sum over examples,
      so DP-SGD cannot train it.
    stacked_apply_fn: optional `(weights [S, ...], x [S, b, ...]) -> outputs [S, b,
      ...]`: S models (silos, or one copy per example) applied at once, equal to
      `apply_fn` on each; the vectorized backend uses it where `tf.vectorized_map`
      over per-silo weights would be slow (convolutions).
    stacked_per_example_gradients_fn: optional `(weights [S, ...], x [S, b, ...],
      y [S, b]) -> per-example gradients`, one per weight: a tensor [S, b, *shape]
      or a `privacy.dp_sgd.OuterProduct` (a dense kernel's inputs [S, b, in] and
      output gradients [S, b, out]; a convolution's patches [S, b, T, in] and
      output gradients [S, b, T, out]); S models' forward passes with b examples
      each (GEMM-sized), each example's gradient from its layers' inputs and output
      gradients. DP-SGD uses it on both backends.
    linear_form_fn: optional `(weights, x, y) -> (features [m, d], slopes [m])` of
      a linear model (outputs o_i = features_i . w + b, weights (w [d], b []) or
      (w,)): each example's gradient is slope_i (features_i, 1), slope_i = d loss_i
      / d o_i, which DP-SGD clips and sums without forming it
      (`privacy.dp_sgd.clipped_linear_sums`) on both backends. `weights` are one
      model's, or one per example ([m, d], [m]: each example its silo's).
  """

  name: str
  weight_shapes: Tuple[tuple, ...]
  init_fn: Callable[[int], tuple]
  apply_fn: Callable
  loss_fn: Callable
  metric: str
  predict_fn: Callable = lambda outputs: outputs
  per_example_gradients_fn: Optional[Callable] = None
  mean_transform: Optional[Callable] = None
  stacked_apply_fn: Optional[Callable] = None
  stacked_per_example_gradients_fn: Optional[Callable] = None
  linear_form_fn: Optional[Callable] = None

  def __post_init__(self):
    if self.metric not in METRICS:
      raise ValueError(f"metric must be one of {METRICS}, got {self.metric!r}")

  @property
  def computation_key(self) -> tuple:
    """What the model computes: its fields, functions by their code (a fresh
    `linear_regression(d)` is the same model), for sharing traced functions."""
    return tuple(getattr(value, "__code__", value)
                 for value in (getattr(self, f.name) for f in dataclasses.fields(self)))

  @property
  def num_parameters(self) -> int:
    return int(sum(np.prod(s, dtype=np.int64) for s in self.weight_shapes))

  def initial_weights(self, seed: int = 0) -> tuple:
    return tuple(np.asarray(w, np.float32) for w in self.init_fn(seed))

  def per_example_loss(self, weights, x, y):
    return self.loss_fn(self.apply_fn(weights, x), y)

  def batch_loss(self, weights, x, y, mask=None):
    """The training objective on a batch (`mask` [n] in {0, 1}: its real examples,
    when it is padded)."""
    return self.objective(self.per_example_loss(weights, x, y), mask)

  def objective(self, losses, mask=None):
    """The training objective of per-example losses [..., n] (`mask`: the real
    ones): their mean over the last axis, or `mean_transform` of it."""
    mean = masked_mean(losses, mask)
    return mean if self.mean_transform is None else self.mean_transform(mean)

  def metric_values(self, weights, x, y):
    """Per-example squared error (`mse`) or correctness in {0, 1} (`accuracy`)."""
    return self.metric_of(self.apply_fn(weights, x), y)

  def metric_of(self, outputs, y):
    """`metric_values` from the model's outputs (any leading axes)."""
    if self.metric == "mse":
      return tf.square(outputs - y)
    return tf.cast(tf.equal(self.predict_fn(outputs), y), tf.float32)


def linear_form_gradients(linear_form_fn):
  """The `per_example_gradients_fn` of a model with a `linear_form_fn`: its
  per-example gradients slope_i (features_i, 1), formed (no bias: the first)."""
  def per_example_gradients_fn(weights, x, y):
    features, slopes = linear_form_fn(weights, x, y)
    return [slopes[:, None] * features, slopes][:len(weights)]
  return per_example_gradients_fn


def squared_loss(outputs, y):
  return 0.5 * tf.square(outputs - y)


def squared_error(outputs, y):
  return tf.square(outputs - y)


def masked_mean(losses, mask=None):
  """The mean of per-example losses over the last axis, over the real examples only
  when the batch is padded (`mask` in {0, 1})."""
  if mask is None:
    return tf.reduce_mean(losses, axis=-1)
  return tf.reduce_sum(mask * losses, axis=-1) / tf.reduce_sum(mask, axis=-1)


def root(mean_loss):
  """sqrt(mean loss): with `squared_error`, the RMSE of Galli et al. eq. 10."""
  return tf.sqrt(mean_loss + 1e-12)


def hinge_loss(outputs, y):
  return tf.nn.relu(1.0 - y * outputs)


def binary_cross_entropy(outputs, y):
  return tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=outputs)


def softmax_cross_entropy(outputs, y):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(y, tf.int32), logits=outputs)


def sign_prediction(outputs):
  return tf.where(outputs >= 0.0, 1.0, -1.0)


def threshold_prediction(outputs):
  return tf.cast(outputs >= 0.0, tf.float32)


def argmax_prediction(outputs):
  return tf.cast(tf.argmax(outputs, axis=-1), tf.float32)
