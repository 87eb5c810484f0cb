"""`train_silos`: `local_training.train_locally` for every stacked silo at once (the
same batches, per-example gradients and noise as each silo alone).

Traced inside an XLA-compiled round (`programs.round_program` with XLA on), it keeps
every shape static, as XLA needs: a step's batches are B wide (not the widest
silo's), a Poisson sample is a mask over the padded rows (`PoissonSampler.kept_mask`),
and a DP step's examples are compacted to the front of a list of every (silo, slot)
pair, which goes through in chunks of `STATIC_CHUNK_EXAMPLES` until its count is
covered. The numbers are the same (float32 summation order aside; parity tests).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys, xla
from tff_silo.algorithms import local_training as lt
from tff_silo.algorithms import poisson_sampling as ps
from tff_silo.backends.vectorized.stacking import StackedSilos, rows
from tff_silo.privacy import gaussian, integer_gaussian


def _epoch_permutations(plan, n, num_rows, shuffle_keys, step, previous):
  """[K, rows]: each silo's shuffled epoch's permutation (padded rows last), drawn
  at the silo's epoch's first step and kept (`previous`) until its next. Only the
  silos starting an epoch draw and sort (silos of different sizes start theirs at
  different steps), except under XLA, whose shapes are static."""
  per_epoch = plan[1]
  fresh = tf.equal(step % per_epoch, 0)

  def permutations(silos):
    draws = br.uniform(br.fold_in(tf.gather(shuffle_keys, silos),
                                  tf.gather(step // per_epoch, silos)), num_rows)
    valid = tf.range(num_rows)[None] < tf.gather(n, silos)[:, None]
    return lt.random_permutation(tf.where(valid, draws, 2.0))

  def draw():
    if xla.compiling():
      return tf.where(fresh[:, None], permutations(tf.range(tf.shape(n)[0])), previous)
    silos = tf.cast(tf.where(fresh)[:, 0], tf.int32)
    return tf.tensor_scatter_nd_update(previous, silos[:, None], permutations(silos))

  return tf.cond(tf.reduce_any(fresh), draw, lambda: previous)


def _batches(config, plan, n, num_rows, sampling_keys, perm, step, static=False):
  """Each silo's batch of step `step` when its size is fixed (shuffled epochs,
  sampling without replacement): (indices [K, b], mask [K, b]), b the widest batch
  (`static`: min(B, rows), known before the data); the same examples as
  `train_locally` draws for each silo (`perm`: the shuffled epochs' permutations)."""
  batch, per_epoch, _, _ = plan
  width = (tf.minimum(config.batch_size, num_rows) if static
           else tf.reduce_max(batch))
  slots = tf.range(width)[None]
  mask = tf.cast(slots < batch[:, None], tf.float32)
  if config.batches == "without_replacement":
    valid = tf.range(num_rows)[None] < n[:, None]
    draws = br.mantissas(br.fold_in(sampling_keys, step), num_rows)
    padding = tf.constant(2 ** 52, tf.int64)   # above every row's key
    return lt.first_of_permutation(tf.where(valid, draws, padding), width), mask
  start = ((step % per_epoch) * batch)[:, None]   # shuffled epochs
  positions = tf.minimum(start + slots + tf.zeros_like(batch)[:, None], num_rows - 1)
  return tf.gather(perm, positions, batch_dims=1), mask


def _examples(config, plan, n, num_rows, sampling_keys, perm, step, sampler, active):
  """The `active` silos' examples of step `step` under DP as one list: (silo [M],
  row [M], None), silo by silo, each silo's in `train_locally`'s order (Poisson:
  `sampler`'s, the same draws as the silo alone, every silo's drawn at once), so the
  list is O(sum of the batches) long, not K times the widest."""
  if config.batches == "poisson":
    return (*sampler.sample(br.random_bits, br.fold_in(sampling_keys, step), active),
          None)
  idx, mask = _batches(config, plan, n, num_rows, sampling_keys, perm, step)
  kept = tf.cast(tf.where((mask > 0) & active[:, None]), tf.int32)
  return kept[:, 0], tf.gather_nd(idx, kept), None


def _static_examples(config, plan, n, num_rows, sampling_keys, perm, step, sampler,
                     active):
  """`_examples` in static shapes: (silo [L], row [L], count) over every (silo,
  slot) pair of the step's batches (Poisson: of the padded rows), the `count`
  examples of the `active` silos first and in `_examples`' order within each silo,
  the rest pointing at silo K (dropped) and row 0."""
  if config.batches == "poisson":
    mask = sampler.kept_mask(br.random_bits, br.fold_in(sampling_keys, step), num_rows)
    idx = None
  else:
    idx, mask = _batches(config, plan, n, num_rows, sampling_keys, perm, step, True)
  kept = tf.reshape((mask > 0) & active[:, None], [-1])
  count = tf.reduce_sum(tf.cast(kept, tf.int32))
  # The pairs' silo and row indices built on it are not folded into constants of
  # K x rows values in every lowered program.
  zero = br.run_time_zero(count, tf.int32)
  pairs = lambda index: tf.reshape(tf.broadcast_to(index + zero, tf.shape(mask)), [-1])
  silo = pairs(tf.range(tf.shape(mask)[0])[:, None])
  rows = pairs(tf.range(num_rows)[None]) if idx is None else tf.reshape(idx, [-1])
  length = tf.size(kept)
  # Kept pairs to the front (their rank among the kept), the others to one dump slot.
  slot = tf.where(kept, xla.cumsum(tf.cast(kept, tf.int32)) - 1, length)[:, None]
  compact = lambda values, fill: tf.tensor_scatter_nd_update(
      tf.fill([length + 1], fill), slot, values)[:length]
  return compact(silo, tf.shape(mask)[0]), compact(rows, 0), count


def _rows_of(x, y, silo, row):
  """(x, y) of the examples (silo, row) (int32, any shape) of stacked silos' `x`
  [K, rows, ...] and `y` [K, rows]: gathered from the silos' rows laid end to end
  (a reshape, no copy), faster than pairs' gather_nd."""
  num_rows = tf.shape(y)[1]
  flat = lambda t: tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))
  where = silo * num_rows + row
  return tf.gather(flat(x), where), tf.gather(flat(y), where)


