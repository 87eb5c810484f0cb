"""Linear models of the paper (thesis app. B.1): regression for School, linear SVMs
for Vehicle and GLEAM, and logistic regression. Weights (w [d], b []) start at zero,
as in the paper's code."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo.models import functional as F


def _linear(name, dim, loss_fn, metric, predict_fn=lambda o: o):
  if dim < 1:
    raise ValueError(f"input dimension must be >= 1, got {dim}")

  def init_fn(seed):
    del seed  # zero initialization
    return (np.zeros([dim], np.float32), np.zeros([], np.float32))

  def apply_fn(weights, x):
    w, b = weights
    return tf.linalg.matvec(x, w) + b

  def per_example_gradients_fn(weights, x, y):
    # loss_i depends on the weights only through o_i = x_i.w + b, so its gradient
    # is (d loss_i / d o_i) * (x_i, 1); one tape over the batch gives every d/d o_i.
    outputs = apply_fn(weights, x)
    with tf.GradientTape() as tape:
      tape.watch(outputs)
      losses = loss_fn(outputs, y)
    slopes = tape.gradient(losses, outputs)
    return [slopes[:, None] * x, slopes]

  return F.SiloModel(name=name, weight_shapes=((dim,), ()), init_fn=init_fn,
                     apply_fn=apply_fn, loss_fn=loss_fn, metric=metric,
                     predict_fn=predict_fn,
                     per_example_gradients_fn=per_example_gradients_fn)


def linear_regression(dim: int) -> F.SiloModel:
  return _linear("linear_regression", dim, F.squared_loss, "mse")


def linear_svm(dim: int) -> F.SiloModel:
  return _linear("linear_svm", dim, F.hinge_loss, "accuracy", F.sign_prediction)


def logistic_regression(dim: int) -> F.SiloModel:
  return _linear("logistic_regression", dim, F.binary_cross_entropy, "accuracy",
                 F.threshold_prediction)
