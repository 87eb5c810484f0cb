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
from tff_silo.privacy.dp_sgd import OuterProduct

KERNEL = 3
POOL = 2


def _conv_out(size: int, padding: str) -> int:
  return size if padding == "SAME" else size - KERNEL + 1


def _stage_out(size: int, padding: str) -> int:
  return _conv_out(size, padding) // POOL


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
  # Each convolution's output positions and patch size (its factored gradients').
  positions = (_conv_out(h, padding) * _conv_out(w, padding),
               _conv_out(_stage_out(h, padding), padding)
               * _conv_out(_stage_out(w, padding), padding))
  patch_sizes = (KERNEL * KERNEL * c, KERNEL * KERNEL * c1)
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

  def stacked_apply_fn(weights, x):
    """S models at once: each convolution a batched matmul of the S models'
    patches and filters (`_stacked_conv`), the dense layers batched matmuls."""
    k1, b1, k2, b2, *dense_weights = weights
    y = x
    for kernel, bias in ((k1, b1), (k2, b2)):
      y = _padded(y, padding)
      y = _stacked_pool(tf.nn.relu(_stacked_conv(y, _windows(y), kernel)
                                   + bias[:, None, None, None]))
    y = tf.reshape(y, [tf.shape(y)[0], tf.shape(y)[1], flat])
    for i in range(0, len(dense_weights) - 2, 2):
      y = tf.nn.relu(tf.matmul(y, dense_weights[i]) + dense_weights[i + 1][:, None])
    return tf.matmul(y, dense_weights[-2]) + dense_weights[-1][:, None]

  def stacked_per_example_gradients_fn(weights, x, y):
    """Per-example gradients of S models with b examples each, from one forward
    pass per model (patches times filters, batched matmuls) and the gradients of
    the summed loss at each layer's output (example i's are its own), kept
    factored: a convolution's kernel gradient is example i's patches^T times its
    output gradients, a dense kernel's its input times its output gradient (both
    an `OuterProduct`, never formed here), a bias's its output gradients summed
    over positions."""
    k1, b1, k2, b2, *dense_weights = weights
    layer_inputs, layer_outputs = [], []
    with tf.GradientTape() as tape:
      h = x
      for kernel, bias in ((k1, b1), (k2, b2)):
        h = _padded(h, padding)
        layer_inputs.append(_windows(h))
        z = _stacked_conv(h, layer_inputs[-1], kernel) + bias[:, None, None, None]
        tape.watch(z)
        layer_outputs.append(z)
        h = _stacked_pool(tf.nn.relu(z))
      h = tf.reshape(h, [tf.shape(h)[0], tf.shape(h)[1], flat])
      for i in range(0, len(dense_weights), 2):
        layer_inputs.append(h if i == 0 else tf.nn.relu(z))
        z = tf.matmul(layer_inputs[-1], dense_weights[i]) + dense_weights[i + 1][:, None]
        tape.watch(z)
        layer_outputs.append(z)
      loss = tf.reduce_sum(F.softmax_cross_entropy(z, y))
    grads = []
    for i, (inputs, out_grads) in enumerate(zip(layer_inputs,
                                                tape.gradient(loss, layer_outputs))):
      if i < 2:
        grads += [OuterProduct(_positions(inputs, positions[i], patch_sizes[i]),
                               _positions(out_grads, positions[i], channels[i])),
                  tf.reduce_sum(out_grads, [2, 3])]
      else:
        grads += [OuterProduct(inputs, out_grads), out_grads]
    return grads

  return F.SiloModel(name="small_cnn" if hidden is None else "lenet", weight_shapes=shapes, init_fn=init_fn,
                     apply_fn=apply_fn, loss_fn=F.softmax_cross_entropy,
                     metric="accuracy", predict_fn=F.argmax_prediction,
                     stacked_apply_fn=stacked_apply_fn,
                     stacked_per_example_gradients_fn=stacked_per_example_gradients_fn)


def training_flops(input_shape, weight_shapes) -> int:
  """FLOPs of one example's training gradient through `small_cnn` with these
  weight shapes: 2 per multiply-add, three passes per layer (forward, the weights'
  gradient, the input's gradient), none for the images' gradient; pooling,
  activations and biases left out (a lower bound of the work done)."""
  h, w, _ = input_shape
  padding = _padding_for(min(h, w))
  multiply_adds = []
  for shape in weight_shapes:
    if len(shape) == 4:
      if padding == "VALID":
        h, w = h - KERNEL + 1, w - KERNEL + 1
      multiply_adds.append(h * w * int(np.prod(shape)))
      h, w = h // POOL, w // POOL
    elif len(shape) == 2:
      multiply_adds.append(int(np.prod(shape)))
  passes = [2 if i == 0 else 3 for i in range(len(multiply_adds))]
  return int(sum(2 * m * p for m, p in zip(multiply_adds, passes)))


