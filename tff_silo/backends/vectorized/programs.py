"""The traced rounds of the vectorized backend: one `tf.function` per definition (by
what its program depends on besides tensors), shared by every run of it, the least
recently used released beyond `MAX_PROGRAMS` (a traced program keeps its graph, its
optimized copies and what it captures alive)."""

from __future__ import annotations

import collections
from typing import Callable, Hashable

import tensorflow as tf

from tff_silo import runner
from tff_silo.backends.vectorized.stacking import StackedSilos, stack_silos

_ROUND_FUNCTIONS = collections.OrderedDict()
MAX_PROGRAMS = 4


def round_program(key: Hashable, make: Callable[[], Callable]):
  """The traced round of program `key`, made by `make()` on first use: a sweep over
  seeds and epsilons traces it once (n, sizes, noise multipliers and keys are
  tensors, so only new shapes retrace)."""
  if key not in _ROUND_FUNCTIONS:
    _ROUND_FUNCTIONS[key] = tf.function(make(), autograph=False, reduce_retracing=True)
    while len(_ROUND_FUNCTIONS) > MAX_PROGRAMS:
      _ROUND_FUNCTIONS.popitem(last=False)
  _ROUND_FUNCTIONS.move_to_end(key)
  return _ROUND_FUNCTIONS[key]


def release_programs() -> None:
  """Drops every traced round (and the memory it holds); the next run traces again."""
  _ROUND_FUNCTIONS.clear()


class StackedRunner:
  """What the vectorized runners of the MR-MTL family and IFCA share (the
  `tff_silo.runner.Runner` protocol): `prepare` stacks the silos once, `initialize` /
  `next` run rounds of the traced `program` with client states stacked on a leading
  silo axis."""

  def __init__(self, process, program):
    self.algorithm = algorithm = runner.definition_of(process)
    self.name, self.model, self.config = algorithm.name, algorithm.model, algorithm.config
    self.epochs_per_round = algorithm.epochs_per_round
    self.num_clusters = algorithm.num_clusters
    self.selection_budget_share = algorithm.selection_budget_share
    self._round = program

  def num_selections(self, rounds: int) -> int:
    return self.algorithm.num_selections(rounds)

  def prepare(self, inputs) -> StackedSilos:
    return stack_silos(inputs)
