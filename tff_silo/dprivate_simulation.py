"""The driver of d-private clustered FL (Galli et al., Algorithm 1 and section 5.1).

It runs the one round loop (`tff_silo.driver.run_rounds`). Each round U users are
sampled uniformly without replacement (`driver.UniformUsers`); a sampled user whose
composed leakage would pass `leakage_cap` declines; every user keeps a leakage
ledger (n / nu per participation, additive: Theorem 1). The driver evaluates the hypotheses on
held-out validation users after every round (each validation user takes the
hypothesis with its lowest mean loss) and stops after `patience` rounds without
improvement, keeping the best hypotheses. Losses are the model's batch objective
(RMSE for Galli et al.'s experiment, eq. 10). At the end every training user takes its
lowest-loss hypothesis on its training data and is evaluated on its test data.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_silo import keys
from tff_silo.algorithms.dprivate_clustering import hypothesis_losses
from tff_silo.algorithms.rounds import SiloInput
from tff_silo.backends.vectorized import programs
from tff_silo.backends.vectorized.training import forward_items_per_call
from tff_silo.data.silos import SiloData, padded_stack
from tff_silo.driver import (
    RunResult, UniformUsers, check_run_length, run_rounds, tff_workers_stopped)
from tff_silo.evaluation import SiloEvaluator
from tff_silo.runner import runner_for


@dataclasses.dataclass(frozen=True)
class DPrivateResult(RunResult):
  """What one run of Algorithm 1 produced (`RunResult`'s fields, the silo models
  each training user's chosen hypothesis, evaluated after `best_round` rounds, and):

  best_round: the round whose hypotheses were kept (the last without validation).
  hypotheses: the k kept hypotheses; assignments: each training user's.
  participations, leakage: per training user, its rounds taken part in and its
    composed leakage (n / nu per participation: `leakage_per_participation`);
    layer_leakage: per layer.
  declined: participations declined under `leakage_cap`.
  validation_history: (round, validation loss) after every round run.
  stopped_because: `rounds`, `leakage_cap` (every user would decline) or
    `early_stopping`.
  """

  best_round: int = 0
  hypotheses: tuple = ()
  assignments: Optional[np.ndarray] = None
  participations: Optional[np.ndarray] = None
  leakage: Optional[np.ndarray] = None
  layer_leakage: tuple = ()
  leakage_per_participation: float = 0.0
  declined: int = 0
  validation_history: tuple = ()
  stopped_because: str = "rounds"


class _LossTable:
  """`table(hypotheses) -> [k, users]` of the model's batch objective F_c on fixed
  users' data: users zero-padded and stacked (each user's loss over its own rows,
  `hypothesis_losses`), as many per call as the memory budget allows
  (`forward_items_per_call`)."""

  def __init__(self, model, xs, ys):
    self._x, self._y = padded_stack(xs), padded_stack(ys)
    n = np.array([len(y) for y in ys])
    self._mask = (np.arange(self._y.shape[1])[None] < n[:, None]).astype(np.float32)
    self._users = forward_items_per_call(model, self._y.shape[1])
    self._table = programs.evaluation_function(
        lambda hypotheses, x, y, mask: tf.transpose(hypothesis_losses(model, hypotheses,
                                                                      x, y, mask)))

  def __call__(self, hypotheses) -> np.ndarray:
    hypotheses = tuple(tuple(tf.convert_to_tensor(w, tf.float32) for w in h)
                       for h in hypotheses)
    parts = [self._table(hypotheses, *(tf.constant(a[i:i + self._users])
                                       for a in (self._x, self._y, self._mask))).numpy()
             for i in range(0, len(self._y), self._users)]
    return np.concatenate(parts, axis=1).astype(np.float64)


def _check(process, data, rounds, clients_per_round, leakage_cap, patience, validation):
  check_run_length(rounds)
  if process.num_clusters > data.num_silos:
    raise ValueError(f"num_clusters={process.num_clusters} is more than the "
                     f"{data.num_silos} users")
  if not 1 <= clients_per_round <= data.num_silos:
    raise ValueError(f"clients_per_round must be in [1, {data.num_silos}] (the number "
                     f"of users), got {clients_per_round}")
  if leakage_cap is not None:
    if process.nu is None:
      raise ValueError("leakage_cap needs sanitization (nu); without it every "
                       "participation leaks without bound")
    if leakage_cap < process.leakage_per_participation:
      raise ValueError(
          f"leakage_cap={leakage_cap} is below the leakage of one participation, "
          f"n / nu = {process.leakage_per_participation:.4g}: no user could take part")
  if patience is not None:
    if int(patience) != patience or patience < 1:
      raise ValueError(f"patience must be a positive integer, got {patience}")
    if validation is None:
      raise ValueError("patience (early stopping) needs validation users")
  if validation is not None and validation.feature_shape != data.feature_shape:
    raise ValueError(f"validation users have features {validation.feature_shape}, the "
                     f"training users {data.feature_shape}")


def run_dprivate_clustering(process, data: SiloData, *, rounds: int,
                            clients_per_round: int, seed: int = 0,
                            leakage_cap: Optional[float] = None,
                            validation: Optional[SiloData] = None,
                            patience: Optional[int] = None,
                            progress: Optional[Callable[[int, int, float], None]] = None,
                            backend: str = "tff") -> DPrivateResult:
  """Runs Algorithm 1 for at most `rounds` rounds (see module docstring).

  Args:
    process: the definition (`dprivate_clustering_algorithm`; the TFF process is
      built when backend="tff"), or its TFF process.
    data: the training users (silos).
    rounds: the most rounds T.
    clients_per_round: U, users sampled per round.
    seed: seeds the sampling, local shuffling and the sanitization noise.
    leakage_cap: a user declines a round that would take its leakage above this.
    validation: held-out users for the validation loss (and early stopping).
    patience: stop after this many rounds without validation improvement.
    progress: called as `progress(rounds_done, rounds, seconds_so_far)`.
    backend: `tff` (the reference) or `vectorized` (a round as one TF program; the
      same numbers: `tff_silo.backends.vectorized`).
  """
  process = runner_for(process, backend)
  _check(process, data, rounds, clients_per_round, leakage_cap, patience, validation)
  start = time.perf_counter()
  users = UniformUsers(data.num_silos, clients_per_round, seed,
                       per_participation=process.leakage_per_participation,
                       leakage_cap=leakage_cap)
  inputs = process.prepare([SiloInput(x, y, np.float32(0.0), key)
                            for x, y, key in zip(data.x_train, data.y_train,
                                                 keys.unit_keys(seed, data.num_silos))])
  if validation is not None:
    validation_losses = _LossTable(
        process.model,
        [np.concatenate([a, b]) for a, b in zip(validation.x_train, validation.x_test)],
        [np.concatenate([a, b]) for a, b in zip(validation.y_train, validation.y_test)])
  validation_history = []
  with tff_workers_stopped():
    state = process.initialize()
    best_state, best_loss, best_round = state, np.inf, 0

    def step(r):
      nonlocal state
      sampled = users.sample(r)
      if len(sampled):
        state, _ = process.next(state, process.sampled(inputs, sampled))
        users.charge(sampled)

    def after(r):
      nonlocal best_state, best_loss, best_round
      if validation is not None:
        programs.keep_results(state.hypotheses)   # (a bundle's replay: the real ones)
        loss = float(np.mean(validation_losses(state.hypotheses).min(axis=0)))
        validation_history.append((r, loss))
        if loss < best_loss:
          best_state, best_loss, best_round = state, loss, r
      else:
        best_state, best_round = state, r
      if users.exhausted():
        return "leakage_cap"
      if patience is not None and r - best_round >= patience:
        return "early_stopping"
      return None

    log = run_rounds(rounds, step, after=after, progress=progress, start=start)
  hypotheses = tuple(tuple(np.asarray(w) for w in h) for h in best_state.hypotheses)
  assignments = _LossTable(process.model, data.x_train,
                           data.y_train)(hypotheses).argmin(axis=0)
  chosen = tuple(hypotheses[j] for j in assignments)
  evaluator = SiloEvaluator(process.model)
  train, silo_train = evaluator(chosen, data.x_train, data.y_train)
  test, silo_test = evaluator(chosen, data.x_test, data.y_test)
  return DPrivateResult(
      algorithm=process.name, rounds=log.rounds_run, metric=process.model.metric,
      train_metric=train, test_metric=test, silo_train_metric=silo_train,
      silo_test_metric=silo_test, history=((best_round, train, test),),
      round_seconds=log.round_seconds, wall_seconds=time.perf_counter() - start,
      silo_weights=chosen, best_round=best_round, hypotheses=hypotheses,
      assignments=assignments, participations=users.participations,
      leakage=users.leakage(), layer_leakage=process.layer_leakage,
      leakage_per_participation=process.leakage_per_participation,
      declined=users.declined, validation_history=tuple(validation_history),
      stopped_because=log.stopped_because)
