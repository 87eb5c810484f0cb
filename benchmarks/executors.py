"""Where the batches of a binary's plan run: in this process (`Local`), or as tasks
on a Ray cluster (`RayCluster`, `--executor=ray`), with the same rows either way.

A batch's work is a `Work`: a module-level function of the binary, its settings (a
frozen dataclass) and the data recipes it reads. On a Ray worker nothing of the
driver's memory is used: the function is imported by its module's name, the settings
rebuilt from their fields (no flag travels: a batch reads its settings only), and
the data loaded from its recipe (`benchmarks.datasets.cached`) and checked against
the digest the driver computed of its own copy (`datasets.travelling`), so a machine
whose data files differ fails its task instead of writing other rows. Per-process
caches (data, calibrations) live as long as the worker does.

Only the driver writes rows: an executor yields each batch's results as it finishes.
On the cluster a batch that fails is retried (a lost worker, an out-of-memory kill);
one that still fails after `attempts` is yielded as a `Failed`, and the driver keeps
every other batch's rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import signal
import socket
import sys
import warnings
from concurrent import futures
from typing import Any, Callable, Iterator, NamedTuple, Optional

from benchmarks import common
from benchmarks.common import UsageError

# How often a batch runs before its failure is final (the first run included).
ATTEMPTS = 3


class Work(NamedTuple):
  """A batch's work: `function(settings, batch, progress)` returns one result per run
  of `batch`. `module` is the importable name of the function's binary (a binary run
  with `python -m` is `__main__` in the driver); on a worker the call runs inside
  the settings' device placement (`common.placement`), after `data` ((loader name,
  recipe, digest) of `benchmarks.datasets.travelling`) is registered with
  `datasets.expect`."""
  function: Callable
  settings: Any
  module: str
  data: tuple = ()

  def __call__(self, batch, progress=None):
    return self.function(self.settings, batch, progress)


class Failed(NamedTuple):
  """A batch that failed on every attempt: the last error, in one line."""
  error: str
  attempts: int


class Local:
  """Batches in this process, in order; `workers` > 1 runs that many at once, each in
  a thread of its own entering `thread_scope()` (TensorFlow's device placement is per
  thread). An error ends the run (the batches not started are dropped)."""
  name = "local"

  def __init__(self, workers: int = 1, thread_scope: Optional[Callable] = None):
    self.workers, self.thread_scope = workers, thread_scope

  def run(self, work: Work, batches: list, progress: Callable = lambda i: None
          ) -> Iterator[tuple]:
    """(index, results) of each batch, in order; `progress(i)` is batch i's round
    progress callback (or None)."""
    if self.workers == 1:
      for i, batch in enumerate(batches):
        yield i, work(batch, progress(i))
      return

    def in_thread(i):
      with self.thread_scope() if self.thread_scope else contextlib.nullcontext():
        return work(batches[i], progress(i))

    pool = futures.ThreadPoolExecutor(self.workers, thread_name_prefix="batch")
    try:
      yield from enumerate(pool.map(in_thread, range(len(batches))))
    finally:
      pool.shutdown(wait=False, cancel_futures=True)

  @staticmethod
  def check_shards(num_shards: int) -> None:
    del num_shards   # any number fits (they share this process)

  @staticmethod
  def recipe(work: Work, spec) -> Callable:
    """A shard's recipe (`tff_silo.sharding`): `work(spec)`, here."""
    return functools.partial(work, spec)

  @staticmethod
  def shards(makes: list) -> list:
    """One run's shards (`tff_silo.sharding`), each built from its recipe, here."""
    from tff_silo import sharding   # pylint: disable=g-import-not-at-top
    return [sharding.InProcess(make) for make in makes]


