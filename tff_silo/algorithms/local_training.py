"""The one local-training routine every method uses (pure TensorFlow, no TFF).

One call runs `epochs` local epochs of (DP-)SGD on a silo's tensors, starting from
`weights`, on the objective of MR-MTL (thesis app. C.1, Algorithm 1, line 6):

    loss(w; x, y) + (lam / 2) * ||w - anchor||^2

`lam = 0` is plain local training / FedAvg client work. Under DP the penalty's
gradient lam * (w - anchor) is added to every per-example gradient before clipping,
as in the paper's code, so the whole step is one DP-SGD step on the silo's data.

Batching under DP (`tff_silo.privacy.protocol`), with m the silo's *public size*
(`size`: its n when sizes are public, else a size assumed for every silo; 0 means n):
- `poisson` (add/remove-one; the default): every step includes each example
  independently with probability floor(q 2^32) / 2^32 <= q = min(B, m) / m (a
  32-bit word per example below a threshold, `poisson_sampling`); the noisy gradient
  sum is divided by the expected batch size q m = min(B, m); max(1, floor(m / B))
  steps per epoch.
  Nothing here depends on the silo's true n.
- `without_replacement` (replace-one; n is public): every step draws min(B, n) of the
  n examples uniformly without replacement; max(1, floor(n / B)) steps per epoch.
- `shuffle`: each epoch is a random permutation cut into floor(n / B) batches of B
  (the last partial batch dropped, as in the paper's code). No RDP bound holds for
  it; rows report none (what Poisson accounting would say is shown apart).
Without DP the batches are shuffled as in `shuffle`.
`steps` replaces the epoch count by a fixed number of SGD steps (HyperNetFL's K local
steps, Nemala et al. Algorithm 1, lines 9-11); shuffled epochs follow one another.

Noise (`noise`): `integer` (the default): each clipped contribution rounded to an
integer grid and summed in integers, rounded-Gaussian noise in integers
(`privacy.integer_gaussian`; exactly as private as the Gaussian mechanism, for the
numbers computed); `idealized`: float32 Gaussian noise (`privacy.gaussian`), whose
privacy holds for real numbers only (its radius grid, issue 53). The integer path
forms every per-example gradient (the linear and stacked forms' shortcut sums do
not round each example).

Randomness: `key` is the silo's key for the round (`tff_silo.keys`); batches of step
s of pass p use derive(key, SAMPLING, p, s) (or SHUFFLE and the epoch; a Poisson
step's further chunks derive(key, SAMPLING, p, s, c), c >= 1), and the DP noise of
that step derive(key, DP_NOISE, p, s): every release has its own 64-bit key.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_silo import keys
from tff_silo.algorithms import poisson_sampling
from tff_silo.privacy import batching, dp_sgd, integer_gaussian
from tff_silo.privacy.integer_law import NOISE_MECHANISMS

SAMPLING_MODES = ("poisson", "without_replacement", "shuffle")


@dataclasses.dataclass(frozen=True)
class LocalTrainingConfig:
  """Static settings of local training, shared by all silos.

  Attributes:
    learning_rate: SGD step size (no momentum, thesis app. B.4).
    batch_size: B; the sampling rate of silo k is min(B, m_k) / m_k (m_k its
      public size, its n_k unless sizes are private).
    epochs: local epochs per call.
    l2_norm_clip: per-example clip C; None trains without DP.
    sampling: `poisson`, `without_replacement` or `shuffle` (module docstring).
    steps: if set, run exactly this many steps per call instead of `epochs` epochs.
    noise: `integer` or `idealized` (module docstring).
  """

  learning_rate: float
  batch_size: int
  epochs: int = 1
  l2_norm_clip: float | None = None
  sampling: str = "poisson"
  steps: int | None = None
  noise: str = "integer"

  def program_settings(self) -> tuple:
    """Every setting but the learning rate, as (name, value) pairs: what a traced
    program that takes the learning rate as a tensor depends on."""
    return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                 if f.name != "learning_rate")

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
    if int(self.batch_size) != self.batch_size or self.batch_size < 1:
      raise ValueError(f"batch_size must be a positive integer, got {self.batch_size}")
    if int(self.epochs) != self.epochs or self.epochs < 1:
      raise ValueError(f"local epochs must be a positive integer, got {self.epochs}")
    if self.l2_norm_clip is not None and not self.l2_norm_clip > 0:
      raise ValueError(f"l2_norm_clip must be positive or None, got {self.l2_norm_clip}")
    if self.steps is not None and (int(self.steps) != self.steps or self.steps < 1):
      raise ValueError(f"local steps must be a positive integer or None, got {self.steps}")
    if self.sampling not in SAMPLING_MODES:
      raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {self.sampling!r}")
    if self.noise not in NOISE_MECHANISMS:
      raise ValueError(f"noise must be one of {NOISE_MECHANISMS}, got {self.noise!r}")

  @property
  def private(self) -> bool:
    return self.l2_norm_clip is not None

  @property
  def integer_noise(self) -> bool:
    """Whether DP-SGD releases integer sums with integer noise."""
    return self.private and self.noise == "integer"

  @property
  def batches(self) -> str:
    """How the steps draw their batches: `sampling` under DP, shuffled epochs
    without."""
    return self.sampling if self.private else "shuffle"


def make_config(client_learning_rate: float, batch_size: int, local_epochs: int,
                l2_norm_clip: Optional[float], sampling: str,
                noise: str = "integer") -> LocalTrainingConfig:
  """The `LocalTrainingConfig` of an `<algo>_algorithm`'s arguments."""
  return LocalTrainingConfig(learning_rate=client_learning_rate, batch_size=batch_size,
                             epochs=local_epochs, l2_norm_clip=l2_norm_clip,
                             sampling=sampling, noise=noise)


