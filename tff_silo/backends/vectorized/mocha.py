"""Mocha's round (`tff_silo.algorithms.mocha`) for the stacked silos of one or more
runs, and its runner (`VectorizedMocha`). The client states are the silos' models,
W itself; the server state is each run's Omega, zero-padded to the largest run."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_silo import batched_random as br
from tff_silo import runner
from tff_silo.algorithms import mocha
from tff_silo.backends.vectorized import training
from tff_silo.backends.vectorized.programs import RunStackingRunner, round_program
from tff_silo.backends.vectorized.stacking import RunStack, StackedSilos, rows
from tff_silo.backends.vectorized.training import train_silos


class MochaState(NamedTuple):
  relationship: tf.Tensor   # [R, K, K]: each run's Omega (K its largest run's silos)
  round_num: tf.Tensor


def unsupported_reason(algorithm: mocha.MochaAlgorithm) -> str | None:
  if algorithm.model.mean_transform is not None:
    return (f"{algorithm.model.name}'s objective is not a mean over examples; "
            "it runs on backend=tff")
  return None


def stack_key(algorithm: mocha.MochaAlgorithm) -> tuple:
  """Runs of equal keys share one program (they differ in data, K, noise, keys,
  initial weights and `hyperparameters`)."""
  return ("mocha", algorithm.model.computation_key, algorithm.config.program_settings(),
          training.MEMORY_BUDGET_FLOATS)


def hyperparameters(algorithm: mocha.MochaAlgorithm) -> tuple:
  """(learning rate, lambda): what a run feeds its stacked program as tensors."""
  return algorithm.config.learning_rate, algorithm.lam


def _mocha_round(algorithm: mocha.MochaAlgorithm):
  """A round of Mocha for the stacked silos: `run` (int32 [S]) is each silo's run,
  a run's silos consecutive; a run not `active` (bool [R]) keeps its models and
  Omega."""
  model, config = algorithm.model, algorithm.config

  def round_fn(omega, round_num, personal, silos: StackedSilos, run, learning_rate, lam,
               active):
    num_runs, size = tf.shape(omega)[0], tf.shape(omega)[1]
    counts = tf.math.unsorted_segment_sum(tf.ones_like(run), run, num_runs)
    position = tf.range(tf.shape(run)[0]) - tf.gather(tf.cumsum(counts, exclusive=True),
                                                      run)
    where = tf.stack([run, position], axis=1)   # each silo's (run, row of W)

    def per_run(stacked):   # [S, ...] -> [R, K, ...], padded rows zero
      return [tf.scatter_nd(where, w, tf.concat([[num_runs, size], tf.shape(w)[1:]], 0))
              for w in stacked]

    diag, pull = mocha.pulls(omega, per_run(personal))
    strength, anchor = mocha.regularizer(
        lam, tf.gather_nd(diag, where), [tf.gather_nd(p, where) for p in pull])
    new = train_silos(model, config, personal, anchor, strength, silos,
                      br.fold_in(silos.key, round_num), 0, learning_rate)
    new_omega = mocha.relationship(per_run(new), counts)
    silo_active = tf.gather(active, run)
    return (tf.where(rows(active, omega), new_omega, omega), round_num + 1,
            tuple(tf.where(rows(silo_active, n), n, p) for n, p in zip(new, personal)))

  return round_fn


class VectorizedMocha(RunStackingRunner):
  """A `MochaAlgorithm` (or its TFF process) with all silos in one TF program per
  round; runs of one `stack_key` stack (`prepare_runs`), each with its own Omega."""

  unsupported_reason = staticmethod(unsupported_reason)
  stack_key = staticmethod(stack_key)
  hyperparameters = staticmethod(hyperparameters)

  def __init__(self, process):
    algorithm = runner.definition_of(process)
    super().__init__(process, round_program(stack_key(algorithm),
                                            lambda: _mocha_round(algorithm)))
    self._num_silos = [algorithm.num_silos]

  def prepare_runs(self, definitions, inputs_per_run) -> RunStack:
    defined = [runner.definition_of(d) for d in definitions]
    for definition, inputs in zip(defined, inputs_per_run):
      definition.check_silos(len(inputs))
    self._num_silos = [d.num_silos for d in defined]
    return super().prepare_runs(definitions, inputs_per_run)

  def initialize(self) -> MochaState:
    size = max(self._num_silos)
    return MochaState(
        tf.constant(np.stack([mocha.initial_relationship(k, size)
                              for k in self._num_silos])),
        tf.constant(0, tf.int32))

  def initial_client_states(self, state, num_silos: int) -> tuple:
    run = self.silo_runs(num_silos)
    return tuple(tf.gather(w, run) for w in self.initial_models())

  def next(self, state: MochaState, client_states, data: RunStack, active=None):
    omega, round_num, personal = self._round(
        state.relationship, state.round_num, client_states, data.silos, data.run,
        data.learning_rate, data.lam, self.active_runs(active))
    return MochaState(omega, round_num), personal, {}

  def evaluation_weights(self, state, client_states, rounds_done: int) -> runner.SiloModels:
    del state, rounds_done
    num_silos = int(client_states[0].shape[0])
    return runner.SiloModels(tuple(client_states), (np.arange(num_silos, dtype=np.int32),))

  def server_models(self, state) -> list:
    """Per run: no server model (the server holds W, the silos' own models, and
    Omega)."""
    return [() for _ in range(int(state.relationship.shape[0]))]

  def cluster_assignments(self, client_states):
    del client_states
    return None
