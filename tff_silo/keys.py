"""Every random key of a run, derived in one tree with 64 bits per key.

A key is an int32[2] tensor: the 64-bit seed of TensorFlow's stateless random ops.
`fold_in(key, data)` returns the child key for the integer `data`: the 64-bit output
of Philox-4x32-10 keyed by the parent, at counter (data,
`batched_random.KEY_DOMAIN`). For a fixed parent, Philox is a bijection of the
128-bit counter, so the children of one key differ; keys in different subtrees are
outputs of a keyed pseudo-random function, so any two of N keys coincide with
probability about N^2 / 2^65 (TF 2.14's
`stateless_fold_in` keeps 32 random bits: one pair collides after ~2^16 keys).

The tree of a run (`purpose` one of the constants below, each use its own):

    root     = root_key(seed)                      seed None: OS entropy
    unit     = derive(root, UNIT, k)               silo or user k
    round    = fold_in(unit, t)                    t = -1: before training
    stream   = derive(round, purpose, pass_)       pass 0, 1 (Ditto's two epochs)
    step key = fold_in(stream, step)               one release, one sample draw

Purposes without a silo (user sampling, the server's aggregator noise) hang off
`derive(root, purpose)`. A fixed seed makes a simulation reproducible; a deployment
passes no seed, so the root comes from OS entropy and nothing is guessable.

Runs of a study (methods, hyperparameters, epsilons) each take `run_seed(seed,
configuration)`: two runs share keys only if they are the same run. Two runs of one
silo's data with one key would draw the same Poisson masks and noise, and their
updates' difference would give back the clipped gradient sums exactly.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Mapping, Optional

import numpy as np
import tensorflow as tf

from tff_silo import batched_random

# Purposes: the first index under a unit's round key (or the root), one per use.
UNIT = 1
SAMPLING = 2          # Poisson / fixed-size batch selection
DP_NOISE = 3          # DP-SGD's Gaussian noise
SHUFFLE = 4           # epoch permutations without DP
SELECTION = 5         # report-noisy-min (IFCA's cluster selection)
D_PRIVACY = 6         # Euclidean Laplace sanitization
USER_SAMPLING = 7     # Poisson sampling of users (HyperNetFL)
AGGREGATOR_NOISE = 8  # server-side noise (user-level DP)
STANDARDIZE = 9       # DP estimate of standardization statistics
TUNING = 10           # random-repeat tuning: its plan and each trial's run seed
VALIDATION_SCORE = 11  # the Gaussian noise of a trial's validation score
RUN = 12              # a run's seed from its configuration (`run_seed`)
GAUSSIAN_TAIL = 13    # under a noise key: the words refining a pair's tail
                      # (`privacy.gaussian`)
INTEGER_LOW = 14      # under a noise key: the low words of the integer noise's
                      # uniforms (`privacy.integer_gaussian`)
PURPOSES = dict(unit=UNIT, sampling=SAMPLING, dp_noise=DP_NOISE, shuffle=SHUFFLE,
                selection=SELECTION, d_privacy=D_PRIVACY, user_sampling=USER_SAMPLING,
                aggregator_noise=AGGREGATOR_NOISE, standardize=STANDARDIZE,
                tuning=TUNING, validation_score=VALIDATION_SCORE, run=RUN,
                gaussian_tail=GAUSSIAN_TAIL, integer_low=INTEGER_LOW)

_PHILOX = 1             # tf.random.Algorithm.PHILOX
_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def fold_in(key, data):
  """The child of `key` (int32[2]) for the integer `data` (a scalar int32/int64)."""
  key = tf.convert_to_tensor(key, tf.int32)
  philox_key = tf.reshape(tf.bitcast(key, tf.uint64), [1])
  word = tf.bitcast(tf.cast(data, tf.int64), tf.uint64)
  counter = tf.stack([word, tf.constant(batched_random.KEY_DOMAIN, tf.uint64)])
  return tf.raw_ops.StatelessRandomUniformFullIntV2(
      shape=[2], key=philox_key, counter=counter, alg=_PHILOX, dtype=tf.int32)


def derive(key, *path):
  """`fold_in` along `path` (integers): derive(k, a, b) = fold_in(fold_in(k, a), b)."""
  for data in path:
    key = fold_in(key, data)
  return key


def root_key(seed: Optional[int]) -> np.ndarray:
  """The root int32[2] key of a run: the 64 bits of `seed` (an int in [0, 2^64)), or
  64 bits of OS entropy when `seed` is None."""
  if seed is None:
    seed = secrets.randbits(64)
  seed = int(seed)
  if not 0 <= seed < 2 ** 64:
    raise ValueError(f"seed must be an integer in [0, 2**64) or None, got {seed}")
  return np.array([seed & 0xFFFF_FFFF, seed >> 32], np.uint32).view(np.int32)


def child_seed(seed: int, *path) -> int:
  """A 64-bit seed for a run derived from run `seed` along `path` (integers, the
  first a purpose): `derive(root_key(seed), *path)` read as one unsigned integer
  (private tuning draws its plan from one; `run_seed` gives each run its own)."""
  return int(derive(root_key(seed), *path).numpy().view(np.uint64)[0])


def run_seed(seed: int, configuration: Mapping) -> int:
  """The seed of the run of `configuration` (a JSON-serializable mapping of every
  setting that changes what the run trains: method, hyperparameters, epsilon, ...)
  under study seed `seed`: `child_seed(seed, RUN, c)`, c the first 64 bits of the
  SHA-256 of the configuration's canonical JSON. Equal configurations give equal
  seeds (a rerun is the same run); distinct ones give keys that coincide with
  probability about 2^-64."""
  text = json.dumps(dict(configuration), sort_keys=True, allow_nan=True)
  digest = hashlib.sha256(text.encode()).digest()[:8]
  return child_seed(seed, RUN, int.from_bytes(digest, "little", signed=True))


def unit_key(root, unit: int) -> np.ndarray:
  """The key of silo or user `unit` (numpy int32[2])."""
  return derive(root, UNIT, int(unit)).numpy()


def unit_keys(seed: Optional[int], num_units: int) -> list:
  """Every silo's (or user's) key of a run with `seed`: `unit_key` of each, computed
  for all units at once."""
  roots = np.tile(root_key(seed)[None], (num_units, 1))
  return list(_unit_keys(roots, np.arange(num_units, dtype=np.int64)).numpy())


@tf.function(reduce_retracing=True)
def _unit_keys(roots, units):
  # traced once: eagerly, each fold_in is a hundred small ops (~4 ms a call)
  return batched_random.fold_in(batched_random.fold_in(roots, UNIT), units)


def fresh_key():
  """A new int32[2] key from OS entropy at every execution: for mechanisms called
  without a key. Eagerly the key comes from `secrets`; inside a `tf.function` it is a
  stateful draw whose two op seeds come from `secrets` at trace time. Inside a TFF
  computation (a new session per call) pass keys instead: such a draw would repeat."""
  if tf.executing_eagerly():
    return tf.constant(root_key(None))
  return tf.raw_ops.RandomUniformInt(
      shape=[2], minval=_INT32_MIN, maxval=_INT32_MAX,
      seed=secrets.randbits(62) + 1, seed2=secrets.randbits(62) + 1)


def key_or_fresh(key):
  """`key` as an int32[2] tensor, or a `fresh_key()` when it is None."""
  return fresh_key() if key is None else tf.convert_to_tensor(key, tf.int32)