def _own_copy_gradients(model, copies, x, y):
  """Per-example gradients when every example has its own copy of its silo's
  weights (`copies` [m, ...]): through the model's `stacked_apply_fn` (m models of
  one example each), or `local_training.per_example_gradients` mapped over the
  examples."""
  if model.stacked_apply_fn is not None:
    with tf.GradientTape() as tape:
      tape.watch(copies)
      loss = tf.reduce_sum(model.loss_fn(model.stacked_apply_fn(copies, x[:, None]),
                                         y[:, None]))
    return tape.gradient(loss, copies)
  return tf.vectorized_map(
      lambda a: [g[0] for g in lt.per_example_gradients(model, a[0], a[1][None],
                                                        a[2][None])],
      (copies, x, y))


def _by_silo_sums(model, config, weights, penalty, silos, ids, chunk_rows, static):
  """A chunk's clipped penalized sums per silo ([K + 1, ...]) through the model's
  `stacked_per_example_gradients_fn`: the chunk's examples (`ids` their silos,
  sorted, K for padding; `chunk_rows`) laid out [u, w], one row per silo present
  (`tf.unique`, order kept), w the most examples of one, empty slots masked
  (`static`: one row per example, w = 1, as XLA needs)."""
  position = tf.range(tf.shape(ids)[0])
  if static:
    present, group, slot, width = ids, position, tf.zeros_like(position), 1
  else:
    present, group = tf.unique(ids)
    slot = position - tf.gather(tf.math.unsorted_segment_min(
        position, group, tf.shape(present)[0]), group)
    width = tf.reduce_max(slot) + 1
  where = tf.stack([group, slot], 1)
  shape = tf.stack([tf.shape(present)[0], width])
  layout = tf.scatter_nd(where, chunk_rows, shape)
  mask = tf.scatter_nd(where, tf.ones_like(chunk_rows, tf.float32), shape)
  silo = tf.broadcast_to(tf.minimum(present, tf.shape(silos.n)[0] - 1)[:, None], shape)
  part = lt.stacked_clipped_penalized_sums(
      model, config, [tf.gather(w, present) for w in weights],
      [tf.gather(p, present) for p in penalty],
      *_rows_of(silos.x, silos.y, silo, layout), mask)
  return [tf.math.unsorted_segment_sum(p, present, tf.shape(w)[0])
          for p, w in zip(part, weights)]