def random_permutation(values):
  """The permutation that sorts `values` (uniforms; the last axis), ties in index
  order: row-wise the same for a silo alone and padded with larger values."""
  return tf.argsort(values, axis=-1, stable=True)


def first_of_permutation(values, k):
  """`random_permutation(values)[..., :k]`: the indices of the k smallest values,
  ties in index order, by a partial sort (O(n log k), not a full O(n log n) sort,
  for every step's batch drawn without replacement).

  A batch drawn without replacement must be a uniform k-subset (the accountant's
  replace-one amplification): its values are float64 uniforms on their 2^-52 grid
  as int64 (`uniform_keys`, `batched_random.mantissas`: the same order, and no
  float64 in the program, which TPUs lack), whose grid makes a tie, decided by
  index, improbable (n^2 / 2^53 per step). float32's 2^-23 grid tied n / 2^23 of a
  130,000-row silo's draws (1.5%): the batch's boundary was a tie in ~1.5% of
  steps, won by the lower index."""
  if values.dtype != tf.int64:
    raise TypeError(f"first_of_permutation: values must be int64 keys (float64 "
                    f"uniforms times 2^52: uniform_keys), got {values.dtype.name}")
  return tf.math.top_k(-values, k=k, sorted=True).indices


def uniform_keys(uniforms):
  """int64: float64 uniforms on TF's 2^-52 grid times 2^52, exactly."""
  return tf.cast(uniforms * 2.0 ** 52, tf.int64)


def public_size(size, n):
  """The public size m_k a silo samples with and is weighted by, elementwise: `size`,
  what the privacy protocol settled (`PrivacyProtocol.silo_sizes`, carried by the
  driver's `SiloAccounts.sizes` into `SiloInput.size`), or the silo's n where
  `size` is 0 (training called without the driver)."""
  return tf.where(size > 0, size, tf.cast(n, tf.float32))


def batch_plan(config: LocalTrainingConfig, n, size):
  """(batch size, steps per epoch, steps per call, Poisson inclusion threshold) of a
  silo with n examples and public size `size` (0: n), elementwise over int32 `n` and
  float32 `size` (scalars, or one per silo in the vectorized backend): the
  accounting's arithmetic (`tff_silo.privacy.batching`); an example is kept with
  probability threshold / 2^32 <= batch / m (`poisson_sampling.threshold`)."""
  m, batch, per_epoch = batching.batch_plan(
      tf, config.batches, tf.constant(config.batch_size), n,
      tf.cast(public_size(size, n), tf.int32))
  total = (per_epoch * config.epochs if config.steps is None
           else tf.fill(tf.shape(n), tf.constant(config.steps)))
  return batch, per_epoch, total, poisson_sampling.threshold(batch, m)