def _ray():
  """The `ray` module, or a one-line error naming the install command."""
  try:
    import ray   # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError(f"--executor=ray needs Ray: install it with "
                     f"`{common.RAY_INSTALL}` (Python >= 3.10), on every machine of the "
                     "cluster") from None
  return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
  """A one-line error unless `address` (host:port of a cluster's head) accepts a TCP
  connection within `timeout` seconds. `auto` joins the cluster the environment's
  RAY_ADDRESS names, checked the same way (Ray retried a dead one for minutes:
  ../shared/RELIABILITY_CASES.md, E22), else a running or a new local one."""
  named = "--ray_address"
  if address == "auto":
    address = os.environ.get("RAY_ADDRESS", "auto")
    named = "RAY_ADDRESS (the environment)"
    if address in ("auto", "local", "") or address.startswith("ray://"):
      return
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise UsageError(f"{named}={address!r}: give auto or host:port of the "
                     "cluster's head (what `ray start --head` printed)")
  try:
    socket.create_connection((host, int(port)), timeout=timeout).close()
  except OSError as e:
    raise UsageError(f"{named}={address}: no Ray cluster answers there "
                     f"({e.strerror or e}); start one with `ray start --head`"
                     + (", or unset it" if named != "--ray_address" else ", or give auto")
                     ) from None


class RayCluster:
  """Batches as Ray tasks, each asking for `cpus` CPUs and `gpus` GPUs; connects at
  construction (`address` auto: a running cluster, else a local one of this
  machine's CPUs), raising a one-line UsageError when it cannot."""
  name = "ray"

  def __init__(self, address: str = "auto", cpus: float = 1.0, gpus: float = 0.0,
               attempts: int = ATTEMPTS):
    ray = _ray()
    check_reachable(address)
    self.cpus, self.gpus, self.attempts = cpus, gpus, attempts
    _join(ray, address)
    resources = ray.cluster_resources()
    self.total_cpus = resources.get("CPU", 0.0)
    self.total_gpus = resources.get("GPU", 0.0)
    self.machines = sum(1 for node in ray.nodes() if node.get("Alive"))
    if cpus > self.total_cpus or gpus > self.total_gpus:
      raise UsageError(
          f"--ray_cpus_per_task={cpus:g} and --ray_gpus_per_task={gpus:g}: the cluster "
          f"has {self.total_cpus:g} CPUs and {self.total_gpus:g} GPUs; no "
          "task could start")
    self._task = ray.remote(_on_worker).options(
        num_cpus=cpus, num_gpus=gpus, max_retries=0)

  def describe(self) -> str:
    return (f"Ray cluster of {self.machines} machine(s), {self.total_cpus:g} CPUs; "
            f"{self.cpus:g} CPU(s) and {self.gpus:g} GPU(s) a task")

  def run(self, work: Work, batches: list, progress: Callable = lambda i: None
          ) -> Iterator[tuple]:
    """(index, results or `Failed`) of each batch as it finishes; every batch is
    submitted at once (the cluster queues what its resources cannot start)."""
    ray = _ray()
    if batches:
      print(f"{len(batches)} batch(es) to a {self.describe()}", file=sys.stderr,
            flush=True)
    state = ray.put(_travelling(work))
    pending = {}

    def submit(i, attempt):
      pending[self._task.remote(state, batches[i], progress(i))] = (i, attempt)

    for i in range(len(batches)):
      submit(i, 1)
    try:
      while pending:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        i, attempt = pending.pop(ref)
        try:
          yield i, ray.get(ref)
        except (ray.exceptions.RayError, ValueError) as e:
          error = _one_line(e)
          if attempt < self.attempts and not isinstance(e, ValueError):
            print(f"batch {i + 1} failed (attempt {attempt} of {self.attempts}), "
                  f"retried: {error}", file=sys.stderr, flush=True)
            submit(i, attempt + 1)
          else:   # a ValueError is a setting the data cannot take: never retried
            yield i, Failed(error, attempt)
    finally:
      for ref in pending:   # the driver stopped: nothing runs on without it
        ray.cancel(ref, force=True)

  def check_shards(self, num_shards: int) -> None:
    """A one-line error unless `num_shards` actors of a task's resources fit in the
    cluster at once (they live as long as the run: more would wait forever)."""
    if num_shards * self.cpus > self.total_cpus or num_shards * self.gpus > self.total_gpus:
      raise UsageError(
          f"--shards={num_shards} actors of {self.cpus:g} CPU(s) and {self.gpus:g} "
          f"GPU(s) each do not fit at once in the cluster's {self.total_cpus:g} CPUs "
          f"and {self.total_gpus:g} GPUs: lower --ray_cpus_per_task or "
          "--ray_gpus_per_task, or add machines")

  @staticmethod
  def recipe(work: Work, spec) -> Callable:
    """A shard's recipe (`tff_silo.sharding`): `work(spec)` on the shard's worker, as
    a batch runs there (the data checked; `_on_worker`)."""
    return functools.partial(_on_worker, _travelling(work), spec, None)

  def shards(self, makes: list) -> list:
    """One run's shards (`tff_silo.sharding`) as Ray actors of the tasks' resources,
    spread over the cluster's machines, each building its `SiloShard` from its
    recipe (a picklable `make()`: its silos' data is loaded where it runs)."""
    ray = _ray()
    self.check_shards(len(makes))
    print(f"{len(makes)} shard(s) on a {self.describe()}", file=sys.stderr, flush=True)
    actor = ray.remote(_ShardActor).options(num_cpus=self.cpus, num_gpus=self.gpus,
                                            scheduling_strategy="SPREAD")
    return [_RayShard(actor.remote(make)) for make in makes]


