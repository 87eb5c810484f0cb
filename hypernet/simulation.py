"""The HyperNetFL driver: Poisson user sampling, rounds, evaluation, privacy spent.

Every round each user takes part independently with probability q (stateless TF
uniforms keyed by derive(root, USER_SAMPLING, round), `tff_silo.keys`), as the sampled Gaussian mechanism's accounting
assumes; a round in which nobody is sampled still runs, so the aggregator adds its
noise. Each user is evaluated on its own test data with its generated model
theta_u = h(phi, v_u) (no local fine-tuning, as in pFedHN).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_silo import keys, runtime
from tff_silo.data.silos import SiloData
from tff_silo.privacy.ledger import PrivacyLedger
from tff_silo.runner import runner_for
from tff_silo.simulation import SiloEvaluator, check_run_length

@dataclasses.dataclass(frozen=True)
class HypernetResult:
  """What one run produced; accuracies are fractions in [0, 1]."""

  rounds: int
  test_accuracy: float             # pooled over all users' test examples
  mean_user_accuracy: float        # mean over users of each user's test accuracy
  user_test_accuracy: np.ndarray
  train_accuracy: float
  epsilon: float                   # user-level, at `delta`; inf without noise
  delta: Optional[float]
  sigma: float                     # noise std of the phi step (eq. 4)
  users_per_round: np.ndarray
  history: tuple                   # ((rounds_done, test_accuracy, mean_user_accuracy), ...)
  round_seconds: np.ndarray
  wall_seconds: float
  user_weights: tuple = ()         # per user, the final generated model theta_u
  phi: tuple = ()                  # the final hypernetwork weights
  embeddings: Optional[np.ndarray] = None   # the final user embeddings [N, E]


def sample_users(num_users: int, sampling_rate: float, seed: int, round_num: int):
  """Ids of the users sampled in `round_num` (each with probability q)."""
  key = keys.derive(keys.root_key(seed), keys.USER_SAMPLING, round_num)
  draws = tf.random.stateless_uniform([num_users], seed=key).numpy()
  return np.flatnonzero(draws < sampling_rate)


class _Generator:
  """theta_u = h(phi, v_u) for every user, in one traced call."""

  def __init__(self, hypernetwork):
    signature = ([tf.TensorSpec(s, tf.float32) for s in hypernetwork.phi_shapes],
                 tf.TensorSpec([None, hypernetwork.embedding_dim], tf.float32))
    self._fn = tf.function(hypernetwork.generate_many, input_signature=signature)

  def __call__(self, phi, embeddings):
    thetas = [t.numpy() for t in self._fn([tf.constant(p) for p in phi],
                                          tf.constant(embeddings))]
    return [tuple(t[u] for t in thetas) for u in range(len(thetas[0]))]


def run_hypernet(process, data: SiloData, *, rounds: int,
                 target_delta: Optional[float] = None, seed: int = 0,
                 eval_every: int = 0,
                 progress: Optional[Callable[[int, int, float], None]] = None,
                 backend: str = "tff") -> HypernetResult:
  """Trains `process` for `rounds` rounds on `data`'s users and evaluates them.

  Args:
    process: a `hypernet.hypernet_algorithm` definition or its TFF process
      (`hypernet.process.process_for`), built for `data`'s users.
    data: one silo per user (`multiclass`), the hypernetwork's N users.
    rounds: T.
    target_delta: delta of the reported user-level epsilon; required with noise.
    seed: seeds user sampling and the users' local batches.
    eval_every: also evaluate every this many rounds (0: only at the end).
    progress: called as `progress(rounds_done, rounds, seconds_so_far)` each round.
    backend: `tff` (TFF's runtime) or `vectorized` (`hypernet.vectorized`: the same
      numbers, a round as one TF program; the user-level DP mean only).
  """
  check_run_length(rounds, eval_every)
  runner = runner_for(process, backend)
  algorithm = runner.algorithm
  settings, hn = algorithm.settings, algorithm.hypernetwork
  if data.num_silos != hn.num_users:
    raise ValueError(f"data has {data.num_silos} users, the process was built for "
                     f"{hn.num_users}")
  if settings.private and target_delta is None:
    raise ValueError("the process adds noise: give target_delta for its epsilon")
  start = time.perf_counter()
  # Users are Poisson-sampled alike, so one ledger is every user's (user-level) account.
  ledger = (PrivacyLedger(target_delta) if settings.private and target_delta is not None
            else None)
  generator, evaluator = _Generator(hn), SiloEvaluator(hn.target)

  def evaluate(state):
    thetas = generator(state.phi, state.embeddings)
    test, per_user = evaluator(thetas, data.x_test, data.y_test)
    train, _ = evaluator(thetas, data.x_train, data.y_train)
    return test, float(per_user.mean()), per_user, train, thetas

  user_keys = keys.unit_keys(seed, hn.num_users)
  try:
    prepared = runner.prepare(data.x_train, data.y_train, user_keys)
    state = runner.initialize()
    history, round_seconds, users_per_round = [], [], []
    for r in range(rounds):
      sampled = sample_users(hn.num_users, settings.sampling_rate, seed, r)
      t0 = time.perf_counter()
      state = runner.next(state, sampled, prepared)
      round_seconds.append(time.perf_counter() - t0)
      if ledger is not None:   # noise is added every round, sampled or not
        ledger.charge(settings.round_event(), "user_level_round")
      users_per_round.append(len(sampled))
      if eval_every and (r + 1) % eval_every == 0 and r + 1 != rounds:
        history.append((r + 1, *evaluate(state)[:2]))
      if progress is not None:
        progress(r + 1, rounds, time.perf_counter() - start)
    test, mean_user, per_user, train, thetas = evaluate(state)
    history.append((rounds, test, mean_user))
    phi = tuple(np.asarray(p) for p in state.phi)
    embeddings = np.asarray(state.embeddings)
  finally:
    runtime.stop_tff_workers()
  return HypernetResult(
      rounds=rounds, test_accuracy=test, mean_user_accuracy=mean_user,
      user_test_accuracy=per_user, train_accuracy=train,
      epsilon=ledger.epsilon() if ledger is not None else math.inf,
      delta=target_delta, sigma=algorithm.sigma,
      users_per_round=np.array(users_per_round), history=tuple(history),
      round_seconds=np.array(round_seconds), wall_seconds=time.perf_counter() - start,
      user_weights=tuple(thetas), phi=phi, embeddings=embeddings)
