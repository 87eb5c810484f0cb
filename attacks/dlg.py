"""Gradient inversion: DLG (Zhu et al. 2019) and iDLG (Zhao et al. 2020).

An honest-but-curious server that sees a client's gradient g (or its one-step update
-lr * g, `models.gradients_from_update`) optimizes a dummy batch x' and, for DLG, a
dummy soft label y' = softmax(l') so that their gradient matches:

    min_{x', l'}  sum_layers || grad_W CE(f(x'), softmax(l')) - g ||_2^2      (DLG eq. 4)

iDLG first reads the true label of a single example from the last layer: with
softmax cross-entropy the gradient of the final dense kernel W [features, classes] is
h (p - y)^T, and the features h of a sigmoid (or ReLU) network are >= 0, so only the
true class's column is <= 0; its label is the column with the smallest sum. It then
optimizes x' alone against that one-hot label.

The dummies start from N(0, 1) draws of stateless random ops keyed by `seed`, and both
optimizers (L-BFGS, as the papers; Adam) are deterministic, so a seed fixes the result.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from attacks import models
from attacks.choices import METHODS, OPTIMIZERS
from tff_silo.privacy import dp_sgd


@dataclasses.dataclass(frozen=True)
class Reconstruction:
  """What an attack produced.

  Attributes:
    images: the dummy batch x' [B, H, W, C] as optimized (not clipped).
    labels: the inferred integer labels [B] (iDLG: read from the gradient; DLG: the
      argmax of the dummy soft label).
    label_probs: the soft labels [B, classes] the dummy gradient was computed with.
    loss_curve: the matching objective at the start and after each iteration; shorter
      than `iterations + 1` when L-BFGS converged or its line search failed.
  """

  images: np.ndarray
  labels: np.ndarray
  label_probs: np.ndarray
  loss_curve: np.ndarray


def check_gradients(model: tf.keras.Model, gradients) -> list:
  """`gradients` as float32 tensors, one per trainable variable of `model` with its
  shape; a one-line ValueError otherwise."""
  variables = model.trainable_variables
  expected = [tuple(v.shape) for v in variables]
  try:
    got = [tuple(np.shape(g)) for g in gradients]
  except TypeError:
    raise ValueError(f"gradients must be a list of {len(expected)} tensors, one per "
                     f"trainable variable of the model; got {type(gradients).__name__}"
                     ) from None
  if got != expected:
    raise ValueError(f"gradients do not match the model: expected {len(expected)} "
                     f"tensors with shapes {expected}, got {len(got)} with shapes {got}")
  return [tf.convert_to_tensor(g, tf.float32) for g in gradients]


def infer_label(model: tf.keras.Model, gradients) -> int:
  """iDLG: the class whose column of the last dense kernel's gradient sums lowest."""
  grads = check_gradients(model, gradients)
  num_classes = models.num_classes_of(model)
  kernels = [g for g in grads if len(g.shape) == 2 and g.shape[-1] == num_classes]
  if not kernels:
    raise ValueError("iDLG needs a final dense layer: no [features, classes] kernel "
                     "among the model's variables")
  return int(tf.argmin(tf.reduce_sum(kernels[-1], axis=0)))


def _check(method, optimizer, iterations, batch_size, learning_rate, l2_norm_clip):
  if method not in METHODS:
    raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
  if optimizer not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got "
                     f"{optimizer!r}")
  if int(iterations) != iterations or iterations < 1:
    raise ValueError(f"iterations must be a positive integer, got {iterations}")
  if int(batch_size) != batch_size or batch_size < 1:
    raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
  if method == "idlg" and batch_size != 1:
    raise ValueError("idlg reads the label of a single example: use batch_size=1, or "
                     "method='dlg' for a batch")
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be positive, got {learning_rate}")
  if l2_norm_clip is not None and not l2_norm_clip > 0:
    raise ValueError(f"l2_norm_clip must be positive or None, got {l2_norm_clip}")


def reconstruct(model: tf.keras.Model, gradients, *, method: str = "idlg",
                optimizer: str = "lbfgs", iterations: int = 300, seed: int = 0,
                batch_size: int = 1, learning_rate: float = 0.1,
                l2_norm_clip: Optional[float] = None) -> Reconstruction:
  """Reconstructs the batch behind `gradients` of `model`'s mean cross-entropy.

  Args:
    model: the Keras model (logits out) at the weights the gradient was taken at.
    gradients: one tensor per `model.trainable_variables` (for an update from one
      local step use `attacks.models.gradients_from_update`).
    method: `dlg` (input and soft label) or `idlg` (label first; batch_size 1).
    optimizer: `lbfgs` (the papers') or `adam`.
    iterations: optimizer iterations (> 0).
    seed: seeds the dummy initialization.
    batch_size: examples behind the gradient.
    learning_rate: Adam's step size (L-BFGS uses a line search).
    l2_norm_clip: the public per-example clip C of a clipping defense (DP-SGD): the
      attacker clips its dummy examples' gradients alike, so that clipping's
      rescaling alone does not hide the input. None: match the raw gradient.
  """
  _check(method, optimizer, iterations, batch_size, learning_rate, l2_norm_clip)
  observed = check_gradients(model, gradients)
  objective = _objective(model, method, batch_size, l2_norm_clip)
  label = tf.zeros([batch_size, objective.num_classes])
  if method == "idlg":
    label = tf.one_hot([infer_label(model, observed)], objective.num_classes)
  position = tf.random.stateless_normal([objective.size], seed=[seed, 0])
  if optimizer == "lbfgs":
    position, curve = objective.lbfgs(position, observed, label, iterations)
  else:
    position, curve = objective.adam(position, observed, label, iterations,
                                     learning_rate)
  x, probs = objective.unpack(position, label)
  return Reconstruction(images=x.numpy(), labels=np.argmax(probs.numpy(), -1),
                        label_probs=probs.numpy(), loss_curve=np.asarray(curve))


