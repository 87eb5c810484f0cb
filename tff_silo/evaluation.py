"""Evaluating every silo's model on its own examples (thesis app. B.4: the test metric
averaged over silos weighted by their test counts, i.e. pooled over examples), for
every driver: `SiloEvaluator`, `pooled`."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo.data.silos import padded_stack
from tff_silo.runner import SiloModels


class SiloEvaluator:
  """Per-silo metric means. Silos go in chunks of at most `chunk_rows` padded
  examples (default: `chunk_rows_for(model)`): one call of one traced function per
  chunk (the model's `stacked_apply_fn`, or `apply_fn` mapped over silos), which
  gathers the chunk's models from the stacked layers (`runner.SiloModels`) and
  masks out the zero-padded rows of its data."""

  def __init__(self, model, chunk_rows: int | None = None):
    self._chunk_rows = chunk_rows_for(model) if chunk_rows is None else chunk_rows
    self._metric_sums = _program(model, _metric_sums_function)

  def _chunks(self, sizes):
    chunk, longest = [], 0
    for k, n in enumerate(sizes):
      if chunk and (len(chunk) + 1) * max(longest, n) > self._chunk_rows:
        yield chunk
        chunk, longest = [], 0
      chunk.append(k)
      longest = max(longest, n)
    if chunk:
      yield chunk

  def __call__(self, models, xs, ys):
    """(mean over all examples pooled, per-silo means) of `models` (`SiloModels`,
    or each silo's layers). A silo larger than `chunk_rows` goes alone, in blocks
    of `chunk_rows` rows."""
    if not isinstance(models, SiloModels):
      models = SiloModels.of(models)
    layers = tuple(tf.convert_to_tensor(layer) for layer in models.layers)   # (once)
    positions = models.positions()
    sums_of = lambda chunk, x, y, mask: self._metric_sums(
        layers, models.index, positions[chunk], x, y, mask)
    sizes = np.array([len(y) for y in ys])
    sums = np.zeros(len(ys))
    for chunk in self._chunks(sizes):
      if len(chunk) == 1 and sizes[chunk[0]] > self._chunk_rows:
        k, step = chunk[0], self._chunk_rows
        for start in range(0, int(sizes[k]), step):
          x, y = xs[k][start:start + step], ys[k][start:start + step]
          sums[k] += float(np.asarray(sums_of(chunk, x[None], y[None],
                                              np.ones((1, len(y)), np.float32)))[0])
        continue
      rows = max(1, int(sizes[chunk].max()))
      mask = (np.arange(rows)[None] < sizes[chunk][:, None]).astype(np.float32)
      sums[chunk] = np.asarray(sums_of(chunk, padded_stack([xs[k] for k in chunk], rows),
                                       padded_stack([ys[k] for k in chunk], rows), mask))
    return float(sums.sum() / sizes.sum()), sums / sizes


def chunk_rows_for(model) -> int:
  """Padded examples per evaluation chunk: 8192 (a CNN's activations on 28x28
  images), more for a small model, whose chunks would otherwise be many small calls
  (a grid's stacked runs: tens of thousands of silos), as many as 2^24 floats of
  its parameters allow, at most 2^18."""
  return int(np.clip(2 ** 24 // max(model.num_parameters, 1), 8192, 2 ** 18))


_PROGRAMS = {}


def _program(model, make):
  """`programs.evaluation_function(make(model))`, made once per model computation
  (`computation_key`: a sweep's runs share it), kind (`make`) and PJRT platform:
  inside `programs.pjrt_rounds`, run by PJRT as the rounds are (one program per
  input shape)."""
  from tff_silo.backends.vectorized import programs
  key = (make.__name__, model.computation_key, programs.pjrt_platform())
  if key not in _PROGRAMS:
    _PROGRAMS[key] = programs.evaluation_function(make(model))
  return _PROGRAMS[key]


def _metric_sums_function(model):
  """`(layers, index, positions, x, y, mask) -> per-silo metric sums` of the models
  of `SiloModels` rows `positions`, gathered in the program."""
  apply = model.stacked_apply_fn or (lambda weights, x: tf.vectorized_map(
      lambda a: model.apply_fn(list(a[0]), a[1]), (weights, x)))

  def metric_sums(layers, index, positions, x, y, mask):
    at = tf.stack([tf.gather(tf.cast(i, tf.int32), positions) for i in index], axis=1)
    weights = [tf.gather_nd(layer, at) for layer in layers]
    return tf.reduce_sum(model.metric_of(apply(weights, x), y) * mask, axis=1)

  return metric_sums


def _outputs_function(model):
  """`(weights, x) -> model.apply_fn(weights, x)`."""
  return lambda weights, x: model.apply_fn(list(weights), x)


def silo_outputs(model, silo_weights, xs, chunk_rows: int = 8192) -> list:
  """Each silo's model outputs (`model.apply_fn`) on its examples `xs`, by one
  evaluation program (`_program`) called on blocks of at most `chunk_rows` rows,
  each zero-padded to a power of two rows (few shapes: few programs)."""
  outputs_of = _program(model, _outputs_function)
  out = []
  for weights, x in zip(silo_weights, xs):
    weights = [tf.constant(np.asarray(w, np.float32)) for w in weights]
    blocks = []
    for start in range(0, len(x), chunk_rows):
      block = np.asarray(x[start:start + chunk_rows], np.float32)
      padded = np.zeros((1 << max(len(block) - 1, 0).bit_length(), *block.shape[1:]),
                        np.float32)
      padded[:len(block)] = block
      blocks.append(np.asarray(outputs_of(weights, padded))[:len(block)])
    out.append(np.concatenate(blocks) if blocks else np.zeros(0, np.float32))
  return out


def pooled(silo_means, sizes) -> float:
  """The mean over every example of these silos, from their per-silo means and
  example counts."""
  sizes = np.asarray(sizes)
  return float(np.sum(silo_means * sizes) / sizes.sum())