def _bucket(size):
  """`size` (int32 > 0) rounded up to a multiple of 2^(floor(log2 size) - 3): at
  most 8 values per octave, 12.5% padding at most (`_bucket_below(m)`, of an m,
  is a value it keeps)."""
  estimate = tf.cast(tf.math.floor(tf.math.log(tf.cast(size, tf.float32)) / np.log(2.0)),
                     tf.int32)
  power = tf.bitwise.left_shift(1, estimate)   # float rounding: one off at most
  estimate += (tf.cast(power * 2 <= size, tf.int32) - tf.cast(power > size, tf.int32))
  step = tf.bitwise.left_shift(1, tf.maximum(0, estimate - 3))
  return -(-size // step) * step


def _bucket_below(most: int) -> int:
  """The largest value of `_bucket` at most `most` (>= 1)."""
  step = 1 << max(0, most.bit_length() - 4)
  return most // step * step


def _compiled_linear_sums(model, config):
  """A chunk's clipped penalized sums per silo ([K + 1, ...]) through the model's
  linear form (`local_training.linear_clipped_penalized_sums`), compiled by XLA:
  the examples' gathers, norms and sums fused into a few passes (about 2x the
  uncompiled ops on School's DP step, benchmarks/RESULTS.md); one compilation per
  chunk shape (`_bucket` keeps them few)."""

  @tf.function(jit_compile=True, autograph=False)
  def sums(weights, penalty, x, y, ids, chunk_rows, grid=None, bound=None):
    num_segments = tf.shape(weights[0])[0]
    examples = _rows_of(x, y, tf.minimum(ids, num_segments - 2), chunk_rows)
    if grid is not None:   # integer noise: grid and bound per example
      return lt.linear_integer_penalized_sums(model, config, weights, penalty,
                                              *examples, grid, bound, ids, num_segments)
    return lt.linear_clipped_penalized_sums(model, config, weights, penalty,
                                            *examples, ids, num_segments)

  return sums


def _dp_gradients(model, config, weights, anchor, lam, silos, silo_of, row, noise,
                  normalizer, count=None):
  """`local_training.step_gradient` under DP for every silo: the step's examples
  (`_examples`) as one flat list, each with its silo's weights, their clipped
  penalized gradients summed per silo (`clipped_penalized_sum`; with the model's
  linear form, `linear_clipped_penalized_sums`; with its stacked form,
  `_by_silo_sums`), noised and normalized (`noised_step`). The list
  goes through in chunks of at most `chunk_examples` examples (padding points at a
  dropped extra silo); with `count` (`_static_examples`' list, static shapes) in
  chunks of a static size until `count` examples are covered."""
  num_silos = tf.shape(silos.n)[0]
  penalty = [rows(lam, w) * (w - a) for w, a in zip(weights, anchor)]
  most = chunk_examples(model, static=count is not None)
  if config.integer_noise:
    most = min(most, integer_gaussian.MAX_SUMMED)
  extra = lambda t: tf.pad(t, [[0, 1]] + [[0, 0]] * (len(t.shape) - 1))   # silo K
  weights, penalty = [extra(w) for w in weights], [extra(p) for p in penalty]

  linear = model.linear_form_fn is not None
  integer = config.integer_noise
  if linear:
    linear_sums = _compiled_linear_sums(model, config)
  if integer:   # the extra silo's examples round to its grid and are dropped
    grid = tf.concat([noise.grid, [1.0]], 0)
    bound = tf.concat([noise.bound, tf.zeros([1], tf.int64)], 0)

  def chunk_sums(ids, chunk_rows):
    if linear and integer:
      return [linear_sums(weights, penalty, silos.x, silos.y, ids, chunk_rows,
                          tf.gather(grid, ids), tf.gather(bound, ids))]
    if linear:
      return linear_sums(weights, penalty, silos.x, silos.y, ids, chunk_rows)
    if integer:   # every example's gradient formed, to round it
      per_example = _own_copy_gradients(
          model, [tf.gather(w, ids) for w in weights],
          *_rows_of(silos.x, silos.y, tf.minimum(ids, num_silos - 1), chunk_rows))
      return [lt.integer_penalized_sums(config, per_example, penalty,
                                        tf.gather(grid, ids), tf.gather(bound, ids),
                                        ids, num_silos + 1)]
    if model.stacked_per_example_gradients_fn is not None:
      return _by_silo_sums(model, config, weights, penalty, silos, ids, chunk_rows,
                           static=count is not None)
    per_example = _own_copy_gradients(
        model, [tf.gather(w, ids) for w in weights],
        *_rows_of(silos.x, silos.y, tf.minimum(ids, num_silos - 1), chunk_rows))
    return lt.clipped_penalized_sum(config, per_example, penalty, ids, num_silos + 1)

  def add_chunk(sums, chunk):
    return [s + p for s, p in zip(sums, chunk_sums(*chunk))]

  zeros = ([tf.zeros([num_silos + 1, sum(w.shape[1:].num_elements() for w in weights)],
                     tf.int64)] if integer else [tf.zeros_like(w) for w in weights])
  if count is None:
    if linear:   # a few compiled shapes, not one per step's example count
      most = _bucket_below(most)
    length = tf.shape(silo_of)[0]
    chunks = tf.maximum(1, -(-length // most))
    size = tf.maximum(1, -(-length // chunks))
    if linear:   # at most `most` still
      size = _bucket(size)
    pad = chunks * size - length
    silo_of = tf.reshape(tf.pad(silo_of, [[0, pad]], constant_values=num_silos),
                         [chunks, size])
    row = tf.reshape(tf.pad(row, [[0, pad]]), [chunks, size])
    sums = tf.foldl(add_chunk, (silo_of, row), parallel_iterations=1,
                    initializer=zeros)
  else:
    pad = -tf.shape(silo_of)[0] % most
    silo_of = tf.pad(silo_of, [[0, pad]], constant_values=num_silos)
    row = tf.pad(row, [[0, pad]])
    _, sums = tf.while_loop(
        lambda start, sums: start < count,
        lambda start, sums: (start + most, add_chunk(
            sums, (tf.slice(silo_of, [start], [most]), tf.slice(row, [start], [most])))),
        (tf.constant(0), zeros))
  if integer:
    return lt.integer_step(sums[0][:num_silos], noise.draws, noise.grid,
                           [tuple(w.shape[1:]) for w in weights], normalizer)
  return lt.noised_step([s[:num_silos] for s in sums], noise, normalizer)


def _gradients(model, config, weights, anchor, lam, xb, yb, mask):
  """`local_training.step_gradient` without DP for every silo (batches [K, b, ...],
  `mask` [K, b] their real examples): through the model's `stacked_apply_fn`, or
  `step_gradient` mapped over the silos."""
  if model.stacked_apply_fn is None:
    return tf.vectorized_map(
        lambda a: lt.step_gradient(model, config, a[0], a[1], a[5], a[2], a[3], None,
                                   None, a[4]),
        (weights, anchor, xb, yb, mask, lam))
  with tf.GradientTape() as tape:
    tape.watch(weights)
    losses = model.loss_fn(model.stacked_apply_fn(weights, xb), yb)
    loss = tf.reduce_sum(model.objective(losses, mask))
  return [g + rows(lam, w) * (w - a)
          for g, w, a in zip(tape.gradient(loss, weights), weights, anchor)]


def _active_steps(model, config, weights, anchor, lam, lr, silos, idx, mask, active):
  """A step without DP of the `active` silos alone (batches `idx`, `mask` [K, b]):
  their batches gathered, their gradients (`_gradients`) and updates; the other
  silos' weights unchanged."""
  on = tf.cast(tf.where(active)[:, 0], tf.int32)
  own = lambda t: tf.gather(t, on)
  grads = _gradients(model, config, [own(w) for w in weights], [own(a) for a in anchor],
                     own(lam), *_rows_of(silos.x, silos.y, on[:, None], own(idx)),
                     own(mask))
  return [tf.tensor_scatter_nd_update(w, on[:, None], own(w) - rows(own(lr), g) * g)
          for w, g in zip(weights, grads)]


# The DP path's working set per step, in floats: above it the step's examples go
# through in chunks (`chunk_examples`), one chunk at a time.
MEMORY_BUDGET_FLOATS = 2 ** 27   # 512 MB of float32
# Floats the DP path holds per example, per parameter of the model, rounded up from
# the CNN on 28x28 images (benchmarks/RESULTS.md): with each example's own copy of
# its silo's weights (the copies, their gradients, activations, TF's temporaries)
# ~6.5 (issue 12); through the model's stacked per-example gradients (activations,
# convolutions' per-example kernel gradients; dense kernels' never formed) ~1.9
# (issue 30).
WORKING_SET_PER_COPY = 8
WORKING_SET_STACKED = 3
# The examples per chunk of an XLA-compiled DP step (static shapes: every chunk is
# this long, the last one's unused slots padding), at most: a step computes fewer
# than this many padded examples' gradients beyond its own.
STATIC_CHUNK_EXAMPLES = 512


def chunk_examples(model, static: bool = False) -> int:
  """The most examples per chunk of the DP path: as many as keep the path's working
  set (`WORKING_SET_STACKED` or `WORKING_SET_PER_COPY` x parameters floats each)
  within `MEMORY_BUDGET_FLOATS`, at least 1 (`static`: the XLA path, at most
  `STATIC_CHUNK_EXAMPLES`, its stacked form one example per row, so each with its
  own copy of the weights)."""
  per_copy = model.stacked_per_example_gradients_fn is None or static
  per_example = model.num_parameters * (WORKING_SET_PER_COPY if per_copy
                                        else WORKING_SET_STACKED)
  most = MEMORY_BUDGET_FLOATS // per_example
  return int(np.clip(min(most, STATIC_CHUNK_EXAMPLES) if static else most, 1,
                     np.iinfo(np.int32).max))


def forward_items_per_call(model, rows_per_item: int, models_per_item: int = 1) -> int:
  """Items (silos, users) whose losses under `models_per_item` models are computed
  in one call: a forward pass holds of the order of the model's parameters per
  example (the CNN on 28x28 images), so as many as keep items x models x rows x
  parameters within `MEMORY_BUDGET_FLOATS`, at least 1."""
  per_item = max(1, models_per_item * rows_per_item * model.num_parameters)
  return max(1, MEMORY_BUDGET_FLOATS // per_item)


def map_in_chunks(fn, elems, items_per_call: int, item_signature):
  """`tf.vectorized_map(fn, elems)` over the leading dimension K, `items_per_call`
  items at a time (a `tf.map_fn` over chunks; the last chunk filled with repeats of
  the first items, whose outputs are dropped): the same values in a bounded working
  set. `item_signature`: the `tf.TensorSpec`s of one item's outputs."""
  flat = tf.nest.flatten(elems)
  if items_per_call >= (flat[0].shape[0] or np.iinfo(np.int32).max):
    return tf.vectorized_map(fn, elems)
  k = tf.shape(flat[0])[0]
  chunks = (k + items_per_call - 1) // items_per_call
  order = tf.range(chunks * items_per_call) % k
  chunked = tf.nest.map_structure(
      lambda t: tf.reshape(tf.gather(t, order),
                           tf.concat([[chunks, items_per_call], tf.shape(t)[1:]], 0)),
      elems)
  out = tf.map_fn(lambda e: tf.vectorized_map(fn, e), chunked,
                  fn_output_signature=tf.nest.map_structure(
                      lambda spec: tf.TensorSpec([items_per_call, *spec.shape],
                                                 spec.dtype), item_signature))
  return tf.nest.map_structure(
      lambda t: tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))[:k], out)


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

  sampler = (ps.PoissonSampler(plan[3], silos.n)
             if config.private and config.batches == "poisson" else None)
  static = xla.compiling()

  def noise(step):
    if config.integer_noise:
      return integer_gaussian.step_noise(br.fold_in(noise_keys, step), sum(sizes),
                                         silos.noise_multiplier, config.l2_norm_clip,
                                         integer_gaussian.eager_table())
    stddev = silos.noise_multiplier * config.l2_norm_clip
    flat = gaussian.normal(br.fold_in(noise_keys, step), sum(sizes)) * stddev[:, None]
    return [tf.reshape(part, [-1, *s]) for part, s in zip(tf.split(flat, sizes, 1), shapes)]

  def body(step, w, perm):
    if config.batches == "shuffle":
      perm = _epoch_permutations(plan, silos.n, num_rows, shuffle_keys, step, perm)
    active = step < total_steps   # a silo past its steps keeps its weights
    if config.private:
      # Only the active silos' examples are trained on (silos have their own step
      # counts: under public sizes, floor(n_k / B)); the draws are every silo's.
      silo_of, row, count = (_static_examples if static else _examples)(
          config, plan, silos.n, num_rows, sampling_keys, perm, step, sampler, active)
      grads = _dp_gradients(model, config, w, anchor, lam, silos, silo_of, row,
                            noise(step), normalizer, count)
    else:
      idx, mask = _batches(config, plan, silos.n, num_rows, sampling_keys, perm, step,
                           static)
      if not static:   # the active silos' steps only (silos' step counts differ)
        return step + 1, _active_steps(model, config, w, anchor, lam, lr, silos, idx,
                                       mask, active), perm
      grads = _gradients(model, config, w, anchor, lam,
                         tf.gather(silos.x, idx, batch_dims=1),
                         tf.gather(silos.y, idx, batch_dims=1), mask)
    return step + 1, [tf.where(rows(active, wi), wi - rows(lr, wi) * gi, wi)
                      for wi, gi in zip(w, grads)], perm

  _, weights, _ = tf.while_loop(
      lambda step, *_: step < tf.reduce_max(total_steps), body,
      (tf.constant(0), weights, tf.zeros_like(silos.y, tf.int32)))
  return weights