_OBJECTIVES = weakref.WeakKeyDictionary()


def _objective(model, method, batch_size, l2_norm_clip) -> "_Objective":
  """One traced objective per (model, method, batch size, clip): tracing L-BFGS
  takes seconds, its iterations milliseconds."""
  cache = _OBJECTIVES.setdefault(model, {})
  key = (method, batch_size, l2_norm_clip)
  if key not in cache:
    cache[key] = _Objective(model, method, batch_size, l2_norm_clip)
  return cache[key]


class _Objective:
  """The matching objective over a flat position (x', and l' for DLG) and its
  optimizers; the observed gradient and the iDLG label are arguments, not constants,
  so the traced functions serve every attack on the model."""

  def __init__(self, model, method, batch_size, l2_norm_clip):
    self.l2_norm_clip = l2_norm_clip
    self.num_classes = models.num_classes_of(model)
    self.image_shape = [batch_size, *model.input_shape[1:]]
    self.x_size = int(np.prod(self.image_shape))
    self.learn_label = method == "dlg"
    self.size = self.x_size + (batch_size * self.num_classes if self.learn_label else 0)

    def value_and_gradients(position, observed, label):
      with tf.GradientTape() as outer:
        outer.watch(position)
        x, probs = self.unpack(position, label)
        dummy = self._dummy_gradient(model, x, probs)
        matching = tf.add_n([tf.reduce_sum(tf.square(d - o))
                             for d, o in zip(dummy, observed)])
      return matching, outer.gradient(matching, position)

    def lbfgs_step(previous, upto, observed, label):
      return tfp.optimizer.lbfgs_minimize(
          lambda p: value_and_gradients(p, observed, label), None,
          previous_optimizer_results=previous, max_iterations=upto)

    def lbfgs_start(position, observed, label):
      return tfp.optimizer.lbfgs_minimize(
          lambda p: value_and_gradients(p, observed, label), position,
          max_iterations=0)

    self.value_and_gradients = tf.function(value_and_gradients)
    self._lbfgs_step = tf.function(lbfgs_step)
    # The start runs eagerly: it evaluates the traced objective once and iterates
    # zero times, and tracing L-BFGS's loop for it cost seconds per objective.
    self._lbfgs_start = lbfgs_start

  def _dummy_gradient(self, model, x, probs):
    """The dummy batch's gradient; with a clip, the mean of its examples' gradients
    each clipped to L2 norm C, as the defended client computed it."""
    if self.l2_norm_clip is None:
      with tf.GradientTape() as tape:
        loss = models.cross_entropy(model(x, training=False), probs)
      return tape.gradient(loss, model.trainable_variables)
    per_example = []
    for i in range(self.image_shape[0]):
      with tf.GradientTape() as tape:
        loss = models.cross_entropy(model(x[i:i + 1], training=False), probs[i:i + 1])
      per_example.append(tape.gradient(loss, model.trainable_variables))
    clipped = dp_sgd.clip_per_example([tf.stack(g) for g in zip(*per_example)],
                                      self.l2_norm_clip)
    return [tf.reduce_mean(g, axis=0) for g in clipped]

  def unpack(self, position, label):
    """(x' [B, H, W, C], label probabilities [B, classes]) from a position."""
    x = tf.reshape(position[:self.x_size], self.image_shape)
    if not self.learn_label:
      return x, label
    return x, tf.nn.softmax(tf.reshape(position[self.x_size:], label.shape))

  def lbfgs(self, position, observed, label, iterations):
    """L-BFGS one iteration per call, resuming from its state, to record the curve."""
    results = self._lbfgs_start(position, observed, label)
    curve = [float(results.objective_value)]
    for i in range(1, iterations + 1):
      results = self._lbfgs_step(results, tf.constant(i), observed, label)
      if int(results.num_iterations) < i:   # converged, or the line search failed
        break
      curve.append(float(results.objective_value))
    return results.position, curve

  def adam(self, position, observed, label, iterations, learning_rate):
    variable = tf.Variable(position)
    adam = tf.keras.optimizers.Adam(learning_rate)

    @tf.function
    def step():
      value, grad = self.value_and_gradients(variable, observed, label)
      adam.apply_gradients([(grad, variable)])
      return value

    curve = [float(step()) for _ in range(iterations)]
    curve.append(float(self.value_and_gradients(variable, observed, label)[0]))
    return variable.value(), curve