def per_example_gradients(model, weights, x, y):
  """Each example's loss gradient ([b, ...] per layer): the model's closed form if
  it has one, else a tape per example under `tf.vectorized_map`."""
  if model.per_example_gradients_fn is not None:
    return model.per_example_gradients_fn(weights, x, y)

  def one(example):
    xi, yi = example
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = model.per_example_loss(weights, xi[None], yi[None])[0]
    return tape.gradient(loss, weights)
  return tf.vectorized_map(one, (x, y))


def clipped_penalized_sum(config: LocalTrainingConfig, per_example, penalty,
                           silo_of=None, num_silos=None):
  """The sum of the clipped per-example gradients of the penalized objective: the
  penalty's gradient lam * (w - anchor) is added to each example's loss gradient
  before clipping. Per-example gradients have the examples on the leading axis;
  with `silo_of` ([m] int32: each example's silo, in [0, num_silos)) the examples
  are several silos' (the vectorized backend), `penalty` has a leading silo axis and
  the sums are one per silo ([num_silos, ...])."""
  own = ([p[None] for p in penalty] if silo_of is None
         else [tf.gather(p, silo_of) for p in penalty])
  return dp_sgd.clipped_sum([g + p for g, p in zip(per_example, own)],
                            config.l2_norm_clip, silo_of, num_silos)


def stacked_clipped_penalized_sums(model, config: LocalTrainingConfig, weights, penalty,
                                   x, y, mask):
  """`clipped_penalized_sum` of S silos with b examples each, through the model's
  `stacked_per_example_gradients_fn`: weights and penalty [S, ...], x [S, b, ...],
  y and `mask` [S, b] (1 for a real example) -> sums [S, ...]."""
  return dp_sgd.clipped_stacked_sums(
      model.stacked_per_example_gradients_fn(weights, x, y), penalty, mask,
      config.l2_norm_clip)


def linear_clipped_penalized_sums(model, config: LocalTrainingConfig, weights, penalty,
                                  x, y, silo_of=None, num_silos=None):
  """`clipped_penalized_sum` of a model with a `linear_form_fn`, its per-example
  gradients never formed (`dp_sgd.clipped_linear_sums`): one silo's examples, or
  with `silo_of` several silos' (weights and penalty [num_silos, ...])."""
  own = weights if silo_of is None else [tf.gather(w, silo_of) for w in weights]
  features, slopes = model.linear_form_fn(own, x, y)
  return dp_sgd.clipped_linear_sums(features, slopes, penalty, config.l2_norm_clip,
                                    silo_of, num_silos)


def integer_penalized_sums(config: LocalTrainingConfig, per_example, penalty, grid,
                           bound, silo_of=None, num_silos=None):
  """`clipped_penalized_sum` for the integer mechanism: each example's clipped
  penalized gradient, flattened (the weights' coordinates in order) and rounded to
  its silo's grid (`grid`, `bound`: scalars, or [m] with `silo_of`), summed in
  int64: [D], or [num_silos, D]."""
  own = ([p[None] for p in penalty] if silo_of is None
         else [tf.gather(p, silo_of) for p in penalty])
  clipped = dp_sgd.clip_per_example([g + p for g, p in zip(per_example, own)],
                                    config.l2_norm_clip)
  return integer_gaussian.integer_sums(dp_sgd.flat_examples(clipped), grid, bound,
                                       silo_of, num_silos)


def linear_integer_penalized_sums(model, config: LocalTrainingConfig, weights, penalty,
                                  x, y, grid, bound, silo_of=None, num_silos=None):
  """`integer_penalized_sums` of a model with a `linear_form_fn`: its clipped
  per-example gradients formed from the linear form
  (`dp_sgd.clipped_linear_contributions`)."""
  own = weights if silo_of is None else [tf.gather(w, silo_of) for w in weights]
  features, slopes = model.linear_form_fn(own, x, y)
  flat = dp_sgd.clipped_linear_contributions(features, slopes, penalty,
                                             config.l2_norm_clip, silo_of)
  return integer_gaussian.integer_sums(flat, grid, bound, silo_of, num_silos)


