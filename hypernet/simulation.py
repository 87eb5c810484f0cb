"""The HyperNetFL driver: Poisson user sampling, rounds, evaluation, privacy spent.

It runs the one round loop (`tff_silo.driver.run_rounds`). Every round each user
takes part independently with probability at most q, within 2^-32
(`driver.PoissonUsers`: a 32-bit word per user below floor(q 2^32), keyed by
derive(root, USER_SAMPLING, round), `tff_silo.keys`), as the sampled Gaussian
mechanism's accounting assumes; a round in which nobody is sampled still runs, so
the aggregator adds its noise. Each user is evaluated on its own test
data with its generated model theta_u = h(phi, v_u) (no local fine-tuning, as in
pFedHN).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_silo import keys
from tff_silo.backends.vectorized import programs
from tff_silo.data.silos import SiloData
from tff_silo.driver import (
    PoissonUsers, RunResult, check_run_length, run_rounds, tff_workers_stopped)
from tff_silo.evaluation import SiloEvaluator
from tff_silo.privacy.ledger import PrivacyLedger
from tff_silo.runner import SiloModels, runner_for


@dataclasses.dataclass(frozen=True)
class HypernetResult(RunResult):
  """What one run produced (`RunResult`'s fields: accuracies, fractions in [0, 1];
  the silo models are the users' generated models theta_u; and):

  mean_user_accuracy: the mean over users of each user's test accuracy.
  epsilon: user-level, at `delta`; inf without noise.
  sigma: the noise std of the phi step (eq. 4).
  users_per_round: how many users each round sampled.
  phi, embeddings: the final hypernetwork weights and user embeddings [N, E].
  """

  mean_user_accuracy: float = math.nan
  epsilon: float = math.inf
  delta: Optional[float] = None
  sigma: float = 0.0
  users_per_round: Optional[np.ndarray] = None
  phi: tuple = ()
  embeddings: Optional[np.ndarray] = None


def sample_users(num_users: int, sampling_rate: float, seed: int, round_num: int):
  """Ids of the users sampled in round `round_num` + 1 (each with probability q)."""
  return PoissonUsers(num_users, sampling_rate, seed).sample(round_num + 1)


class _Generator:
  """theta_u = h(phi, v_u) for every user, in one call of an evaluation program
  (`programs.evaluation_function`: run by PJRT as the rounds are, and a bundle's
  call where they are), left where it ran: a `SiloModels` of the users."""

  def __init__(self, hypernetwork):
    self._fn = programs.evaluation_function(hypernetwork.generate_many)

  def __call__(self, phi, embeddings) -> SiloModels:
    thetas = self._fn([tf.convert_to_tensor(p, tf.float32) for p in phi],
                      tf.convert_to_tensor(embeddings, tf.float32))
    return SiloModels(tuple(thetas), (np.arange(thetas[0].shape[0], dtype=np.int32),))


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
  users = PoissonUsers(hn.num_users, settings.sampling_rate, seed)
  generator, evaluator = _Generator(hn), SiloEvaluator(hn.target)

  def evaluate(state):
    thetas = generator(state.phi, state.embeddings)
    test, per_user = evaluator(thetas, data.x_test, data.y_test)
    train, per_user_train = evaluator(thetas, data.x_train, data.y_train)
    return train, test, per_user_train, per_user, thetas

  history, users_per_round = [], []
  with tff_workers_stopped():
    prepared = runner.prepare(data.x_train, data.y_train,
                              keys.unit_keys(seed, hn.num_users))
    state = runner.initialize()
    sampled = None

    def before(r):
      nonlocal sampled
      sampled = users.sample(r)
      return True

    def step(r):
      del r
      nonlocal state
      state = runner.next(state, sampled, prepared)

    def after(r):
      del r
      if ledger is not None:   # noise is added every round, sampled or not
        ledger.charge(settings.round_event(hn.num_parameters), "user_level_round")
      users_per_round.append(len(sampled))

    log = run_rounds(rounds, step, before=before, after=after,
                     evaluate=lambda r: history.append((r, *evaluate(state)[:2])),
                     eval_every=eval_every, progress=progress, start=start)
    train, test, per_user_train, per_user, thetas = evaluate(state)
    history.append((rounds, train, test))
    phi = tuple(np.asarray(p) for p in state.phi)
    embeddings = np.asarray(state.embeddings)
  return HypernetResult(
      algorithm=algorithm.name, rounds=log.rounds_run, metric=hn.target.metric,
      train_metric=train, test_metric=test, silo_train_metric=per_user_train,
      silo_test_metric=per_user, history=tuple(history),
      round_seconds=log.round_seconds, wall_seconds=time.perf_counter() - start,
      silo_weights=tuple(thetas.silos()), mean_user_accuracy=float(per_user.mean()),
      epsilon=ledger.epsilon() if ledger is not None else math.inf,
      delta=target_delta, sigma=algorithm.sigma,
      users_per_round=np.array(users_per_round), phi=phi, embeddings=embeddings)
