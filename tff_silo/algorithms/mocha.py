"""Mocha (Smith et al. 2017) in primal form, trained with (DP-)SGD (thesis sec. 1.4,
app. B.3), TF only.

The K silos' models are the rows w_k of W (K x d) and the objective is

    sum_k f_k(w_k) + (lam / 2) tr(W^T Omega W)

with Omega (K x K) the silos' relationship. A round: every silo takes its usual
local steps (aligned with the other methods: one pass of `config`'s epochs) on
f_k(w_k) plus its regularizer term; the gradient of the term in w_k is
lam * sum_j Omega_kj w_j, with the other silos' rows held at the round's start. That
is the MR-MTL penalty lam_k (w_k - a_k) of `local_training` with

    lam_k = lam * Omega_kk,    a_k = -sum_{j != k} Omega_kj w_j / Omega_kk,

so the one local-training routine runs it (under DP the term joins every per-example
gradient before clipping, as in the paper's code). After the round the server sets
Omega in closed form from the new W:

    Omega = (W W^T)^(1/2) / tr((W W^T)^(1/2))

((W^T W)^(1/2) when the models are W's columns), as the thesis' reference code
does: W W^T's eigenvalues below 1e-8 floored at 1e-8 (here through W's singular
values, in float32); Omega starts at I / K. (Zhang & Yeung's formulation
regularizes with Omega's inverse; the reference code, followed here, uses Omega
itself.) Every silo takes part in every round.

Privacy: silo k's data is queried only by its DP-SGD steps, one pass a round as
MR-MTL; Omega and the other rows are post-processing of the silos' DP releases, so
the cost is local training's. The server holds every silo's model (as MR-MTL's
server receives every silo's update).

`relationship`, `pulls` and `regularizer` work on a leading run axis ([R, K, ...]:
the vectorized backend stacks runs; the TFF process is one run) and are what both
backends compute.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tff_silo import runner
from tff_silo.algorithms.local_training import LocalTrainingConfig, make_config
from tff_silo.algorithms.rounds import check_lambda

# The best lambda of the authors' code on School at epsilon 6 and without DP, on
# app. B.4's grid.
DEFAULT_LAMBDA = 0.001
EIGENVALUE_FLOOR = 1e-8


@dataclasses.dataclass(frozen=True)
class MochaAlgorithm:
  """Mocha as data (see `mocha_algorithm`): name, model, feature_shape, config
  (`LocalTrainingConfig`), lam, num_silos (K: Omega is K x K) and init_seed (of
  every silo's initial model)."""

  name: str
  model: object
  feature_shape: tuple
  config: LocalTrainingConfig
  lam: float
  num_silos: int
  init_seed: int = 0

  selection_budget_share = 0.0   # no private selections
  num_clusters = 1

  @property
  def epochs_per_round(self) -> int:
    return self.config.epochs

  @property
  def initial_weights(self) -> tuple:
    return self.model.initial_weights(self.init_seed)

  def num_selections(self, rounds: int) -> int:
    del rounds
    return 0

  def check_silos(self, num_silos: int) -> None:
    """A one-line error unless the run has the K silos Omega relates."""
    if num_silos != self.num_silos:
      raise ValueError(f"{self.name} was defined for num_silos={self.num_silos} (its "
                       f"K x K relationship matrix); the run has {num_silos} silos")


runner.register(MochaAlgorithm, tff="tff_silo.backends.tff.mocha:runner",
                vectorized="tff_silo.backends.vectorized.mocha:VectorizedMocha")


def mocha_algorithm(model, feature_shape, *, num_silos: int,
                    client_learning_rate: float, batch_size: int,
                    lam: float = DEFAULT_LAMBDA, local_epochs: int = 1,
                    l2_norm_clip: float | None = None, sampling: str = "poisson",
                    init_seed: int = 0) -> MochaAlgorithm:
  """Mocha for `num_silos` silos; DP-SGD in every silo when `l2_norm_clip` is set
  (see the module docstring; the other arguments as for `mrmtl_algorithm`)."""
  if isinstance(num_silos, bool) or int(num_silos) != num_silos or num_silos < 1:
    raise ValueError(f"num_silos must be a positive integer, got {num_silos!r}")
  config = make_config(client_learning_rate, batch_size, local_epochs, l2_norm_clip,
                       sampling)
  return MochaAlgorithm("mocha", model, tuple(feature_shape), config, check_lambda(lam),
                        int(num_silos), init_seed)


def initial_relationship(num_silos: int, size: int | None = None) -> np.ndarray:
  """Omega before round 1: I / K, zero-padded to `size` rows and columns."""
  omega = np.zeros((size or num_silos,) * 2, np.float32)
  omega[np.arange(num_silos), np.arange(num_silos)] = 1.0 / num_silos
  return omega


def _flat(models):
  """[R, K, d]: each silo's model flattened, from per-layer [R, K, ...]."""
  return tf.concat([tf.reshape(w, tf.concat([tf.shape(w)[:2], [-1]], 0))
                    for w in models], axis=-1)


def relationship(models, num_silos):
  """Omega = (W W^T)^(1/2) / tr(...) of each run ([R, K, K], float32), with W W^T's
  eigenvalues floored at `EIGENVALUE_FLOOR`. `models`: per layer [R, K, ...]; a run's
  rows past its `num_silos` (int [R]) are padding (zeros in W): they leave its silos'
  block unchanged (a matrix function of a block-diagonal matrix is block-diagonal)
  and are cut from the trace and from Omega. A run whose models are not finite (it
  diverged) gets an Omega of NaN, the others their own.

  From W's thin singular value decomposition W = U diag(s) V^T (W W^T's eigenpairs
  are (s^2, U), its other K - min(K, d) eigenvalues 0): with f the floor,
  (W W^T)^(1/2) = sqrt(f) I + U diag(max(s - sqrt(f), 0)) U^T. In float32 (TPUs have
  no float64) this is well conditioned, unlike the square root of the Gram matrix
  formed in float32: max(s - sqrt(f), 0) is 1-Lipschitz in s, and s is within about
  2^-24 ||W|| of the exact singular values (tested against float64's eigh)."""
  w = _flat(models)
  size = tf.shape(w)[1]
  floor_root = float(np.sqrt(EIGENVALUE_FLOOR))
  finite = tf.reduce_all(tf.math.is_finite(w), axis=[1, 2])
  values, vectors = _left_singular(tf.where(finite[:, None, None], w, 0.0))
  square_root = (floor_root * tf.eye(size, dtype=tf.float32)
                 + tf.matmul(vectors * tf.maximum(values - floor_root, 0.0)[:, None, :],
                             vectors, transpose_b=True))
  real = tf.cast(tf.range(size)[None] < tf.reshape(num_silos, [-1, 1]), tf.float32)
  square_root *= real[:, :, None] * real[:, None, :]
  trace = tf.linalg.trace(square_root)
  return tf.where(finite[:, None, None], square_root / trace[:, None, None], np.nan)


def _left_singular(w):
  """(s [R, m], U [R, K, m]) of each W [R, K, d] = U diag(s) V^T, m = min(K, d).
  XLA's SVD (Jacobi sweeps) of a long matrix is slow (5 x 139 x 28: 68 ms on a CPU),
  so a known shape goes through QR first: W = Q R' with R' square, U = Q U' from
  R' = U' diag(s) V'^T (9 ms); for d >= K, W^T = Q R' and W = R'^T Q^T, so U and s
  are R'^T's."""
  rows, columns = w.shape[1], w.shape[2]
  if rows is None or columns is None:
    values, vectors, _ = tf.linalg.svd(w, full_matrices=False)
    return values, vectors
  if rows > columns:
    q, square = tf.linalg.qr(w)
    values, vectors, _ = tf.linalg.svd(square)
    return values, tf.matmul(q, vectors)
  _, square = tf.linalg.qr(tf.linalg.matrix_transpose(w))
  values, vectors, _ = tf.linalg.svd(tf.linalg.matrix_transpose(square))
  return values, vectors


def pulls(omega, models):
  """(Omega_kk [R, K], per layer sum_{j != k} Omega_kj w_j [R, K, ...]): what each
  silo's regularizer term needs from the others."""
  diag = tf.linalg.diag_part(omega)
  off = tf.linalg.set_diag(omega, tf.zeros_like(diag))
  out = []
  for w in models:
    flat = tf.reshape(w, tf.concat([tf.shape(w)[:2], [-1]], 0))
    out.append(tf.reshape(tf.matmul(off, flat), tf.shape(w)))
  return diag, out


def regularizer(lam: float, diag, pull):
  """(lam_k, a_k) of the module docstring: the strength and centre of each silo's
  penalty lam_k (w_k - a_k), from its `pulls` (`diag` any leading shape, `pull` per
  layer that shape and the layer's; 0 and 0 for a padded row)."""
  def trailing(d, like):
    return tf.reshape(d, tf.concat([tf.shape(d), tf.ones([len(like.shape) - len(d.shape)],
                                                           tf.int32)], 0))
  anchor = [-tf.math.divide_no_nan(p, trailing(diag, p)) for p in pull]
  return tf.cast(lam, tf.float32) * diag, anchor