class _ShardActor:
  """A Ray actor holding one `tff_silo.sharding.SiloShard`. An error building it
  (data not the driver's, a bad file) is kept and raised by the first call, where
  it arrives as the task's error (an actor that dies in its constructor loses the
  error's type)."""

  def __init__(self, make):
    from tff_silo import sharding   # pylint: disable=g-import-not-at-top
    self._shard, self._error = None, None
    try:
      self._shard = sharding.SiloShard(make)
    except Exception as e:   # pylint: disable=broad-except
      self._error = e

  def call(self, method: str, *args):
    if self._error is not None:
      raise self._error
    return getattr(self._shard, method)(*args)


class _RayShard:
  """The driver's handle of a shard actor: `call` returns a future (`.result()`
  raises the shard's error, one line)."""

  def __init__(self, handle):
    self._handle = handle

  def call(self, method: str, *args):
    return _RayResult(self._handle.call.remote(method, *args))


class _RayResult:
  def __init__(self, ref):
    self._ref = ref

  def result(self):
    ray = _ray()
    try:
      return ray.get(self._ref)
    except ray.exceptions.RayError as e:   # the shard's own error, in one line
      cause = getattr(e, "cause", None)
      if isinstance(cause, ValueError):
        raise ValueError(_one_line(e)) from None
      raise RuntimeError(f"a shard failed: {_one_line(e)}") from None


_joined = []   # the address this process joined (a process joins one cluster)


def _join(ray, address: str) -> None:
  """Joins the cluster at `address` unless this process is in it already (a
  process that runs several binaries' mains, as the tests' drivers do, leaves a
  cluster that is gone or another)."""
  if ray.is_initialized() and (_joined == [address] or not _joined):
    return   # joined here, or by the caller (ray.init before the binary's main)
  if ray.is_initialized():
    ray.shutdown()
  warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")
  os.environ.setdefault("RAY_DEDUP_LOGS", "0")   # every batch's progress, in full
  # no metrics agent for a cluster started here (its workers would print, late,
  # that they cannot reach it)
  os.environ.setdefault("RAY_enable_metrics_collection", "0")
  # a cluster started here runs its workers at this process's priority, not Ray's
  # nice 15 (on a busy machine those made no progress and printed nothing)
  os.environ.setdefault("RAY_worker_niceness", "0")
  if address != "auto":   # the flag wins over the environment's RAY_ADDRESS
    os.environ.pop("RAY_ADDRESS", None)
  on_sigterm = signal.getsignal(signal.SIGTERM)
  try:
    ray.init(address=None if address == "auto" else address, include_dashboard=False,
             logging_level="warning", log_to_driver=True)
  except (ConnectionError, RuntimeError) as e:
    raise UsageError(f"--ray_address={address}: could not join the cluster "
                     f"({str(e).splitlines()[0]})") from None
  if callable(on_sigterm):   # Ray's own handler dumps a stack; the binary's exits
    signal.signal(signal.SIGTERM, on_sigterm)   # through atexit (Ray's shutdown too)
  _joined[:] = [address]


