"""The runner protocol every backend implements, and the registry that picks a
backend's runner for a definition.

An algorithm is defined once, TF only (`tff_silo.algorithms`, `hypernet.algorithm`):
a frozen definition (`SiloAlgorithm`, `ClusteredAlgorithm`, ...). A *runner* executes
it on one backend: `tff` (TFF's runtime, the reference: `tff_silo.backends.tff`) or
`vectorized` (every silo's round as one TF program: `tff_silo.backends.vectorized`).
A definition's module registers its runners (`register`), by path so that nothing
is imported until a run asks for it (TFF takes ~5 s to import and a vectorized run
never needs it); the drivers ask `runner_for` and never switch on types.

The protocol (`Runner`) is what the driver (`tff_silo.simulation`) calls. A family
may add what its own driver needs (d-private clustering's `sampled`, the
hypernetwork's `next(state, sampled, data)`), documented on its runners; the
vectorized runners that can run a run's silos on shards (`tff_silo.sharding`: the
MR-MTL family, IFCA) split `next` into `shard_round` and `server_round`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np

BACKENDS = ("tff", "vectorized")


@runtime_checkable
class Runner(Protocol):
  """What runs a definition's rounds on a backend (silo-trained families).

  Attributes: `name`, `model` (the `SiloModel`), `config` (`LocalTrainingConfig`),
  `epochs_per_round` (local epochs each silo's data is queried for per round),
  `num_clusters` (1 without clusters), `selection_budget_share` (epsilon share of one
  private selection; 0 without).
  """

  name: str
  model: object
  config: object
  epochs_per_round: int
  num_clusters: int
  selection_budget_share: float

  def num_selections(self, rounds: int) -> int:
    """Private selections each silo makes in `rounds` rounds."""

  def prepare(self, inputs: Sequence) -> object:
    """The client data `next` takes, from every silo's `SiloInput` (stacked once)."""

  def initialize(self) -> object:
    """The server state before round 1."""

  def initial_client_states(self, state, num_silos: int) -> object:
    """Every silo's client state before round 1."""

  def next(self, state, client_states, data, active=None) -> tuple:
    """One round: (state, client_states, metrics). `active` (one bool per stacked run)
    is taken by runners that stack runs (`prepare_runs`)."""

  def evaluation_weights(self, state, client_states, rounds_done: int) -> "SiloModels":
    """The model each silo is evaluated with after `rounds_done` rounds."""

  def server_models(self, state) -> list:
    """Per run, the server's models (the global model; the G cluster models)."""

  def cluster_assignments(self, client_states) -> Optional[object]:
    """Each silo's cluster index, or None without clusters."""


@dataclasses.dataclass(frozen=True)
class SiloModels:
  """The model each silo is evaluated with, as slices of stacked layers, read where
  they lie (a round's results: on a device, in a bundle's replay) instead of copied
  out per silo: silo k's layer i is `layers[i][index[0][r], index[1][r], ...]` with
  r = `rows[k]` (all rows when None). A vectorized runner's stacked client states
  have one index (the silo), its runs' global models one (the silo's run), its
  cluster models two (the run, the silo's cluster: a round's result)."""

  layers: tuple
  index: tuple   # one integer vector (array or tensor) per leading axis of the layers
  rows: Optional[np.ndarray] = None

  @classmethod
  def of(cls, models: Sequence) -> "SiloModels":
    """From each silo's model (a sequence of layers), stacked once."""
    layers = tuple(np.stack([np.asarray(m[i], np.float32) for m in models])
                   for i in range(len(models[0])))
    return cls(layers, (np.arange(len(models), dtype=np.int32),))

  def positions(self) -> np.ndarray:
    """The silos' rows in `index`."""
    return (np.arange(int(self.index[0].shape[0])) if self.rows is None
            else self.rows).astype(np.int32)

  def __len__(self) -> int:
    return len(self.positions())

  def subset(self, silos) -> "SiloModels":
    """These models' silos `silos` (positions among them), in that order."""
    return dataclasses.replace(self, rows=self.positions()[np.asarray(silos, int)])

  def silos(self) -> list:
    """Each silo's model, a tuple of numpy layers (copied to the host)."""
    at = tuple(np.asarray(i)[self.positions()] for i in self.index)
    layers = [np.asarray(layer)[at] for layer in self.layers]
    return [tuple(layer[k] for layer in layers) for k in range(len(at[0]))]


# (definition type, backend) -> "module:callable" making the runner of a definition
# or of a process already built for that backend.
_RUNNERS: dict = {}


def register(definition_type: type, **runners: str) -> None:
  """Registers the runners of `definition_type` per backend, each as
  "module.path:callable" (called with the definition, or with a process built for
  that backend). A callable may have `unsupported_reason(definition) -> str | None`
  and `stack_key(definition)` (runs of equal keys stack into one program)."""
  for backend, path in runners.items():
    check_backend(backend)
    if ":" not in path:
      raise ValueError(f"a runner is registered as 'module.path:callable', got {path!r}")
    _RUNNERS[(definition_type, backend)] = path


def check_backend(backend: str) -> str:
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  return backend


def definition_of(process):
  """The registered definition `process` runs: itself, or a built process's
  `algorithm`; None when it is neither."""
  registered = {t for t, _ in _RUNNERS}
  if isinstance(process, tuple(registered)):
    return process
  algorithm = getattr(process, "algorithm", None)
  return algorithm if isinstance(algorithm, tuple(registered)) else None


def _factory(definition, backend: str):
  path = next((p for (t, b), p in _RUNNERS.items()
               if b == backend and isinstance(definition, t)), None)
  if path is None:
    return None
  module, name = path.split(":")
  # A backend's modules load on first use: TFF's only when a run asks for it.
  return getattr(importlib.import_module(module), name)


def unsupported_reason(process, backend: str) -> Optional[str]:
  """Why `process` (a definition or a built process) cannot run on `backend`, or
  None if it can."""
  check_backend(backend)
  definition = definition_of(process)
  factory = None if definition is None else _factory(definition, backend)
  if factory is None:
    names = sorted(t.__name__ for t, b in _RUNNERS if b == backend)
    return (f"backend={backend} runs {', '.join(names)} definitions (or their "
            f"processes); {getattr(process, 'name', type(process).__name__)} is none")
  check = getattr(factory, "unsupported_reason", None)
  return None if check is None else check(definition)


def runner_for(process, backend: str):
  """The runner of `process` (a definition or a process built for `backend`) on
  `backend`; a one-line `ValueError` for what it cannot run (`unsupported_reason`)."""
  reason = unsupported_reason(process, backend)
  if reason is not None:
    raise ValueError(reason)
  definition = definition_of(process)
  return _factory(definition, backend)(process)


def stack_key(process, backend: str):
  """Runs of `process` definitions with equal keys run stacked as one program on
  `backend` (they differ only in tensors); None: this one runs alone."""
  definition = definition_of(process)
  if definition is None or unsupported_reason(process, backend) is not None:
    return None
  key = getattr(_factory(definition, backend), "stack_key", None)
  return None if key is None else key(definition)
