"""The MR-MTL family's round (local, FedAvg, finetune, MR-MTL, Ditto) for the stacked
silos of one or more runs, and its runner (`VectorizedProcess`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

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


def _family_round(algorithm: SiloAlgorithm):
  """A round of the MR-MTL family (`rounds.client_round`, `rounds.server_step`) for
  the stacked silos of one or more runs: `run` (int32 [K]) is each silo's run,
  `global_w` holds one global model per run ([R, ...]) and each run's server mean
  is over its own silos; a run not `active` (bool [R]) keeps its models."""
  model, config = algorithm.model, algorithm.config
  spec, aggregation = algorithm.round_spec, algorithm.aggregation

  def round_fn(global_w, round_num, personal_w, silos: StackedSilos, run, learning_rate,
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
    total = tf.math.unsorted_segment_sum(weight, run, num_runs)
    mean = [tf.math.unsorted_segment_sum(rows(weight, d) * d, run, num_runs)
            / rows(total, d) for d in delta]
    new_global, new_round = server_step(spec, global_w, round_num, mean)
    silo_active = tf.gather(active, run)
    return (tuple(tf.where(rows(active, n), n, g) for n, g in zip(new_global, global_w)),
            new_round,
            tuple(tf.where(rows(silo_active, n), n, p)
                  for n, p in zip(personal, personal_w)))

  return round_fn


def _program(algorithm: SiloAlgorithm):
  return round_program(stack_key(algorithm), lambda: _family_round(algorithm))


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

  def evaluation_weights(self, state, client_states, rounds_done: int) -> list:
    if self.algorithm.uses_client_state(rounds_done):
      return unstacked(client_states)
    models = unstacked(state.global_weights)
    return [models[r] for r in self.silo_runs(int(client_states[0].shape[0]))]

  def server_models(self, state) -> list:
    """Per stacked run, the server's models: (its global model,)."""
    return [(model,) for model in unstacked(state.global_weights)]

  def cluster_assignments(self, client_states):
    del client_states
    return None

