"""One run's silos split across shards that hold their silos' data and states, for a
run too large for one machine (issue 32; cross-silo federation itself is silos on
different machines).

Each round the driver sends the server state to every shard; a shard runs the
silos' half of the round on its silos (`shard_round` of the vectorized runners of
the MR-MTL family and IFCA) and returns its contribution, sums that add up across
shards (per run the weighted delta sums and weight totals; IFCA's per cluster, and
its member counts); the driver adds them in shard order and runs the server's half
(`server_round`). Keys derive from global silo ids (`keys.unit_keys(seed, K)[lo:hi]`)
and the ledgers stay with the driver (`simulation`'s one round loop charges them
before each round), so a sharded run gives the unsharded run's numbers, up to the
float32 rounding of adding the sums in another order (tested: MR-MTL, Ditto, IFCA
at 1, 2 and 3 shards).

A shard is built where it runs, from `make()` -> (definition, `SiloData` of its
silos): its data never passes through the driver, which holds the silos' sizes,
the server state and the ledgers. Shards run here (`InProcess`) or as Ray actors
(`benchmarks.executors.RayCluster.shards`); both answer `call(method, *args)` with a
future (`.result()`), so the shards of a round work at once.
"""

from __future__ import annotations

import dataclasses
import functools
import resource
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_silo import simulation
from tff_silo.algorithms.rounds import SiloInput
from tff_silo.data.silos import SiloData
from tff_silo.evaluation import SiloEvaluator
from tff_silo.runner import SiloModels, runner_for


def bounds(num_silos: int, num_shards: int) -> list:
  """[(lo, hi)]: the silos of each of `num_shards` shards, contiguous, their counts
  differing by at most one; a one-line ValueError when there are more shards than
  silos."""
  if not 1 <= num_shards <= num_silos:
    raise ValueError(f"shards must be between 1 and the {num_silos} silos, got "
                     f"{num_shards}")
  edges = np.linspace(0, num_silos, num_shards + 1).round().astype(int)
  return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def shard_runner(definition):
  """The vectorized runner of `definition`, if it can run sharded; a one-line
  ValueError if not."""
  runner = runner_for(definition, "vectorized")
  if not hasattr(runner, "shard_round"):
    raise ValueError(f"{runner.name} cannot run sharded: the MR-MTL family (local, "
                     "fedavg, finetune, mrmtl, ditto) and IFCA's methods can")
  return runner


def _signature(definition) -> tuple:
  """What a shard's definition must share with the driver's (its model may be
  built over its own data: the pandemic's tables)."""
  runner = shard_runner(definition)
  return (runner.name, runner.config, runner.num_clusters, runner.epochs_per_round,
          tuple(tuple(s) for s in runner.model.weight_shapes),
          type(runner).hyperparameters(runner.algorithm))


