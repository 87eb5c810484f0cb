"""The traced rounds of the vectorized backend: one `tf.function` per definition (by
what its program depends on besides tensors), shared by every run of it, the least
recently used released beyond `MAX_PROGRAMS` (a traced program keeps its graph, its
optimized copies and what it captures alive)."""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Callable, Hashable

import numpy as np
import tensorflow as tf

from tff_silo import runner
from tff_silo.backends.vectorized.stacking import (
    RunStack, StackedSilos, stack_silos)

_ROUND_FUNCTIONS = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()
MAX_PROGRAMS = 4
_XLA = [False]
_PJRT = [None]   # the PJRT platform rounds run on (None: TensorFlow runs them)
_BUNDLE = [None]   # the bundle rounds are recorded into or replayed from


@contextlib.contextmanager
def xla_rounds(enabled: bool = True):
  """Within it, rounds made by `round_program` are compiled by XLA
  (`jit_compile=True`: static shapes, one compilation per shape of the inputs; the
  same numbers to float32 rounding). Binaries set it from --xla."""
  before, _XLA[0] = _XLA[0], bool(enabled)
  try:
    yield
  finally:
    _XLA[0] = before


@contextlib.contextmanager
def _compiled_with(slot: list, value):
  """XLA-compiled rounds with `slot` (`_PJRT` or `_BUNDLE`) set to `value`."""
  before, slot[0] = slot[0], value
  try:
    with xla_rounds(True):
      yield
  finally:
    slot[0] = before


def pjrt_rounds(platform: str = "cpu"):
  """Within it, rounds made by `round_program` are lowered to HLO by TensorFlow and
  compiled and run by XLA's PJRT runtime on `platform` (`tff_silo.pjrt`): the
  numbers of `xla_rounds`, on any device a jaxlib client drives."""
  from tff_silo import pjrt
  pjrt.client(platform)   # (a platform outside pjrt.PLATFORMS or missing: refused)
  return _compiled_with(_PJRT, platform)


def pjrt_platform():
  """The PJRT platform rounds run on now (inside `pjrt_rounds`), else None."""
  return _PJRT[0]


def evaluation_function(python_function):
  """`python_function` as a driver's evaluation runs it: traced by TensorFlow, or
  inside `pjrt_rounds` run by PJRT on the rounds' platform (lowered and compiled
  once per input shape). Inside `bundled_rounds`, a call that reads rounds' results
  (a vectorized runner's `SiloModels`) is the bundle's, as the rounds are; one on
  models the driver chose on the host (d-private clustering's) runs here."""
  if _PJRT[0] is not None:
    from tff_silo import pjrt
    return pjrt.PjrtFunction(python_function, _PJRT[0])
  from tff_silo import bundles
  traced = tf.function(python_function, reduce_retracing=True)
  bundled = bundles.BundledFunction(python_function, lambda: _BUNDLE[0], evaluation=True)

  def evaluate(*args):
    reads_results = _BUNDLE[0] is not None and _BUNDLE[0].reads_results(args)
    return (bundled if reads_results else traced)(*args)

  return evaluate


def bundled_rounds(bundle):
  """Within it, rounds made by `round_program` are lowered to HLO and recorded into,
  or replayed from, `bundle` (a `tff_silo.bundles.Recording` or `Replay`) instead of
  run here."""
  return _compiled_with(_BUNDLE, bundle)


def keep_results(values) -> None:
  """Marks round results that the driver reads between rounds, inside
  `bundled_rounds`: a bundle writes them back from its replay (`bundles._Calls.keep`).
  Nothing elsewhere."""
  if _BUNDLE[0] is not None:
    _BUNDLE[0].keep(values)


def compiling_rounds() -> bool:
  """Whether rounds made now are XLA-compiled (inside `xla_rounds` or
  `pjrt_rounds`)."""
  return _XLA[0]