def integer_step(sums, draws, grid, shapes, normalizer):
  """DP-SGD's gradient from integer sums ([D] or [K, D]) and their noise `draws`:
  the release grid (sums + draws) (`integer_gaussian.release`), cut into the
  weights' `shapes` ([K, *shape] when stacked) and divided by `normalizer` (a
  scalar, or [K])."""
  flat = integer_gaussian.release(sums, draws, grid)
  normalizer = tf.convert_to_tensor(normalizer, tf.float32)
  flat = flat / (normalizer[:, None] if normalizer.shape.rank else normalizer)
  sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
  lead = tf.shape(flat)[:-1]
  return [tf.reshape(part, tf.concat([lead, list(s)], 0)) if s else
          tf.reshape(part, lead)
          for part, s in zip(tf.split(flat, sizes, axis=-1), shapes)]


def noised_step(sums, noise, normalizer):
  """DP-SGD's gradient from clipped sums: `noise` (N(0, (z C)^2), drawn by the
  caller with the step's key) added, divided by `normalizer` (the expected batch
  size: a scalar, or one per silo [K] when the sums are stacked [K, ...])."""
  rank = normalizer.shape.rank
  scale = lambda s: tf.reshape(normalizer, tf.concat(
      [tf.shape(normalizer), tf.ones([s.shape.rank - rank], tf.int32)], 0))
  return [(s + z) / scale(s) for s, z in zip(sums, noise)]


def step_gradient(model, config: LocalTrainingConfig, weights, anchor, lam, xb, yb,
                  noise, normalizer, mask=None):
  """The gradient of one step on a batch, both backends' one definition.

  Without DP: the gradient of the batch objective plus lam * (w - anchor) (`mask`,
  [b] floats in {0, 1}, marks the batch's real examples when it is padded). Under
  DP: the clipped penalized sum of the per-example gradients (`clipped_penalized_sum`;
  `linear_clipped_penalized_sums` or `stacked_clipped_penalized_sums` for a model
  with a linear or stacked form) with noise, normalized (`noised_step`); with
  integer noise (`noise` an `integer_gaussian.IntegerNoise`) the integer sums
  (`integer_penalized_sums`, `linear_integer_penalized_sums`) released by
  `integer_step`.
  """
  weights = list(weights)
  penalty = [lam * (w - a) for w, a in zip(weights, anchor)]
  if not config.private:
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = model.batch_loss(weights, xb, yb, mask)
    return [g + p for g, p in zip(tape.gradient(loss, weights), penalty)]
  if mask is not None:   # a DP step's examples are its batch, never padded
    raise ValueError("step_gradient: mask is for batches without DP")

  if config.integer_noise:
    def integer_sums():
      if model.linear_form_fn is not None:
        return linear_integer_penalized_sums(model, config, weights, penalty, xb, yb,
                                             noise.grid, noise.bound)
      return integer_penalized_sums(config, per_example_gradients(model, weights, xb, yb),
                                    penalty, noise.grid, noise.bound)

    sums = tf.cond(tf.size(yb) > 0, integer_sums,
                   lambda: tf.zeros_like(noise.draws))
    return integer_step(sums, noise.draws, noise.grid,
                        [tuple(w.shape) for w in weights], normalizer)

  def clipped_sums():
    if model.linear_form_fn is not None:
      return linear_clipped_penalized_sums(model, config, weights, penalty, xb, yb)
    if model.stacked_per_example_gradients_fn is None:
      return clipped_penalized_sum(
          config, per_example_gradients(model, weights, xb, yb), penalty)
    return [s[0] for s in stacked_clipped_penalized_sums(
        model, config, [w[None] for w in weights], [p[None] for p in penalty],
        xb[None], yb[None], tf.ones([1, tf.shape(yb)[0]]))]

  sums = tf.cond(tf.size(yb) > 0, clipped_sums,   # a Poisson batch may be empty
                 lambda: [tf.zeros_like(w) for w in weights])
  return noised_step(sums, noise, tf.convert_to_tensor(normalizer, tf.float32))