@tf.custom_gradient
def _stacked_conv(x, patches, kernels):
  """S models' convolutions as one batched matmul: the patches [S, b, H', W',
  k*k*C] (`_windows` of x [S, b, H, W, C], already padded) times `kernels` [S, k,
  k, C, C'] -> [S, b, H', W', C']. Its gradient: the kernels' patches^T times the
  output gradients; x's each shift's output gradients times its filters^T, padded
  back to its place and summed (nine matmuls: no patch-sized gradient to split);
  none for `patches`, whose part is x's. Only matmuls, slices and pads, which every
  TensorFlow CPU build has (a grouped convolution's gradient is in the oneDNN
  kernels alone, on by default only on AVX-512 CPUs)."""
  shape = tf.shape(patches)
  s, c, c_out = tf.shape(kernels)[0], x.shape[-1], kernels.shape[-1]
  flat_patches = tf.reshape(patches, [shape[0], -1, shape[4]])
  y = tf.matmul(flat_patches, tf.reshape(kernels, [s, -1, c_out]))

  def grad(upstream):
    flat = tf.reshape(upstream, [s, -1, c_out])
    lead = [[0, 0]] * (len(x.shape) - 3)
    filters = tf.reshape(kernels, [s, KERNEL * KERNEL, c, c_out])
    dx = tf.add_n([
        tf.pad(tf.reshape(tf.matmul(flat, filters[:, i * KERNEL + j], transpose_b=True),
                          tf.concat([shape[:4], [c]], 0)),
               lead + [[i, KERNEL - 1 - i], [j, KERNEL - 1 - j], [0, 0]])
        for i in range(KERNEL) for j in range(KERNEL)])
    dk = tf.matmul(flat_patches, flat, transpose_a=True)
    return dx, None, tf.reshape(dk, tf.shape(kernels))

  return tf.reshape(y, tf.concat([shape[:4], [c_out]], 0)), grad


def _padded(x, padding):
  """x [..., H, W, C] with SAME's zero border for a k x k window (VALID: as it is)."""
  if padding == "VALID":
    return x
  return tf.pad(x, [[0, 0]] * (len(x.shape) - 3) + [[KERNEL // 2] * 2] * 2 + [[0, 0]])


def _windows(x):
  """[..., H, W, C] -> [..., H - k + 1, W - k + 1, k*k*C]: each k x k window of x,
  in a kernel's (row, column, channel) order, as shifted slices (cheaper here than
  `tf.image.extract_patches`)."""
  h, w = tf.shape(x)[-3] - KERNEL + 1, tf.shape(x)[-2] - KERNEL + 1
  return tf.concat([x[..., i:i + h, j:j + w, :]
                    for i in range(KERNEL) for j in range(KERNEL)], -1)


def _positions(t, positions: int, size: int):
  """[S, b, H', W', size] -> [S, b, positions = H' W', size] (static): a
  convolution layer's values per output position, on one axis."""
  return tf.reshape(t, tf.concat([tf.shape(t)[:2], [positions, size]], 0))


def _stacked_pool(y):
  """2x2 max-pooling of [S, b, H, W, C]."""
  shape = tf.shape(y)
  pooled = tf.nn.max_pool2d(tf.reshape(y, tf.concat([[-1], shape[2:]], 0)), POOL, POOL,
                            "VALID")
  return tf.reshape(pooled, tf.concat([shape[:2], tf.shape(pooled)[1:]], 0))


def to_keras(weights, input_shape):
  """A `tf.keras.Sequential` computing what `small_cnn` (or its `hidden` LeNet
  variant) computes with `weights` on (H, W, C) = `input_shape` images (logits out):
  Keras' Conv2D, max-pooling and channels-last Flatten use the same layouts, so the
  weights are set as they are."""
  weights = [np.asarray(w, np.float32) for w in weights]
  if len(weights) not in (6, 8) or weights[0].ndim != 4 or weights[2].ndim != 4:
    raise ValueError("weights must be small_cnn's: two conv kernels and biases, then "
                     "one or two dense layers")
  padding = _padding_for(min(input_shape[0], input_shape[1])).lower()
  layers = [tf.keras.Input(shape=tuple(input_shape))]
  for kernel in (weights[0], weights[2]):
    layers += [tf.keras.layers.Conv2D(kernel.shape[-1], KERNEL, padding=padding,
                                      activation="relu"),
               tf.keras.layers.MaxPool2D(POOL, POOL, "valid")]
  layers.append(tf.keras.layers.Flatten())
  if len(weights) == 8:
    layers.append(tf.keras.layers.Dense(weights[5].shape[0], activation="relu"))
  layers.append(tf.keras.layers.Dense(weights[-1].shape[0]))
  model = tf.keras.Sequential(layers, name="small_cnn")
  model.set_weights(weights)
  return model