class SiloShard:
  """The silos lo..hi of a run, where they are trained: built from `make()` ->
  (definition, `SiloData` of these silos[, info: what else its recipe reports]), it
  keeps their data, the vectorized runner's client states and its stacked inputs."""

  def __init__(self, make: Callable[[], tuple]):
    self.definition, self.data, *info = make()
    self.info = info[0] if info else {}
    self.runner = shard_runner(self.definition)
    self._evaluator = SiloEvaluator(self.runner.model)
    self._inputs = self._clients = None

  def describe(self) -> dict:
    """What the driver needs of these silos: their sizes, the definition's
    signature (checked against the driver's) and the recipe's info."""
    return dict(train_sizes=self.data.train_sizes, test_sizes=self.data.test_sizes,
                signature=_signature(self.definition), info=self.info)

  def prepare(self, silo_inputs: Sequence[SiloInput]) -> None:
    """Stacks the silos' data with what the driver set per silo (noise, key,
    selection epsilon, public size: `SiloInput`s without arrays)."""
    self._inputs = self.runner.prepare(
        [given._replace(x=x, y=y) for given, x, y in
         zip(silo_inputs, self.data.x_train, self.data.y_train)])

  def start(self, state) -> None:
    self._clients = self.runner.initial_client_states(_tensors(state),
                                                      self.data.num_silos)

  def contribute(self, state, active) -> tuple:
    """Runs the silos' half of a round from the server `state`; its contribution."""
    self._clients, contribution = self.runner.shard_round(
        _tensors(state), self._clients, self._inputs, active)
    return _arrays(contribution)

  def weights(self, state, rounds_done: int) -> list:
    """The model each silo is evaluated with (`evaluation_weights`), per silo."""
    return self._models(state, rounds_done).silos()

  def _models(self, state, rounds_done: int):
    return self.runner.evaluation_weights(_tensors(state), self._clients, rounds_done)

  def evaluate(self, state, rounds_done: int) -> tuple:
    """(each silo's weights, its train metric, its test metric)."""
    models = self._models(state, rounds_done)
    _, silo_train = self._evaluator(models, self.data.x_train, self.data.y_train)
    _, silo_test = self._evaluator(models, self.data.x_test, self.data.y_test)
    return models.silos(), silo_train, silo_test

  def clusters(self) -> Optional[np.ndarray]:
    return self.runner.cluster_assignments(self._clients)

  def apply(self, fn: Callable, *args):
    """fn(this shard, *args) where the data is (a pipeline's own figures)."""
    return fn(self, *args)

  @staticmethod
  def peak_memory_mb() -> float:
    """This process's peak resident memory (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _tensors(structure):
  return tf.nest.map_structure(tf.constant, structure)


def _arrays(structure):
  return tf.nest.map_structure(np.asarray, structure)


class _Done:
  """A future already resolved (`InProcess`'s)."""

  def __init__(self, value):
    self._value = value

  def result(self):
    return self._value


class InProcess:
  """A `SiloShard` in this process (tests; several runs' shards on one machine)."""

  def __init__(self, make: Callable[[], tuple]):
    self._shard = SiloShard(make)

  def call(self, method: str, *args) -> _Done:
    return _Done(getattr(self._shard, method)(*args))


def gather(shards, method: str, *args_per_shard) -> list:
  """Each shard's `method` on its own arguments (one sequence per argument), run at
  once; the results in shard order."""
  futures = [shard.call(method, *args) for shard, *args in zip(shards, *args_per_shard)]
  return [future.result() for future in futures]


@dataclasses.dataclass(frozen=True)
class ShardedSilos:
  """The driver's view of a sharded run's silos: their sizes only (the arrays stay
  on the shards; `x_train` and `y_train` are placeholders, one None per silo)."""
  name: str
  train_sizes: np.ndarray
  test_sizes: np.ndarray

  @property
  def num_silos(self) -> int:
    return len(self.train_sizes)

  @property
  def x_train(self) -> tuple:
    return (None,) * self.num_silos

  y_train = x_train


class ShardedRunner:
  """The driver's runner of a sharded run (`tff_silo.runner.Runner`): the server's
  state and half of each round here, the silos' on the `shards`."""

  def __init__(self, definition, shards: Sequence, silo_bounds: Sequence[tuple]):
    self._runner = runner = shard_runner(definition)
    self._shards, self._bounds = list(shards), list(silo_bounds)
    self.algorithm = runner.algorithm
    self.name, self.model, self.config = runner.name, runner.model, runner.config
    self.epochs_per_round = runner.epochs_per_round
    self.num_clusters = runner.num_clusters
    self.selection_budget_share = runner.selection_budget_share

  def num_selections(self, rounds: int) -> int:
    return self._runner.num_selections(rounds)

  def _each(self, method: str, *args) -> list:
    """`method` of every shard, all on the same arguments."""
    return gather(self._shards, method, *([a] * len(self._shards) for a in args))

  def prepare(self, inputs) -> None:
    """Sends each shard what the driver set for its silos (no arrays)."""
    given = [i._replace(x=None, y=None) for i in inputs]
    gather(self._shards, "prepare", [given[lo:hi] for lo, hi in self._bounds])

  def initialize(self):
    return self._runner.initialize()

  def initial_client_states(self, state, num_silos: int) -> None:
    """The client states start on the shards (none here)."""
    del num_silos
    self._each("start", _arrays(state))

  def next(self, state, client_states, data, active=None):
    del client_states, data   # on the shards
    parts = self._each("contribute", _arrays(state),
                       None if active is None else list(active))
    summed = tf.nest.map_structure(lambda *p: functools.reduce(np.add, p), *parts)
    return self._runner.server_round(state, _tensors(summed), active), None, {}

  def evaluation_weights(self, state, client_states, rounds_done: int) -> SiloModels:
    del client_states
    return SiloModels.of([w for part in self._each("weights", _arrays(state), rounds_done)
                          for w in part])

  def evaluate_silos(self, state, client_states, rounds_done: Sequence[int]) -> list:
    """Evaluated on the shards (`simulation`): [(weights, silo train metric, silo
    test metric)] of the one run."""
    del client_states
    (done,) = rounds_done
    parts = self._each("evaluate", _arrays(state), done)
    return [(SiloModels.of([w for p in parts for w in p[0]]),
             np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))]

  def server_models(self, state) -> list:
    return self._runner.server_models(state)

  def cluster_assignments(self, client_states):
    del client_states
    parts = self._each("clusters")
    return None if parts[0] is None else np.concatenate(parts)


def run_sharded(definition, shards: Sequence, *, rounds: int, eval_every: int = 0,
                progress=None, name: str = "sharded", described: Optional[list] = None,
                **run) -> simulation.SimulationResult:
  """`simulation.run_simulation` of `definition` (its vectorized runner; the driver's
  copy, of the shards' signature) with the silos of `shards`, in order (each built
  from a `make()` by `InProcess` or `benchmarks.executors.RayCluster.shards`);
  `described`: their `describe()` answers, if the caller asked for them already;
  `run`: what `run_simulation` takes besides (target_epsilon, target_delta, seed,
  protocol, ledger_csv, preprocessing_events, noise_multiplier)."""
  described = described or gather(shards, "describe")
  expected = _signature(definition)
  for i, d in enumerate(described):
    if d["signature"] != expected:
      raise ValueError(f"shard {i} trains {d['signature']}, the driver "
                       f"{expected}: build every shard from the driver's definition")
  edges = np.cumsum([0] + [len(d["train_sizes"]) for d in described])
  silos = ShardedSilos(name, np.concatenate([d["train_sizes"] for d in described]),
                       np.concatenate([d["test_sizes"] for d in described]))
  process = ShardedRunner(definition, shards, list(zip(edges[:-1], edges[1:])))
  return simulation.simulate(process, simulation.Run(definition, silos, **run), rounds,
                             eval_every, progress)


def silo_data(data: SiloData, lo: int, hi: int) -> SiloData:
  """The silos lo..hi of `data` (a shard's share of data it can load whole)."""
  part = lambda arrays: tuple(arrays[lo:hi])
  return dataclasses.replace(
      data, x_train=part(data.x_train), y_train=part(data.y_train),
      x_test=part(data.x_test), y_test=part(data.y_test),
      groups=None if data.groups is None else part(data.groups))
