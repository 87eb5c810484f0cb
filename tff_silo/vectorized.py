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
row k exactly as TF's stateless ops draw with silo k's key, the DP noise is
`privacy.gaussian.normal` of those keys (as the TFF process draws it), and a padded
silo's draw of N values starts with its own n values. Parity with the TFF backend is tested
in tests/test_vectorized.py.

Padding: silo k's rows past n_k are never sampled (Poisson keeps only i < n_k;
permutations sort them last) and padded batch slots carry mask 0, so they add
nothing to a clipped sum. A step's batch is as wide as the largest batch of the step
across silos, so the work is about what the silos would do alone.

Gradients: a model with `stacked_apply_fn` (the CNN: grouped convolutions) is run for
all silos at once, under DP with one copy of its silo's weights per example (memory:
silos x batch width x parameters floats per step, ~55 MB for the digits CNN, and
about `WORKING_SET_PER_COPY` times that in all); when that would pass
`MEMORY_BUDGET_FLOATS` (batch_size as the width), the silos go through in even
chunks that fit, one after another. Other models map `step_gradient` over
silos.

Supported: local, FedAvg, finetune, MR-MTL and Ditto (`SiloAlgorithm`s) with the
weighted or unweighted mean (`rounds.plain_mean`), and IFCA with its preconditioned
methods (`ifca.ClusteredAlgorithm`s: cluster scores of all silos in one
`vectorized_map`, the Gumbel noise of report-noisy-min from `batched_random.uniform64`)
with the weighted mean; d-private clustered FL (`DPrivateClusteringAlgorithm`: the
sampled users' updates as a `map_fn`, k-means stacked); or the TFF processes built
from these. Other aggregators run on the TFF backend; `for_process` says so in one
line. The hypernetwork's round (`hypernet.vectorized`) uses `train_silos`.
"""

from __future__ import annotations

import collections

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import keys
from tff_silo.algorithms import dprivate_clustering as dpc
from tff_silo.algorithms import ifca
from tff_silo.algorithms import local_training as lt
from tff_silo.algorithms.rounds import SiloAlgorithm, client_round, server_step
from tff_silo.data.silos import padded_stack
from tff_silo.privacy import gaussian
from tff_silo.privacy.selection import gumbel_of


class StackedSilos(NamedTuple):
  """Every silo's `SiloInput`, stacked: x [K, N, ...] and y [K, N] zero-padded to
  the largest n, and per silo its n, public size, noise multiplier, key and
  selection epsilon."""
  x: tf.Tensor
  y: tf.Tensor
  n: tf.Tensor                 # int32 [K]
  size: tf.Tensor              # float32 [K]
  noise_multiplier: tf.Tensor  # float32 [K]
  key: tf.Tensor               # int32 [K, 2]
  selection_epsilon: tf.Tensor  # float32 [K]

  @property
  def public_size(self):
    """Each silo's public size m_k (`rounds.public_size` of every silo)."""
    return tf.where(self.size > 0, self.size, tf.cast(self.n, tf.float32))


class VectorizedState(NamedTuple):
  global_weights: tuple   # [R, ...]: the global model of each stacked run
  round_num: tf.Tensor


def stack_silos(inputs) -> StackedSilos:
  """Stacks a list of `SiloInput`s (padding x and y with zeros)."""
  return StackedSilos(
      x=tf.constant(padded_stack([i.x for i in inputs])),
      y=tf.constant(padded_stack([i.y for i in inputs])),
      n=tf.constant([len(i.y) for i in inputs], tf.int32),
      size=tf.constant([i.size for i in inputs], tf.float32),
      noise_multiplier=tf.constant([i.noise_multiplier for i in inputs], tf.float32),
      key=tf.constant(np.stack([i.seed for i in inputs]), tf.int32),
      selection_epsilon=tf.constant([i.selection_epsilon for i in inputs], tf.float32))


_DEFINITIONS = (SiloAlgorithm, ifca.ClusteredAlgorithm, dpc.DPrivateClusteringAlgorithm)


def definition(process):
  """The definition (`SiloAlgorithm`, `ifca.ClusteredAlgorithm`,
  `dprivate_clustering.DPrivateClusteringAlgorithm`) a process or definition runs
  (None for the hypernetwork)."""
  algorithm = process if isinstance(process, _DEFINITIONS) else getattr(
      process, "algorithm", None)
  return algorithm if isinstance(algorithm, _DEFINITIONS) else None


def unsupported_reason(process) -> str | None:
  """Why `process` (a process or a definition) cannot run on the vectorized
  backend, or None if it can."""
  algorithm = definition(process)
  if algorithm is None:
    return (f"the vectorized backend runs local, fedavg, finetune, mrmtl, ditto, the "
            f"ifca methods and dprivate_clustering; "
            f"{getattr(process, 'name', type(process).__name__)} is none of them (the "
            f"hypernetwork runs on either backend with hypernet.run_hypernet)")
  if isinstance(algorithm, dpc.DPrivateClusteringAlgorithm):
    return None   # users are mapped one by one: any model, any objective
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


# The DP stacked path's working set per step, in floats: above it the silos go
# through in chunks (`_chunk_silos`), one chunk at a time.
MEMORY_BUDGET_FLOATS = 2 ** 27   # 512 MB of float32
# Floats the DP stacked path holds per float of its per-example weight copies (the
# copies, their gradients, activations and TF's temporaries): measured ~6.5 for the
# CNN on 28x28 images (benchmarks/RESULTS.md, issue 12), rounded up.
WORKING_SET_PER_COPY = 8


def _chunk_silos(model, config) -> int:
  """The most silos per chunk of the DP stacked path: as many as keep
  `WORKING_SET_PER_COPY` x batch_size x parameters floats each within
  `MEMORY_BUDGET_FLOATS` (Poisson batches vary around batch_size, so the bound is
  about, not exact), at least 1."""
  per_silo = WORKING_SET_PER_COPY * config.batch_size * model.num_parameters
  return int(np.clip(MEMORY_BUDGET_FLOATS // per_silo, 1, np.iinfo(np.int32).max))


def _in_chunks(fn, most: int, tensors, num_outputs: int):
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

      def stacked(parts):   # w, anchor, noise, then xb, yb, normalizer, mask
        ws, anchors, noises = (parts[i * num_layers:(i + 1) * num_layers]
                               for i in range(3))
        x_, y_, norm_, mask_ = parts[3 * num_layers:]
        return _stacked_gradients(model, config, ws, anchors, lam, x_, y_, noises,
                                  tf.maximum(norm_, 1.0), mask_)

      parts = [*w, *anchor, *step_noise, xb, yb, normalizer, mask]
      chunk = _chunk_silos(model, config)
      grads = tf.cond(tf.shape(yb)[0] <= chunk, lambda: stacked(parts),
                      lambda: _in_chunks(stacked, chunk, parts, num_layers))
    elif model.stacked_apply_fn is not None:
      grads = _stacked_gradients(model, config, w, anchor, lam, xb, yb, None,
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
                      for wi, gi in zip(w, grads)], perm

  _, weights, _ = tf.while_loop(
      lambda step, *_: step < tf.reduce_max(total_steps), body,
      (tf.constant(0), weights, tf.zeros_like(silos.y, tf.int32)))
  return weights


# One traced round per algorithm definition, for all runs; the least recently used
# are released beyond `MAX_PROGRAMS` (a traced program keeps its graph, its
# optimized copies and what it captures alive).
_ROUND_FUNCTIONS = collections.OrderedDict()
MAX_PROGRAMS = 4


def _definition(algorithm) -> tuple:
  """What a round's program depends on besides its tensors (the model by its
  `computation_key`)."""
  fields = algorithm.model.computation_key
  if isinstance(algorithm, dpc.DPrivateClusteringAlgorithm):
    return (fields, algorithm.config, "dprivate", algorithm.num_clusters, algorithm.nu,
            algorithm.kmeans_iterations)
  spec = (algorithm.round_spec if isinstance(algorithm, SiloAlgorithm)
          else algorithm.cluster_spec)
  return (fields, algorithm.config, spec, algorithm.aggregation, MEMORY_BUDGET_FLOATS)


def _family_round(algorithm: SiloAlgorithm):
  """A round of the MR-MTL family (`rounds.client_round`, `rounds.server_step`) for
  the stacked silos of one or more runs: `run` (int32 [K]) is each silo's run,
  `global_w` holds one global model per run ([R, ...]) and each run's server mean
  is over its own silos; a run not `active` (bool [R]) keeps its models."""
  model, config = algorithm.model, algorithm.config
  spec, aggregation = algorithm.round_spec, algorithm.aggregation

  def round_fn(global_w, round_num, personal_w, silos: StackedSilos, run, active):
    num_runs = tf.shape(active)[0]
    global_b = [tf.gather(g, run) for g in global_w]
    round_keys = br.fold_in(silos.key, round_num)
    train = lambda w, lam, pass_: train_silos(model, config, w, global_b, lam, silos,
                                              round_keys, pass_)
    personal, delta = client_round(spec, global_b, personal_w, round_num, train)
    if aggregation == "weighted_mean":   # public sizes, as the TFF process weighs
      weight = silos.public_size
    else:
      weight = tf.ones_like(silos.size)
    total = tf.math.unsorted_segment_sum(weight, run, num_runs)
    mean = [tf.math.unsorted_segment_sum(_rows(weight, d) * d, run, num_runs)
            / _rows(total, d) for d in delta]
    new_global, new_round = server_step(spec, global_w, round_num, mean)
    silo_active = tf.gather(active, run)
    return (tuple(tf.where(_rows(active, n), n, g) for n, g in zip(new_global, global_w)),
            new_round,
            tuple(tf.where(_rows(silo_active, n), n, p)
                  for n, p in zip(personal, personal_w)))

  return round_fn


def _cluster_round(algorithm: ifca.ClusteredAlgorithm):
  """A round of IFCA or an IFCA-preconditioned method (`ifca.cluster_client_round`,
  `ifca.choose`, `ifca.cluster_server_step`); each cluster's delta is the mean of
  its members' deltas weighted by their public sizes."""
  model, config, spec = algorithm.model, algorithm.config, algorithm.cluster_spec
  num_clusters = algorithm.num_clusters

  def round_fn(clusters, round_num, personal_w, cluster, silos: StackedSilos):
    round_keys = br.fold_in(silos.key, round_num)
    size = silos.public_size

    def select():
      mask = tf.cast(tf.range(tf.shape(silos.y)[1])[None] < silos.n[:, None],
                     tf.float32)
      scores, sensitivity = tf.vectorized_map(
          lambda a: ifca.selection_scores(model, clusters, a[0], a[1], spec.loss_clip,
                                          a[2], a[3]),
          (silos.x, silos.y, size, mask))
      noise = gumbel_of(br.uniform64(br.derive(round_keys, keys.SELECTION, 0),
                                     num_clusters))
      return ifca.choose(config.private, scores, silos.selection_epsilon, sensitivity,
                         noise)

    train = lambda begin, anchor, lam: train_silos(model, config, begin, anchor, lam,
                                                   silos, round_keys, 0)
    personal, cluster, delta = ifca.cluster_client_round(
        spec, clusters, personal_w, cluster, round_num, select, train)
    member = tf.one_hot(cluster, num_clusters)   # [K, G]
    mean_deltas = []
    for g in range(num_clusters):
      weight, inside = size * member[:, g], tf.equal(cluster, g)
      mean_deltas.append(tuple(
          tf.math.divide_no_nan(
              tf.reduce_sum(_rows(weight, d) * tf.where(_rows(inside, d), d, 0.0), 0),
              tf.reduce_sum(weight))
          for d in delta))
    new_clusters = ifca.cluster_server_step(clusters, mean_deltas,
                                            tf.reduce_sum(member, axis=0))
    return new_clusters, round_num + 1, tuple(personal), cluster

  return round_fn


def _dprivate_round(algorithm: dpc.DPrivateClusteringAlgorithm):
  """A round of d-private clustered FL over the sampled users (`users`, int32
  [U]): each user's `dprivate_clustering.user_update` on its own rows (a `map_fn`
  over users, independent iterations run in parallel), then k-means on the
  released models as one stacked computation (`kmeans_members`, `recentre`)."""
  signature = tuple(tf.TensorSpec(s, tf.float32) for s in algorithm.model.weight_shapes)

  def round_fn(hypotheses, round_num, silos: StackedSilos, users):
    def one(k):
      n = silos.n[k]
      return tuple(dpc.user_update(algorithm, hypotheses, silos.x[k][:n],
                                   silos.y[k][:n], keys.fold_in(silos.key[k], round_num)))
    released = tf.map_fn(one, users, fn_output_signature=signature)   # [U, ...]
    centres = hypotheses
    for _ in range(algorithm.kmeans_iterations):
      member = dpc.kmeans_members(centres, released)   # [U, k]
      sums = tuple(tuple(tf.reduce_sum(_rows(member[:, j], w) * w, axis=0)
                         for w in released) for j in range(algorithm.num_clusters))
      centres = dpc.recentre(centres, sums, tf.reduce_sum(member, axis=0))
    return centres, round_num + 1

  return round_fn


def _round_function(algorithm):
  """The traced round of `algorithm`, shared by every run of the same definition: a
  sweep over seeds and epsilons traces it once (n, sizes, noise multipliers and
  keys are tensors, so only new shapes retrace)."""
  key = _definition(algorithm)
  if key not in _ROUND_FUNCTIONS:
    make = (_family_round if isinstance(algorithm, SiloAlgorithm) else _cluster_round
            if isinstance(algorithm, ifca.ClusteredAlgorithm) else _dprivate_round)
    _ROUND_FUNCTIONS[key] = tf.function(make(algorithm), autograph=False,
                                        reduce_retracing=True)
    while len(_ROUND_FUNCTIONS) > MAX_PROGRAMS:
      _ROUND_FUNCTIONS.popitem(last=False)
  _ROUND_FUNCTIONS.move_to_end(key)
  return _ROUND_FUNCTIONS[key]


def release_programs() -> None:
  """Drops every traced round (and the memory it holds); the next run traces again."""
  _ROUND_FUNCTIONS.clear()


class _Runner:
  """What the vectorized runners of the MR-MTL family and IFCA share: the driver
  (`tff_silo.simulation`) uses one as it uses a TFF process: `prepare` stacks the
  silos once, `initialize` / `next` run rounds with client states stacked on a
  leading silo axis."""

  def __init__(self, process):
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


class RunStack(NamedTuple):
  """The silos of one or more runs stacked (`VectorizedProcess.prepare_runs`)."""
  silos: StackedSilos
  run: tf.Tensor    # int32 [K]: each silo's run


def stack_key(process) -> tuple:
  """Runs whose definitions have equal keys can be stacked into one program
  (`VectorizedProcess.prepare_runs`): they differ only in tensors (data, noise
  multipliers, keys, initial weights)."""
  return _definition(definition(process))


class VectorizedProcess(_Runner):
  """A process or definition of the MR-MTL family run with all silos in one TF
  program per round (made by `for_process`, which checks what can run).

  Several runs of one definition (a sweep's epsilons and seeds) can share that
  program (`prepare_runs`): their silos are stacked, each run keeps its own global
  model, server mean, noise, keys and ledger, and the numbers are each run's own.
  """

  def __init__(self, process):
    super().__init__(process)
    self._initial = [self.algorithm.initial_weights]
    self._run = None   # each silo's run (None: one run)

  def prepare(self, inputs) -> RunStack:
    return self.prepare_runs([self.algorithm], [inputs])

  def prepare_runs(self, definitions, inputs_per_run) -> RunStack:
    """Stacks the silos of runs of `definitions` (processes or definitions of equal
    `stack_key`, for their initial weights), `inputs_per_run` their `SiloInput`s."""
    keys_ = {stack_key(d) for d in definitions}
    if keys_ != {stack_key(self.algorithm)} or len(definitions) != len(inputs_per_run):
      raise ValueError("stacked runs must have definitions of one stack_key, one per "
                       "run's inputs")
    self._initial = [definition(d).initial_weights for d in definitions]
    self._run = np.repeat(np.arange(len(definitions), dtype=np.int32),
                          [len(i) for i in inputs_per_run])
    return RunStack(stack_silos([i for inputs in inputs_per_run for i in inputs]),
                    tf.constant(self._run))

  @property
  def num_runs(self) -> int:
    return len(self._initial)

  def initialize(self) -> VectorizedState:
    return VectorizedState(
        tuple(tf.constant(np.stack([w[i] for w in self._initial]))
              for i in range(len(self._initial[0]))),
        tf.constant(0, tf.int32))

  def _silo_runs(self, num_silos: int) -> np.ndarray:
    return np.zeros(num_silos, np.int32) if self._run is None else self._run

  def initial_client_states(self, state, num_silos: int) -> tuple:
    run = self._silo_runs(num_silos)
    return tuple(tf.gather(w, run) for w in state.global_weights)

  def next(self, state: VectorizedState, client_states, data: RunStack, active=None):
    """A round of every stacked run (`active`, bool [R]: the runs that train)."""
    active = tf.ones([self.num_runs], tf.bool) if active is None else tf.constant(
        np.asarray(active, bool))
    new_global, new_round, personal = self._round(
        state.global_weights, state.round_num, client_states, data.silos, data.run,
        active)
    return VectorizedState(tuple(new_global), new_round), personal, {}

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    if self.algorithm.uses_client_state(rounds_done):
      return _unstacked(client_states)
    models = _unstacked(state.global_weights)
    return [models[r] for r in self._silo_runs(int(client_states[0].shape[0]))]

  def server_models(self, state) -> list:
    """Per stacked run, the server's models: (its global model,)."""
    return [(model,) for model in _unstacked(state.global_weights)]

  def cluster_assignments(self, client_states):
    del client_states
    return None


class ClusteredState(NamedTuple):
  cluster_weights: tuple   # G models
  round_num: tf.Tensor


class ClusteredClients(NamedTuple):
  personal: tuple          # [K, ...] each
  cluster: tf.Tensor       # int32 [K]


class VectorizedClusteredProcess(_Runner):
  """An `ifca.ClusteredAlgorithm` (or its TFF process) with all silos in one TF
  program per round."""

  def initialize(self) -> ClusteredState:
    models = self.algorithm.initial_weights
    return ClusteredState(tuple(tuple(tf.constant(w) for w in m) for m in models),
                          tf.constant(0, tf.int32))

  def initial_client_states(self, state, num_silos: int) -> ClusteredClients:
    return ClusteredClients(_tiled(state.cluster_weights[0], num_silos),
                            tf.zeros([num_silos], tf.int32))

  def next(self, state: ClusteredState, client_states, silos: StackedSilos):
    clusters, new_round, personal, cluster = self._round(
        state.cluster_weights, state.round_num, client_states.personal,
        client_states.cluster, silos)
    return (ClusteredState(tuple(tuple(c) for c in clusters), new_round),
            ClusteredClients(personal, cluster), {})

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    if self.algorithm.uses_client_state(rounds_done):
      return _unstacked(client_states.personal)
    models = [tuple(w.numpy() for w in model) for model in state.cluster_weights]
    return [models[g] for g in self.cluster_assignments(client_states)]

  def cluster_assignments(self, client_states):
    return client_states.cluster.numpy()

  def server_models(self, state) -> list:
    """Per run (one here), the server's models: the G cluster models."""
    return [tuple(tuple(w.numpy() for w in model) for model in state.cluster_weights)]


class HypothesesState(NamedTuple):
  hypotheses: tuple        # k models
  round_num: tf.Tensor


class VectorizedDPrivateClustering:
  """d-private clustered FL (a `DPrivateClusteringAlgorithm` or its TFF process) with
  a round as one TF program; `run_dprivate_clustering` drives it as it drives the TFF
  process (`prepare`, `sampled`, `initialize`, `next`)."""

  def __init__(self, process):
    self.algorithm = algorithm = definition(process)
    self.name, self.model, self.config = algorithm.name, algorithm.model, algorithm.config
    self.num_clusters, self.nu = algorithm.num_clusters, algorithm.nu
    self.layer_leakage = algorithm.layer_leakage
    self.leakage_per_participation = algorithm.leakage_per_participation
    self._round = _round_function(algorithm)

  def prepare(self, inputs) -> StackedSilos:
    return stack_silos(inputs)

  def sampled(self, silos: StackedSilos, users):
    return silos, tf.constant(np.asarray(users, np.int32))

  def initialize(self) -> HypothesesState:
    return HypothesesState(
        tuple(tuple(tf.constant(w) for w in h) for h in self.algorithm.initial_weights),
        tf.constant(0, tf.int32))

  def next(self, state: HypothesesState, data):
    silos, users = data
    hypotheses, new_round = self._round(state.hypotheses, state.round_num, silos, users)
    return HypothesesState(tuple(tuple(h) for h in hypotheses), new_round), {}


def for_process(process):
  """The vectorized runner of a process or definition (a one-line `ValueError` for
  what it cannot run: `unsupported_reason`)."""
  reason = unsupported_reason(process)
  if reason is not None:
    raise ValueError(reason)
  algorithm = definition(process)
  if isinstance(algorithm, dpc.DPrivateClusteringAlgorithm):
    return VectorizedDPrivateClustering(process)
  if isinstance(algorithm, ifca.ClusteredAlgorithm):
    return VectorizedClusteredProcess(process)
  return VectorizedProcess(process)


def _tiled(weights, num_silos: int) -> tuple:
  return tuple(tf.tile(w[None], [num_silos] + [1] * len(w.shape)) for w in weights)


def _unstacked(stacked) -> list:
  arrays = [w.numpy() for w in stacked]
  return [tuple(a[k] for a in arrays) for k in range(arrays[0].shape[0])]
