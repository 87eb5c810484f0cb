"""`train_silos`: `local_training.train_locally` for every stacked silo at once (the
same batches, per-example gradients and noise as each silo alone)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys
from tff_silo.algorithms import local_training as lt
from tff_silo.backends.vectorized.stacking import StackedSilos, rows
from tff_silo.privacy import gaussian


def _epoch_permutations(plan, n, num_rows, shuffle_keys, step, previous):
  """[K, rows]: each silo's shuffled epoch's permutation (padded rows last), drawn
  at the silo's epoch's first step and kept (`previous`) until its next."""
  per_epoch = plan[1]
  fresh = tf.equal(step % per_epoch, 0)

  def draw():
    draws = br.uniform(br.fold_in(shuffle_keys, step // per_epoch), num_rows)
    valid = tf.range(num_rows)[None] < n[:, None]
    return tf.where(fresh[:, None], lt.random_permutation(tf.where(valid, draws, 2.0)),
                    previous)

  return tf.cond(tf.reduce_any(fresh), draw, lambda: previous)


def _batches(config, plan, n, num_rows, sampling_keys, perm, step):
  """Each silo's batch of step `step`: (indices [K, b], mask [K, b]), b the widest
  batch of this step; the same examples as `train_locally` draws for each silo
  (`perm`: the shuffled epochs' permutations)."""
  batch, per_epoch, _, rate = plan
  rows = tf.range(num_rows)[None]
  valid = rows < n[:, None]
  if config.batches == "poisson":
    keep = (br.uniform(br.fold_in(sampling_keys, step), num_rows) < rate[:, None]) & valid
    kept = tf.where(keep)   # [M, 2]: (silo, row) of the kept rows, in index order
    num_silos = tf.shape(n, out_type=tf.int64)[0]
    ragged = tf.RaggedTensor.from_value_rowids(tf.cast(kept[:, 1], tf.int32),
                                               kept[:, 0], nrows=num_silos)
    count = ragged.row_lengths()
    width = tf.maximum(tf.reduce_max(count), 1)
    return (ragged.to_tensor(shape=tf.stack([num_silos, width])),
            tf.cast(tf.range(width)[None] < count[:, None], tf.float32))
  width = tf.reduce_max(batch)
  slots = tf.range(width)[None]
  if config.batches == "without_replacement":
    draws = br.uniform(br.fold_in(sampling_keys, step), num_rows)
    return (lt.first_of_permutation(tf.where(valid, draws, 2.0), width),
            tf.cast(slots < batch[:, None], tf.float32))
  start = ((step % per_epoch) * batch)[:, None]   # shuffled epochs
  positions = tf.minimum(start + slots + tf.zeros_like(batch)[:, None], num_rows - 1)
  return (tf.gather(perm, positions, batch_dims=1),
          tf.cast(slots < batch[:, None], tf.float32))


def _stacked_gradients(model, config, weights, anchor, lam, xb, yb, noise, normalizer,
                       mask):
  """`local_training.step_gradient` of every silo through the model's
  `stacked_apply_fn`. Under DP each example gets its own copy of its silo's weights,
  so the gradient with respect to the copies is the per-example gradient. `lam`: one
  per silo."""
  penalty = [rows(lam, w) * (w - a) for w, a in zip(weights, anchor)]
  if not config.private:
    with tf.GradientTape() as tape:
      tape.watch(weights)
      losses = model.loss_fn(model.stacked_apply_fn(weights, xb), yb)
      loss = tf.reduce_sum(lt.masked_mean(losses, mask))
    return [g + p for g, p in zip(tape.gradient(loss, weights), penalty)]
  num_silos, width = tf.shape(yb)[0], tf.shape(yb)[1]
  copies = [tf.repeat(w, width, axis=0) for w in weights]   # [K * b, ...]
  flat = lambda t: tf.reshape(t, tf.concat([[num_silos * width, 1], tf.shape(t)[2:]], 0))
  with tf.GradientTape() as tape:
    tape.watch(copies)
    loss = tf.reduce_sum(model.loss_fn(model.stacked_apply_fn(copies, flat(xb)),
                                       flat(yb)))
  per_example = [tf.reshape(g, tf.concat([[num_silos, width], tf.shape(g)[1:]], 0))
                 for g in tape.gradient(loss, copies)]
  return lt.dp_gradient(config, per_example, penalty, noise, normalizer, mask,
                        batch_dims=2)


# The DP stacked path's working set per step, in floats: above it the silos go
# through in chunks (`chunk_silos`), one chunk at a time.
MEMORY_BUDGET_FLOATS = 2 ** 27   # 512 MB of float32
# Floats the DP stacked path holds per float of its per-example weight copies (the
# copies, their gradients, activations and TF's temporaries): measured ~6.5 for the
# CNN on 28x28 images (benchmarks/RESULTS.md, issue 12), rounded up.
WORKING_SET_PER_COPY = 8


def chunk_silos(model, config) -> int:
  """The most silos per chunk of the DP stacked path: as many as keep
  `WORKING_SET_PER_COPY` x batch_size x parameters floats each within
  `MEMORY_BUDGET_FLOATS` (Poisson batches vary around batch_size, so the bound is
  about, not exact), at least 1."""
  per_silo = WORKING_SET_PER_COPY * config.batch_size * model.num_parameters
  return int(np.clip(MEMORY_BUDGET_FLOATS // per_silo, 1, np.iinfo(np.int32).max))


def in_chunks(fn, most: int, tensors, num_outputs: int):
  """`fn(tensors)` (a flat list of [K, ...] tensors -> `num_outputs` [K, ...]
  tensors) over chunks of at most `most` silos, one after another (`tf.map_fn`); the
  chunks are as even as can be (40 silos, at most 39: two of 20), the silo axis is
  zero-padded to a multiple of the chunk and the padding dropped again."""
  num_silos = tf.shape(tensors[0])[0]
  chunk = -(-num_silos // -(-num_silos // most))   # ceil(K / ceil(K / most))
  extra = (chunk - num_silos % chunk) % chunk
  pieces = [tf.reshape(tf.pad(t, [[0, extra]] + [[0, 0]] * (len(t.shape) - 1)),
                       tf.concat([[-1, chunk], tf.shape(t)[1:]], 0)) for t in tensors]
  out = tf.map_fn(fn, pieces, fn_output_signature=[tf.float32] * num_outputs,
                  parallel_iterations=1)   # one chunk in memory at a time
  return [tf.reshape(o, tf.concat([[-1], tf.shape(o)[2:]], 0))[:num_silos] for o in out]


def train_silos(model, config, weights, anchor, lam, silos: StackedSilos, round_keys,
                pass_, learning_rate=None):
  """`train_locally` for every silo at once: weights and anchor [K, ...], `lam` and
  `learning_rate` (default `config.learning_rate`) one for all or one per silo
  ([K]); returns the new weights (a list)."""
  weights = list(weights)
  lam = tf.broadcast_to(tf.cast(lam, tf.float32), tf.shape(silos.n))
  lr = tf.broadcast_to(tf.cast(config.learning_rate if learning_rate is None
                               else learning_rate, tf.float32), tf.shape(silos.n))
  num_rows = tf.shape(silos.y)[1]
  plan = lt.batch_plan(config, silos.n, silos.size)
  batch, _, total_steps, _ = plan
  sampling_keys = br.derive(round_keys, keys.SAMPLING, pass_)
  shuffle_keys = br.derive(round_keys, keys.SHUFFLE, pass_)
  noise_keys = br.derive(round_keys, keys.DP_NOISE, pass_)
  normalizer = tf.cast(batch, tf.float32)
  shapes = [tuple(s) for s in model.weight_shapes]
  sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]

  def noise(step):
    stddev = silos.noise_multiplier * config.l2_norm_clip
    flat = gaussian.normal(br.fold_in(noise_keys, step), sum(sizes)) * stddev[:, None]
    return [tf.reshape(part, [-1, *s]) for part, s in zip(tf.split(flat, sizes, 1), shapes)]

  def body(step, w, perm):
    if config.batches == "shuffle":
      perm = _epoch_permutations(plan, silos.n, num_rows, shuffle_keys, step, perm)
    idx, mask = _batches(config, plan, silos.n, num_rows, sampling_keys, perm, step)
    xb = tf.gather(silos.x, idx, batch_dims=1)
    yb = tf.gather(silos.y, idx, batch_dims=1)
    step_noise = noise(step) if config.private else None
    if model.stacked_apply_fn is not None and config.private:
      num_layers = len(w)

      def stacked(parts):   # w, anchor, noise, then xb, yb, normalizer, mask, lam
        ws, anchors, noises = (parts[i * num_layers:(i + 1) * num_layers]
                               for i in range(3))
        x_, y_, norm_, mask_, lam_ = parts[3 * num_layers:]
        return _stacked_gradients(model, config, ws, anchors, lam_, x_, y_, noises,
                                  tf.maximum(norm_, 1.0), mask_)

      parts = [*w, *anchor, *step_noise, xb, yb, normalizer, mask, lam]
      chunk = chunk_silos(model, config)
      grads = tf.cond(tf.shape(yb)[0] <= chunk, lambda: stacked(parts),
                      lambda: in_chunks(stacked, chunk, parts, num_layers))
    elif model.stacked_apply_fn is not None:
      grads = _stacked_gradients(model, config, w, anchor, lam, xb, yb, None,
                                 normalizer, mask)
    elif config.private:
      grads = tf.vectorized_map(
          lambda a: lt.step_gradient(model, config, a[0], a[1], a[7], a[2], a[3], a[4],
                                     a[5], a[6]),
          (w, anchor, xb, yb, step_noise, normalizer, mask, lam))
    else:
      grads = tf.vectorized_map(
          lambda a: lt.step_gradient(model, config, a[0], a[1], a[5], a[2], a[3], None,
                                     None, a[4]),
          (w, anchor, xb, yb, mask, lam))
    active = step < total_steps
    return step + 1, [tf.where(rows(active, wi), wi - rows(lr, wi) * gi, wi)
                      for wi, gi in zip(w, grads)], perm

  _, weights, _ = tf.while_loop(
      lambda step, *_: step < tf.reduce_max(total_steps), body,
      (tf.constant(0), weights, tf.zeros_like(silos.y, tf.int32)))
  return weights
