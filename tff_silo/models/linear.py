"""Linear models of the paper (thesis app. B.1): regression for School, linear SVMs
for Vehicle and GLEAM, and logistic regression. Weights (w [d], b []) start at zero,
as in the paper's code; `bias=False` drops b and `objective="rmse"` trains the root
mean squared error (Galli et al.'s y = x^T theta and eq. 10)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo.models import functional as F


def _linear(name, dim, loss_fn, metric, predict_fn=lambda o: o, bias=True,
            mean_transform=None):
  if dim < 1:
    raise ValueError(f"input dimension must be >= 1, got {dim}")
  shapes = ((dim,), ()) if bias else ((dim,),)

  def init_fn(seed):
    del seed  # zero initialization
    return tuple(np.zeros(s, np.float32) for s in shapes)

  def apply_fn(weights, x):
    out = tf.linalg.matvec(x, weights[0])
    return out + weights[1] if bias else out

  def linear_form_fn(weights, x, y):
    # weights one model's ([d], []) or one per example ([m, d], [m]). loss_i depends
    # on them only through o_i = x_i.w + b, so its gradient is (d loss_i / d o_i)
    # (x_i, 1); one tape over the batch gives every d/d o_i.
    outputs = tf.reduce_sum(x * weights[0], -1)
    outputs = outputs + weights[1] if bias else outputs
    with tf.GradientTape() as tape:
      tape.watch(outputs)
      losses = loss_fn(outputs, y)
    return x, tape.gradient(losses, outputs)

  return F.SiloModel(name=name, weight_shapes=shapes, init_fn=init_fn,
                     apply_fn=apply_fn, loss_fn=loss_fn, metric=metric,
                     predict_fn=predict_fn,
                     per_example_gradients_fn=F.linear_form_gradients(linear_form_fn),
                     mean_transform=mean_transform,
                     linear_form_fn=None if mean_transform else linear_form_fn)


REGRESSION_OBJECTIVES = ("squared", "rmse")


def linear_regression(dim: int, *, bias: bool = True,
                      objective: str = "squared") -> F.SiloModel:
  """`squared`: mean of 0.5 * err^2 (the thesis); `rmse`: sqrt(mean(err^2)) (Galli
  et al. eq. 10; trains without DP only)."""
  if objective not in REGRESSION_OBJECTIVES:
    raise ValueError(f"objective must be one of {REGRESSION_OBJECTIVES}, got {objective!r}")
  if objective == "rmse":
    return _linear("linear_regression_rmse", dim, F.squared_error, "mse", bias=bias,
                   mean_transform=F.root)
  return _linear("linear_regression", dim, F.squared_loss, "mse", bias=bias)


def linear_svm(dim: int) -> F.SiloModel:
  return _linear("linear_svm", dim, F.hinge_loss, "accuracy", F.sign_prediction)


def logistic_regression(dim: int) -> F.SiloModel:
  return _linear("logistic_regression", dim, F.binary_cross_entropy, "accuracy",
                 F.threshold_prediction)
