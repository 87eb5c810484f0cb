"""The attacked model and what a client sends for it.

`sigmoid_lenet` is the network of the DLG reference setting (Zhu et al. 2019; Galli
et al. sec. 5.3 "all activation functions replaced with the sigmoid"): three 5x5
convolutions with 12 channels and strides 2, 2, 1 (SAME padding), sigmoid after each,
and one dense layer to the class logits; every weight and bias uniform in
(-0.5, 0.5). Sigmoids keep the model twice differentiable, which gradient matching
needs.

A client that takes one SGD step of size lr on a batch sends the update
delta = -lr * gradient (Galli et al. sec. 5.3); `gradients_from_update` undoes it.
"""

from __future__ import annotations

import tensorflow as tf

CHANNELS = 12
KERNEL = 5
STRIDES = (2, 2, 1)
INIT_RANGE = 0.5


def sigmoid_lenet(input_shape, num_classes: int, *, seed: int = 0) -> tf.keras.Model:
  """The DLG LeNet for `input_shape` = (H, W, C) images; outputs logits."""
  if len(input_shape) != 3 or min(input_shape) < 1:
    raise ValueError(f"input_shape must be (height, width, channels), got {input_shape}")
  if num_classes < 2:
    raise ValueError(f"num_classes must be >= 2, got {num_classes}")

  def init(i):
    return tf.keras.initializers.RandomUniform(-INIT_RANGE, INIT_RANGE, seed=seed * 64 + i)

  layers = [tf.keras.Input(shape=tuple(input_shape))]
  for i, stride in enumerate(STRIDES):
    layers.append(tf.keras.layers.Conv2D(
        CHANNELS, KERNEL, strides=stride, padding="same", activation="sigmoid",
        kernel_initializer=init(2 * i), bias_initializer=init(2 * i + 1)))
  layers += [tf.keras.layers.Flatten(),
             tf.keras.layers.Dense(num_classes, kernel_initializer=init(6),
                                   bias_initializer=init(7))]
  return tf.keras.Sequential(layers, name="sigmoid_lenet")


def cross_entropy(logits, target_probs):
  """Mean over the batch of -sum_c p_c log softmax(logits)_c (soft or one-hot p)."""
  return tf.reduce_mean(tf.reduce_sum(-target_probs * tf.nn.log_softmax(logits), -1))


def num_classes_of(model: tf.keras.Model) -> int:
  return int(model.output_shape[-1])


def gradients(model: tf.keras.Model, x, labels):
  """The gradient a client computes: of the mean cross-entropy of integer `labels`
  on batch `x`, one tensor per trainable variable."""
  x = tf.convert_to_tensor(x, tf.float32)
  target = tf.one_hot(tf.cast(labels, tf.int32), num_classes_of(model))
  with tf.GradientTape() as tape:
    loss = cross_entropy(model(x, training=False), target)
  return tape.gradient(loss, model.trainable_variables)


def per_example_gradients(model: tf.keras.Model, x, labels):
  """Gradients of each example alone, stacked on a leading axis (for DP-SGD)."""
  per_example = [gradients(model, x[i:i + 1], labels[i:i + 1]) for i in range(len(x))]
  return [tf.stack(g) for g in zip(*per_example)]


def one_step_update(grads, learning_rate: float):
  """The model update of one SGD step: delta = -lr * gradient."""
  _check_learning_rate(learning_rate)
  return [-learning_rate * tf.convert_to_tensor(g) for g in grads]


def gradients_from_update(update, learning_rate: float):
  """The gradient behind a one-step update: -delta / lr."""
  _check_learning_rate(learning_rate)
  return [-tf.convert_to_tensor(u) / learning_rate for u in update]


def _check_learning_rate(learning_rate):
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be positive, got {learning_rate}")
