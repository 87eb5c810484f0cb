"""The vectorized backend: every silo's round as one TensorFlow program.

TFF's runtime runs each client's work as its own session call in a CPU-only worker
(DESIGN.md sec. 9): ~0.7 ms per client per intrinsic, no GPU. Here the silos' tensors
are stacked along a leading silo axis (padded to the largest silo, with each silo's
n_k, public size, noise multiplier and key kept apart) and a round of the MR-MTL
family is one `tf.function` on whatever device TensorFlow has. It computes what the
TFF process computes, from the same definitions: the round's logic
(`rounds.client_round`, `rounds.server_step`), the batch plan and the step's
gradient (`local_training.batch_plan`, `step_gradient`, vectorized over silos with
`tf.vectorized_map`), and the same random numbers: `tff_silo.batched_random` draws
row k exactly as TF's stateless ops draw with silo k's key, and a padded silo's
draw of N values starts with its own n values. Parity with the TFF backend is tested
in tests/test_vectorized.py.

Padding: silo k's rows past n_k are never sampled (Poisson keeps only i < n_k;
permutations sort them last) and padded batch slots carry mask 0, so they add
nothing to a clipped sum. A step's batch is as wide as the largest batch of the step
across silos, so the work is about what the silos would do alone.

Gradients: a model with `stacked_apply_fn` (the CNN: grouped convolutions) is run for
all silos at once, under DP with one copy of its silo's weights per example (memory:
silos x batch width x parameters floats per step, ~55 MB for the digits CNN; nothing
chunks larger models yet); other models map `step_gradient` over silos.

Supported: local, FedAvg, finetune, MR-MTL and Ditto (`SiloAlgorithm`s, or the
`SiloProcess`es built from them) with the weighted or unweighted mean
(`rounds.plain_mean`). Other processes (IFCA, d-private clustering, the
hypernetwork) and other aggregators run on the TFF backend; `VectorizedProcess` says
so in one line.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys
from tff_silo.algorithms import local_training as lt
from tff_silo.algorithms.rounds import SiloAlgorithm, client_round, server_step


class StackedSilos(NamedTuple):
  """Every silo's `SiloInput`, stacked: x [K, N, ...] and y [K, N] zero-padded to
  the largest n, and per silo its n, public size, noise multiplier and key."""
  x: tf.Tensor
  y: tf.Tensor
  n: tf.Tensor                 # int32 [K]
  size: tf.Tensor              # float32 [K]
  noise_multiplier: tf.Tensor  # float32 [K]
  key: tf.Tensor               # int32 [K, 2]


class VectorizedState(NamedTuple):
  global_weights: tuple
  round_num: tf.Tensor


def stack_silos(inputs) -> StackedSilos:
  """Stacks a list of `SiloInput`s (padding x and y with zeros)."""
  sizes = [len(i.y) for i in inputs]
  longest = max(sizes)
  pad = lambda a: np.concatenate(
      [np.asarray(a, np.float32), np.zeros((longest - len(a), *np.shape(a)[1:]), np.float32)])
  return StackedSilos(
      x=tf.constant(np.stack([pad(i.x) for i in inputs])),
      y=tf.constant(np.stack([pad(i.y) for i in inputs])),
      n=tf.constant(sizes, tf.int32),
      size=tf.constant([i.size for i in inputs], tf.float32),
      noise_multiplier=tf.constant([i.noise_multiplier for i in inputs], tf.float32),
      key=tf.constant(np.stack([i.seed for i in inputs]), tf.int32))


def definition(process) -> SiloAlgorithm | None:
  """The `SiloAlgorithm` a process or definition runs (None outside the family)."""
  return process if isinstance(process, SiloAlgorithm) else getattr(
      process, "algorithm", None)


def unsupported_reason(process) -> str | None:
  """Why `process` (a `SiloProcess` or `SiloAlgorithm`) cannot run on the vectorized
  backend, or None if it can."""
  algorithm = definition(process)
  if algorithm is None:
    return (f"the vectorized backend runs local, fedavg, finetune, mrmtl and ditto; "
            f"{getattr(process, 'name', type(process).__name__)} runs on backend=tff")
  if algorithm.aggregation is None:
    return ("the vectorized backend computes the weighted and unweighted mean only; "
            "other tff.aggregators factories run on backend=tff")
  if algorithm.model.batch_reduction is not None:
    return (f"{algorithm.model.name}'s objective is not a mean over examples; "
            "it runs on backend=tff")
  return None


def _rows(mask, like):
  """A [K] boolean broadcast against a [K, ...] tensor."""
  return tf.reshape(mask, [-1] + [1] * (len(like.shape) - 1))


def _batches(config, plan, n, num_rows, sampling_keys, shuffle_keys, step):
  """Each silo's batch of step `step`: (indices [K, b], mask [K, b]), b the widest
  batch of this step; the same examples as `train_locally` draws for each silo."""
  batch, per_epoch, _, rate = plan
  rows = tf.range(num_rows)[None]
  valid = rows < n[:, None]
  if config.private and config.sampling == "poisson":
    keep = (br.uniform(br.fold_in(sampling_keys, step), num_rows) < rate[:, None]) & valid
    count = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    width = tf.maximum(tf.reduce_max(count), 1)
    order = tf.argsort(tf.cast(keep, tf.int32), axis=1, direction="DESCENDING",
                       stable=True)   # kept rows first, in index order
    return order[:, :width], tf.cast(tf.range(width)[None] < count[:, None], tf.float32)
  width = tf.reduce_max(batch)
  slots = tf.range(width)[None]
  if config.private and config.sampling == "without_replacement":
    draws, start = br.uniform(br.fold_in(sampling_keys, step), num_rows), 0
  else:   # shuffled epochs
    draws = br.uniform(br.fold_in(shuffle_keys, step // per_epoch), num_rows)
    start = ((step % per_epoch) * batch)[:, None]
  perm = lt.random_permutation(tf.where(valid, draws, 2.0))
  positions = tf.minimum(start + slots + tf.zeros_like(batch)[:, None], num_rows - 1)
  return (tf.gather(perm, positions, batch_dims=1),
          tf.cast(slots < batch[:, None], tf.float32))


def _stacked_gradients(model, config, weights, anchor, lam, xb, yb, noise, normalizer,
                       mask):
  """`local_training.step_gradient` of every silo through the model's
  `stacked_apply_fn`. Under DP each example gets its own copy of its silo's weights,
  so the gradient with respect to the copies is the per-example gradient."""
  penalty = [lam * (w - a) for w, a in zip(weights, anchor)]
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


def train_silos(model, config, weights, anchor, lam, silos: StackedSilos, round_keys,
                pass_):
  """`train_locally` for every silo at once: weights and anchor [K, ...]; returns the
  new weights (a list)."""
  weights = list(weights)
  num_rows = tf.shape(silos.y)[1]
  plan = lt.batch_plan(config, silos.n, silos.size)
  batch, _, total_steps, _ = plan
  sampling_keys = br.derive(round_keys, keys.SAMPLING, pass_)
  shuffle_keys = br.derive(round_keys, keys.SHUFFLE, pass_)
  noise_keys = br.derive(round_keys, keys.DP_NOISE, pass_)
  normalizer = tf.cast(batch, tf.float32)
  lr = tf.constant(config.learning_rate, tf.float32)
  shapes = [tuple(s) for s in model.weight_shapes]
  sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]

  def noise(step):
    stddev = silos.noise_multiplier * config.l2_norm_clip
    flat = br.normal(br.fold_in(noise_keys, step), sum(sizes)) * stddev[:, None]
    return [tf.reshape(part, [-1, *s]) for part, s in zip(tf.split(flat, sizes, 1), shapes)]

  def body(step, w):
    idx, mask = _batches(config, plan, silos.n, num_rows, sampling_keys, shuffle_keys,
                         step)
    xb = tf.gather(silos.x, idx, batch_dims=1)
    yb = tf.gather(silos.y, idx, batch_dims=1)
    step_noise = noise(step) if config.private else None
    if model.stacked_apply_fn is not None:
      grads = _stacked_gradients(model, config, w, anchor, lam, xb, yb, step_noise,
                                 normalizer, mask)
    elif config.private:
      grads = tf.vectorized_map(
          lambda a: lt.step_gradient(model, config, a[0], a[1], lam, a[2], a[3], a[4],
                                     a[5], a[6]),
          (w, anchor, xb, yb, step_noise, normalizer, mask))
    else:
      grads = tf.vectorized_map(
          lambda a: lt.step_gradient(model, config, a[0], a[1], lam, a[2], a[3], None,
                                     None, a[4]),
          (w, anchor, xb, yb, mask))
    active = step < total_steps
    return step + 1, [tf.where(_rows(active, wi), wi - lr * gi, wi)
                      for wi, gi in zip(w, grads)]

  _, weights = tf.while_loop(lambda step, _: step < tf.reduce_max(total_steps), body,
                             (tf.constant(0), weights))
  return weights


_ROUND_FUNCTIONS = {}   # one traced round per algorithm definition, for all runs


def _definition(algorithm: SiloAlgorithm) -> tuple:
  """What a round's program depends on besides its tensors. A model is identified by
  its fields, functions by their code (a fresh `linear_regression(d)` per run is
  the same model)."""
  model = algorithm.model
  fields = tuple(getattr(value, "__code__", value)
                 for value in (getattr(model, f.name) for f in dataclasses.fields(model)))
  return (fields, algorithm.config, algorithm.round_spec, algorithm.aggregation)


def _round_function(algorithm: SiloAlgorithm):
  """The traced round of `algorithm`, shared by every run of the same definition: a
  sweep over seeds and epsilons traces it once (n, sizes, noise multipliers and
  keys are tensors, so only new shapes retrace)."""
  key = _definition(algorithm)
  if key not in _ROUND_FUNCTIONS:
    model, config = algorithm.model, algorithm.config
    spec, aggregation = algorithm.round_spec, algorithm.aggregation

    def round_fn(global_w, round_num, personal_w, silos: StackedSilos):
      num_silos = tf.shape(silos.n)[0]
      global_b = [tf.broadcast_to(g[None], tf.concat([[num_silos], tf.shape(g)], 0))
                  for g in global_w]
      round_keys = br.fold_in(silos.key, round_num)
      train = lambda w, lam, pass_: train_silos(model, config, w, global_b, lam, silos,
                                                round_keys, pass_)
      personal, delta = client_round(spec, global_b, personal_w, round_num, train)
      if aggregation == "weighted_mean":   # public sizes, as the TFF process weighs
        weight = tf.where(silos.size > 0, silos.size, tf.cast(silos.n, tf.float32))
      else:
        weight = tf.ones_like(silos.size)
      mean = [tf.reduce_sum(_rows(weight, d) * d, axis=0) / tf.reduce_sum(weight)
              for d in delta]
      new_global, new_round = server_step(spec, global_w, round_num, mean)
      return new_global, new_round, tuple(personal)

    _ROUND_FUNCTIONS[key] = tf.function(round_fn, autograph=False, reduce_retracing=True)
  return _ROUND_FUNCTIONS[key]


class VectorizedProcess:
  """A `SiloProcess` or `SiloAlgorithm` run with all silos in one TF program per
  round.

  The driver (`tff_silo.simulation.run_simulation(backend="vectorized")`) uses it as
  it uses a process: `prepare` stacks the silos once, `initialize` / `next` run
  rounds with client states stacked on a leading silo axis.
  """

  def __init__(self, process):
    reason = unsupported_reason(process)
    if reason is not None:
      raise ValueError(reason)
    self.algorithm = algorithm = definition(process)
    self.name, self.model, self.config = algorithm.name, algorithm.model, algorithm.config
    self.epochs_per_round = algorithm.epochs_per_round
    self.num_clusters = algorithm.num_clusters
    self.selection_budget_share = algorithm.selection_budget_share
    self._round = _round_function(algorithm)

  def num_selections(self, rounds: int) -> int:
    return self.algorithm.num_selections(rounds)

  def prepare(self, inputs) -> StackedSilos:
    return stack_silos(inputs)

  def initialize(self) -> VectorizedState:
    return VectorizedState(tuple(tf.constant(w) for w in self.algorithm.initial_weights),
                           tf.constant(0, tf.int32))

  def initial_client_states(self, state, num_silos: int) -> tuple:
    return tuple(tf.tile(w[None], [num_silos] + [1] * len(w.shape))
                 for w in state.global_weights)

  def next(self, state: VectorizedState, client_states, silos: StackedSilos):
    new_global, new_round, personal = self._round(
        state.global_weights, state.round_num, client_states, silos)
    return VectorizedState(tuple(new_global), new_round), personal, {}

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    num_silos = int(client_states[0].shape[0])
    if self.algorithm.uses_client_state(rounds_done):
      return [tuple(w[k].numpy() for w in client_states) for k in range(num_silos)]
    return [tuple(w.numpy() for w in state.global_weights)] * num_silos

  def cluster_assignments(self, client_states):
    del client_states
    return None