def check_trainable(model, config: LocalTrainingConfig) -> None:
  if config.private and model.mean_transform is not None:
    raise ValueError(f"{model.name} trains an objective that is not a mean over "
                     "examples; DP-SGD needs per-example losses (train it without "
                     "l2_norm_clip)")


def train_locally(model, config: LocalTrainingConfig, weights, anchor, lam, x, y,
                  noise_multiplier, key, pass_=0, size=0.0):
  """Runs `config.epochs` epochs (or `config.steps` steps) of (DP-)SGD; returns the
  new weights (a list).

  Args:
    model: a `SiloModel`.
    config: the static `LocalTrainingConfig`.
    weights, anchor: lists of float32 tensors (start point, regularization center).
    lam: float32 scalar, the mean-regularization strength (0 for none).
    x, y: the silo's features `[n, ...]` and labels `[n]`.
    noise_multiplier: float32 scalar z (the silo's own calibration; unused without DP).
    key: int32[2], the silo's key for this round (`tff_silo.keys`).
    pass_: which of the round's passes over the silo's data this is (Ditto: 0, 1).
    size: float32 scalar m, the silo's public size for Poisson sampling (0: n).
  """
  check_trainable(model, config)
  weights = [tf.identity(w) for w in weights]
  n = tf.shape(y)[0]
  batch, per_epoch, total_steps, below = batch_plan(config, n, size)
  poisson = config.batches == "poisson"
  without_replacement = config.batches == "without_replacement"
  expected_batch = tf.cast(batch, tf.float32)
  lr = tf.constant(config.learning_rate, tf.float32)

  sampling_key = keys.derive(key, keys.SAMPLING, pass_)
  shuffle_key = keys.derive(key, keys.SHUFFLE, pass_)
  noise_key = keys.derive(key, keys.DP_NOISE, pass_)

  sampler = poisson_sampling.PoissonSampler(below[None], n[None]) if poisson else None
  dimension = sum(int(w.shape.num_elements()) for w in weights)

  def epoch_permutation(step, previous):
    """The shuffled epoch's permutation: drawn at the epoch's first step, kept."""
    seed = keys.fold_in(shuffle_key, step // per_epoch)
    return tf.cond(tf.equal(step % per_epoch, 0),
                   lambda: random_permutation(tf.random.stateless_uniform([n], seed=seed)),
                   lambda: previous)

  def batch_indices(step, perm):
    if poisson:
      return sampler.sample(
          lambda key, width: tf.random.stateless_uniform(
              [width], seed=key, minval=None, maxval=None, dtype=tf.uint32)[None],
          keys.fold_in(sampling_key, step))[1]
    if without_replacement:
      return first_of_permutation(uniform_keys(tf.random.stateless_uniform(
          [n], seed=keys.fold_in(sampling_key, step), dtype=tf.float64)), batch)
    start = (step % per_epoch) * batch
    return perm[start:start + batch]

  def body(step, w, perm):
    if config.batches == "shuffle":
      perm = epoch_permutation(step, perm)
    idx = batch_indices(step, perm)
    noise = None
    if config.integer_noise:
      noise = integer_gaussian.step_noise(keys.fold_in(noise_key, step)[None], dimension,
                                          noise_multiplier, config.l2_norm_clip)
      noise = noise._replace(draws=noise.draws[0])
    elif config.private:
      noise = dp_sgd.gaussian_noise_like(w, noise_multiplier * config.l2_norm_clip,
                                         keys.fold_in(noise_key, step))
    grads = step_gradient(model, config, w, anchor, lam, tf.gather(x, idx),
                          tf.gather(y, idx), noise, expected_batch)
    return step + 1, [wi - lr * gi for wi, gi in zip(w, grads)], perm

  _, weights, _ = tf.while_loop(lambda step, *_: step < total_steps, body,
                                (tf.constant(0), weights, tf.zeros([n], tf.int32)))
  return weights
