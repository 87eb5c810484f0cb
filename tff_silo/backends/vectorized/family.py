"""The MR-MTL family's round (local, FedAvg, finetune, MR-MTL, Ditto) for the stacked
silos of one or more runs, and its runner (`VectorizedProcess`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import runner
from tff_silo.algorithms.rounds import SiloAlgorithm, client_round, server_step
from tff_silo.backends.vectorized import training
from tff_silo.backends.vectorized.programs import RunStackingRunner, round_program
from tff_silo.backends.vectorized.stacking import RunStack, StackedSilos, rows, unstacked
from tff_silo.backends.vectorized.training import train_silos


class VectorizedState(NamedTuple):
  global_weights: tuple   # [R, ...]: the global model of each stacked run
  round_num: tf.Tensor


def unsupported_reason(algorithm: SiloAlgorithm) -> str | None:
  """Why `algorithm` cannot run on the vectorized backend, or None if it can."""
  if algorithm.aggregation is None:
    return ("the vectorized backend computes the weighted and unweighted mean only; "
            "other tff.aggregators factories run on backend=tff")
  if algorithm.model.mean_transform is not None:
    return (f"{algorithm.model.name}'s objective is not a mean over examples; "
            "it runs on backend=tff")
  return None


def stack_key(algorithm: SiloAlgorithm) -> tuple:
  """What the round's program depends on besides its tensors (the model by its
  `computation_key`): runs of one method with equal keys stack into one program
  (`VectorizedProcess.prepare_runs`; they differ only in data, noise multipliers,
  keys, initial weights and `hyperparameters`)."""
  return (algorithm.name, algorithm.model.computation_key,
          algorithm.config.program_settings(),
          dataclasses.replace(algorithm.round_spec, lam=0.0),
          algorithm.personal_from_round, algorithm.aggregation,
          training.MEMORY_BUDGET_FLOATS)


def hyperparameters(algorithm: SiloAlgorithm) -> tuple:
  """(learning rate, lambda): what a run feeds its stacked program as tensors."""
  return algorithm.config.learning_rate, algorithm.round_spec.lam


def _family_client_part(algorithm: SiloAlgorithm):
  """The silos' half of a round of the MR-MTL family (`rounds.client_round`) for the
  stacked silos of one or more runs: `run` (int32 [K]) is each silo's run and
  `global_w` holds one global model per run ([R, ...]). Returns (the new personal
  models, the contribution): per run the weighted sums of the silos' deltas and of
  their weights, which add up across shards of a run's silos (`tff_silo.sharding`);
  a silo of a run not `active` (bool [R]) keeps its model."""
  model, config = algorithm.model, algorithm.config
  spec, aggregation = algorithm.round_spec, algorithm.aggregation

  def client_fn(global_w, round_num, personal_w, silos: StackedSilos, run, learning_rate,
                lam, active):
    num_runs = tf.shape(active)[0]
    global_b = [tf.gather(g, run) for g in global_w]
    round_keys = br.fold_in(silos.key, round_num)
    train = lambda w, lam_, pass_: train_silos(model, config, w, global_b, lam_, silos,
                                               round_keys, pass_, learning_rate)
    personal, delta = client_round(spec, global_b, personal_w, round_num, train, lam)
    if aggregation == "weighted_mean":   # public sizes, as the TFF process weighs
      weight = silos.public_size
    else:
      weight = tf.ones_like(silos.size)
    sums = tuple(tf.math.unsorted_segment_sum(rows(weight, d) * d, run, num_runs)
                 for d in delta)
    silo_active = tf.gather(active, run)
    return (tuple(tf.where(rows(silo_active, n), n, p)
                  for n, p in zip(personal, personal_w)),
            (sums, tf.math.unsorted_segment_sum(weight, run, num_runs)))

  return client_fn


def _family_server_part(algorithm: SiloAlgorithm):
  """The server's half (`rounds.server_step`): each run's global model moves by its
  silos' mean delta (the summed contributions); a run not `active` keeps it."""
  spec = algorithm.round_spec

  def server_fn(global_w, round_num, contribution, active):
    sums, total = contribution
    mean = [s / rows(total, s) for s in sums]
    new_global, new_round = server_step(spec, global_w, round_num, mean)
    return (tuple(tf.where(rows(active, n), n, g) for n, g in zip(new_global, global_w)),
            new_round)

  return server_fn


def _family_round(algorithm: SiloAlgorithm):
  """A whole round: the silos' half, then the server's, in one program."""
  client_fn, server_fn = _family_client_part(algorithm), _family_server_part(algorithm)

  def round_fn(global_w, round_num, personal_w, silos: StackedSilos, run, learning_rate,
               lam, active):
    personal, contribution = client_fn(global_w, round_num, personal_w, silos, run,
                                       learning_rate, lam, active)
    return (*server_fn(global_w, round_num, contribution, active), personal)

  return round_fn


def _program(algorithm: SiloAlgorithm, part: str = "round"):
  make = dict(round=_family_round, client=_family_client_part,
              server=_family_server_part)[part]
  return round_program((stack_key(algorithm), part), lambda: make(algorithm))


class VectorizedProcess(RunStackingRunner):
  """A process or definition of the MR-MTL family run with all silos in one TF
  program per round; several runs of one `stack_key` share it (`prepare_runs`),
  each with its own global model and server mean."""

  unsupported_reason = staticmethod(unsupported_reason)
  stack_key = staticmethod(stack_key)
  hyperparameters = staticmethod(hyperparameters)

  def __init__(self, process):
    super().__init__(process, _program(runner.definition_of(process)))

  def initialize(self) -> VectorizedState:
    return VectorizedState(self.initial_models(), tf.constant(0, tf.int32))

  def initial_client_states(self, state, num_silos: int) -> tuple:
    run = self.silo_runs(num_silos)
    return tuple(tf.gather(w, run) for w in state.global_weights)

  def next(self, state: VectorizedState, client_states, data: RunStack, active=None):
    """A round of every stacked run (`active`, bool [R]: the runs that train)."""
    new_global, new_round, personal = self._round(
        state.global_weights, state.round_num, client_states, data.silos, data.run,
        data.learning_rate, data.lam, self.active_runs(active))
    return VectorizedState(tuple(new_global), new_round), personal, {}

  def shard_round(self, state: VectorizedState, client_states, data: RunStack,
                  active=None):
    """The silos' half of `next` on a shard of the silos (`tff_silo.sharding`): (the
    new client states, the contribution: per run the weighted delta sums and the
    weight total)."""
    return _program(self.algorithm, "client")(
        state.global_weights, state.round_num, client_states, data.silos, data.run,
        data.learning_rate, data.lam, self.active_runs(active))

  def server_round(self, state: VectorizedState, contribution, active=None):
    """The server's half of `next`, on the contributions of every shard summed."""
    new_global, new_round = _program(self.algorithm, "server")(
        state.global_weights, state.round_num, contribution, self.active_runs(active))
    return VectorizedState(tuple(new_global), new_round)

  def evaluation_weights(self, state, client_states, rounds_done: int) -> runner.SiloModels:
    num_silos = int(client_states[0].shape[0])
    if self.algorithm.uses_client_state(rounds_done):
      return runner.SiloModels(tuple(client_states),
                               (np.arange(num_silos, dtype=np.int32),))
    return runner.SiloModels(tuple(state.global_weights), (self.silo_runs(num_silos),))

  def server_models(self, state) -> list:
    """Per stacked run, the server's models: (its global model,)."""
    return [(model,) for model in unstacked(state.global_weights)]

  def cluster_assignments(self, client_states):
    del client_states
    return None