def check_files_written(executor, flags_given: list) -> None:
  """A one-line error for flags naming files a batch writes besides rows
  (`flags_given`: --save_models, --ledger_csv) on a cluster of several machines: a
  worker writes them where it runs, and another machine's disk is not the driver's."""
  if executor.name == "ray" and executor.machines > 1 and flags_given:
    raise UsageError(f"--{flags_given[0]} writes files where a batch runs, and the "
                     f"cluster has {executor.machines} machines: run it with "
                     "--executor=local or on a cluster of this machine alone")


def _one_line(error) -> str:
  """An error's last line: for a task's error, its cause's `Type: message`."""
  cause = getattr(error, "cause", None)
  if cause is not None:
    error = cause
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[-1] if text else ''}"


def _travelling(work: Work) -> tuple:
  """What of `work` goes to a worker: names, the settings' fields and the recipes.
  No flag travels: what a batch does is a function of its settings (a worker's
  flags stay unparsed, so a read of one fails loudly)."""
  cls = type(work.settings)
  cls_module = work.module if cls.__module__ == "__main__" else cls.__module__
  fields = {f.name: getattr(work.settings, f.name)
            for f in dataclasses.fields(work.settings)}
  return (work.module, work.function.__name__, cls_module, cls.__qualname__, fields,
          work.data)


def _on_worker(state: tuple, batch: list, progress):
  """A batch on a Ray worker: the binary's function found by name, the settings
  rebuilt from their fields, the data expected (`datasets.expect`), inside the
  settings' device placement (where they name a device)."""
  module, function, cls_module, cls_name, fields, data = state
  from benchmarks import datasets   # pylint: disable=g-import-not-at-top
  for loader, recipe, digest in data:
    datasets.expect(getattr(datasets, loader), recipe, digest)
  binary = importlib.import_module(module)
  settings = getattr(importlib.import_module(cls_module), cls_name)(**fields)
  with common.placement(settings) if hasattr(settings, "device") else (
      contextlib.nullcontext()):
    return getattr(binary, function)(settings, batch, progress)


def from_flags(workers: int = 1, thread_scope=None):
  """The executor the flags name (`workers` and `thread_scope`: the local one's), a
  cluster joined now: a one-line UsageError for a missing Ray, an unreachable
  address, Ray flags without --executor=ray, or files a batch writes
  (--save_models, --ledger_csv) on a cluster of several machines."""
  from absl import flags
  given = flags.FLAGS
  # (--executor's choices and the Ray flags' ranges: the binary's SPEC checked them)
  if given.executor != "ray":
    for name in ("ray_address", "ray_cpus_per_task", "ray_gpus_per_task"):
      if given[name].present:
        raise UsageError(f"--{name} applies with --executor=ray only")
  chosen = make(given.executor, address=given.ray_address,
                cpus=given.ray_cpus_per_task, gpus=given.ray_gpus_per_task,
                workers=workers, thread_scope=thread_scope)
  check_files_written(chosen, [name for name in ("save_models", "ledger_csv")
                               if name in given and given[name].value])
  return chosen


def make(name: str, *, address: str = "auto", cpus: float = 1.0, gpus: float = 0.0,
         workers: int = 1, thread_scope: Optional[Callable] = None):
  """The executor `--executor` names (`workers` and `thread_scope`: the local one's)."""
  if name == "ray":
    return RayCluster(address, cpus, gpus)
  return Local(workers, thread_scope)