def padded_ids(ids, padded: bool):
  """(int32 [W], float32 [W]): a round's sampled user ids and which are real. For an
  XLA-compiled round (`padded`) the ids are padded with user 0, marked 0, to a
  power of two W: one compilation per power, not per count of users sampled."""
  ids = np.asarray(ids, np.int32)
  width = 1 << max(len(ids) - 1, 0).bit_length() if padded else len(ids)
  return (tf.constant(np.pad(ids, (0, width - len(ids)))),
          tf.constant(np.arange(width) < len(ids), tf.float32))


def round_program(key: Hashable, make: Callable[[], Callable]):
  """The traced round of program `key`, made by `make()` on first use: a sweep over
  seeds and epsilons traces it once (n, sizes, noise multipliers and keys are
  tensors, so only new shapes retrace); XLA-compiled inside `xla_rounds`, run by
  PJRT inside `pjrt_rounds`, recorded or replayed inside `bundled_rounds`."""
  key = (key, _XLA[0], _PJRT[0], _BUNDLE[0])
  with _PROGRAMS_LOCK:   # runs in several threads (benchmarks.compare)
    if key not in _ROUND_FUNCTIONS:
      if _BUNDLE[0] is not None:
        _ROUND_FUNCTIONS[key] = _BUNDLE[0].function(make())
      elif _PJRT[0] is not None:
        from tff_silo import pjrt
        _ROUND_FUNCTIONS[key] = pjrt.PjrtFunction(make(), _PJRT[0])
      else:
        _ROUND_FUNCTIONS[key] = tf.function(make(), autograph=False,
                                            reduce_retracing=True, jit_compile=_XLA[0])
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


class RunStackingRunner(StackedRunner):
  """A `StackedRunner` whose program also runs several runs of one definition at once
  (a sweep's epsilons and seeds): `prepare_runs` stacks their silos, each silo
  tagged with its run (`RunStack.run`) and its run's learning rate and lambda
  (tensors, so runs of different ones share the program), and each run keeps its
  own server state, noise, keys and ledger, so that the numbers are each run's own.
  A subclass sets `stack_key(definition)` (runs of equal keys share the program)
  and `hyperparameters(definition)` (its (learning rate, lambda))."""

  stack_key = None
  hyperparameters = None

  def __init__(self, process, program):
    super().__init__(process, program)
    self._initial = [self.algorithm.initial_weights]
    self._run = None   # each silo's run (None: one run)

  def prepare(self, inputs) -> RunStack:
    return self.prepare_runs([self.algorithm], [inputs])

  def prepare_runs(self, definitions, inputs_per_run) -> RunStack:
    """Stacks the silos of runs of `definitions` (processes or definitions of equal
    `stack_key`, for their initial weights), `inputs_per_run` their `SiloInput`s."""
    defined = [runner.definition_of(d) for d in definitions]
    if ({self.stack_key(d) for d in defined} != {self.stack_key(self.algorithm)}
        or len(definitions) != len(inputs_per_run)):
      raise ValueError("stacked runs must have definitions of one stack_key, one per "
                       "run's inputs")
    self._initial = [d.initial_weights for d in defined]
    self._run = np.repeat(np.arange(len(definitions), dtype=np.int32),
                          [len(i) for i in inputs_per_run])
    lr, lam = np.array([self.hyperparameters(d) for d in defined], np.float32)[self._run].T
    return RunStack(stack_silos([i for inputs in inputs_per_run for i in inputs]),
                    tf.constant(self._run), tf.constant(lr), tf.constant(lam))

  @property
  def num_runs(self) -> int:
    return len(self._initial)

  def silo_runs(self, num_silos: int) -> np.ndarray:
    """Each silo's run."""
    return np.zeros(num_silos, np.int32) if self._run is None else self._run

  def initial_models(self) -> tuple:
    """Per layer, every run's initial model ([R, ...])."""
    return tuple(tf.constant(np.stack([w[i] for w in self._initial]))
                 for i in range(len(self._initial[0])))

  def active_runs(self, active) -> tf.Tensor:
    """`next`'s `active` (one bool per run; None: all) as a tensor."""
    return (tf.ones([self.num_runs], tf.bool) if active is None
            else tf.constant(np.asarray(active, bool)))
