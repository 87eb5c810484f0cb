"""The driver of the silo-trained families (the MR-MTL family, Mocha, IFCA): runs a
definition's runner (`tff_silo.runner`) for T rounds over every silo, in the one
round loop (`tff_silo.driver.run_rounds`), several runs stacked where the backend
stacks them.

Its privacy bookkeeping is a `privacy.silo_accounts.SiloAccounts` per run: each
silo's DP-SGD noise calibrated to the silo's own (epsilon_k, delta_k) (silo-specific
example-level DP) under a `PrivacyProtocol` (neighbouring relation, what is public),
and every round's queries charged to each silo's `PrivacyLedger` before the round
(the only source of the epsilon reported; a round that would exceed a silo's budget
is not run). The driver keeps the client states keyed by silo index, evaluates
every silo's personalized model (`tff_silo.evaluation`: the test metric averaged
over silos weighted by test counts, thesis app. B.4), and stops TFF's worker
process when done.

Figures computed on the silos' training data (`train_metric`, `silo_train_metric`)
are not noised: they are outside the DP guarantee and for inspection only.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

import numpy as np

from tff_silo import keys
from tff_silo.algorithms.rounds import SiloInput
from tff_silo.data.silos import SiloData
from tff_silo.driver import RunResult, check_run_length, run_rounds, tff_workers_stopped
from tff_silo.evaluation import SiloEvaluator, pooled
from tff_silo.privacy.protocol import PrivacyProtocol
from tff_silo.privacy.silo_accounts import SiloAccounts, SiloPrivacy, charge_round
from tff_silo.runner import Runner, runner_for, stack_key


@dataclasses.dataclass(frozen=True)
class SimulationResult(RunResult):
  """What one run of the silo-trained families produced (`RunResult`'s fields and):

  privacy: the silos' `SiloPrivacy` (None without DP).
  clusters: each silo's final cluster (IFCA), else None.
  server_weights: the server's models at the end: (the global model,) for the MR-MTL
    family (for local training, the untrained initial one), the G cluster models for
    IFCA, () for Mocha (no server model).
  runs_stacked: runs that shared these rounds and this wall time.
  aggregator_measurements: the last round's measurements of a `tff.aggregators`
    factory, flattened ("clipping/clip": value); empty where there are none (plain
    means, stacked runs).
  """

  privacy: Optional[SiloPrivacy] = None
  clusters: Optional[np.ndarray] = None
  server_weights: tuple = ()
  runs_stacked: int = 1
  aggregator_measurements: dict = dataclasses.field(default_factory=dict)


def silo_runner(process, backend: str):
  """The runner of `process` on `backend` for this driver (`tff_silo.runner.Runner`);
  a one-line error for a definition with a driver of its own."""
  runner = runner_for(process, backend)
  if not isinstance(runner, Runner):
    raise ValueError(
        f"run_simulation runs the silo-trained families (the MR-MTL family, IFCA); "
        f"{type(process).__name__} runs with its own driver "
        "(tff_silo.dprivate_simulation.run_dprivate_clustering, hypernet.run_hypernet)")
  return runner


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of `run_simulations`: a process or definition, its silos and what
  `run_simulation` takes besides T (see there)."""

  process: object
  data: SiloData
  target_epsilon: object = None
  target_delta: object = None
  seed: Optional[int] = 0
  protocol: Optional[PrivacyProtocol] = None
  ledger_csv: Optional[str] = None
  preprocessing_events: Optional[Sequence] = None
  noise_multiplier: object = None


def run_simulation(process, data: SiloData, *, rounds: int,
                   target_epsilon=None, target_delta=None, seed: Optional[int] = 0,
                   eval_every: int = 0,
                   progress: Optional[Callable[[int, int, float], None]] = None,
                   protocol: Optional[PrivacyProtocol] = None,
                   ledger_csv: Optional[str] = None,
                   preprocessing_events: Optional[Sequence] = None,
                   noise_multiplier=None,
                   backend: str = "tff") -> SimulationResult:
  """Runs `process` for `rounds` rounds on all silos and evaluates them.

  Args:
    process: a definition (`<name>_algorithm`: a `SiloAlgorithm` or, for IFCA, a
      `ClusteredAlgorithm`; TF only, the TFF process is built when `backend="tff"`)
      or its TFF process (`tff_silo.backends.tff.process_for`).
    data: the silos; its feature shape must match the process's.
    rounds: T, the number of rounds.
    target_epsilon, target_delta: a scalar or one value per silo; required exactly
      when the process trains with DP (its config has `l2_norm_clip`).
    seed: the root of every silo's keys (`tff_silo.keys`); None draws it from OS
      entropy (a deployment), a fixed seed is for reproducible simulation.
    eval_every: also evaluate every this many rounds (0: only at the end).
    progress: called as `progress(rounds_done, rounds, seconds_so_far)` each round.
    protocol: the `PrivacyProtocol` under DP (default: add/remove-one, sizes private,
      which needs `assumed_silo_size`).
    ledger_csv: under DP, append every silo's epsilon after every round here.
    preprocessing_events: under DP, per silo the `DpEvent` (or None) its data was
      already queried for (DP standardization: `tff_silo.data.preprocessing`);
      charged to its ledger first and composed in its calibration.
    noise_multiplier: under DP, instead of `target_epsilon`: the noise (a scalar or
      one per silo) the silos train with; their ledgers report what it spends
      (inf where no epsilon bounds it) and set no budget.
    backend: `tff` (the process in TFF's runtime, the reference) or `vectorized`
      (every silo's round as one TF program: `tff_silo.backends.vectorized`; the same
      numbers, much faster, on CPU or GPU).
  """
  run = Run(process, data, target_epsilon, target_delta, seed, protocol, ledger_csv,
            preprocessing_events, noise_multiplier)
  return simulate(silo_runner(process, backend), run, rounds, eval_every, progress)


def simulate(runner, run: Run, rounds: int, eval_every: int = 0,
             progress=None) -> SimulationResult:
  """`run` (its process already made into `runner`: `run_simulation`'s, or a
  sharded run's, `tff_silo.sharding`) for `rounds` rounds."""
  return _simulate(runner, [run], rounds, eval_every, progress)[0]


# Stacked runs hold every silo's training data padded to the largest silo; a group
# of runs that stack is cut into stacks of at most this many such floats.
MAX_STACKED_FLOATS = 2 ** 27   # 512 MB of float32


def runs_per_stack(datasets: Sequence[SiloData]) -> int:
  """How many runs on data shaped like `datasets` (the largest of each dimension)
  stack within MAX_STACKED_FLOATS (at least 1)."""
  per_run = (max(d.num_silos for d in datasets)
             * max(len(y) for d in datasets for y in d.y_train)
             * max(int(np.prod(d.feature_shape)) for d in datasets))
  return max(1, MAX_STACKED_FLOATS // max(per_run, 1))


def run_simulations(runs: Sequence[Run], *, rounds: int, eval_every: int = 0,
                    progress: Optional[Callable[[int, int, float], None]] = None,
                    backend: str = "tff") -> list:
  """`run_simulation` of each of `runs` (T rounds each), one `SimulationResult` per
  run, in order. On the vectorized backend, runs of the MR-MTL family, IFCA and
  Mocha whose definitions have equal `tff_silo.runner.stack_key` (a grid's
  epsilons, seeds, learning rates and lambdas: one method, model and training
  settings) run stacked as the silos of one program (`runs_per_stack` at a time),
  each with its own server models, noise, keys, ledgers and evaluation: the same
  numbers as run one by one (tested), each result's `runs_stacked` saying how many
  shared its rounds and wall time. Other runs run one after another. Private runs
  need seeds of their own (`tff_silo.keys.run_seed`)."""
  _check_own_seeds(runs)
  results = [None] * len(runs)
  groups = {}
  for i, run in enumerate(runs):
    groups.setdefault(_stack_group(run.process, backend, i), []).append(i)
  for group in groups.values():
    most = runs_per_stack([runs[i].data for i in group])
    for start in range(0, len(group), most):
      members = group[start:start + most]
      runner = silo_runner(runs[members[0]].process, backend)
      for i, result in zip(members, _simulate(runner, [runs[i] for i in members],
                                              rounds, eval_every, progress)):
        results[i] = result
  return results


def _check_own_seeds(runs: Sequence[Run]) -> None:
  """Two private runs with one seed draw the same batches and noise: the difference
  of their updates would give back the silos' clipped gradient sums."""
  seen = {}
  for i, run in enumerate(runs):
    if (run.target_epsilon is None and run.noise_multiplier is None) or run.seed is None:
      continue
    if run.seed in seen:
      raise ValueError(f"runs {seen[run.seed]} and {i} train with DP and share seed "
                       f"{run.seed}: they would draw the same batches and noise; give "
                       "each run its own seed (tff_silo.keys.run_seed)")
    seen[run.seed] = i


def _stack_group(process, backend: str, index: int):
  """Runs with equal groups are stacked (where the backend's runner stacks runs:
  `tff_silo.runner.stack_key`)."""
  key = stack_key(process, backend)
  return index if key is None else key


def _set_up(process, run: Run, rounds: int):
  """Checks `run` and opens its accounts (calibration, ledgers); (accounts, the
  silos' `SiloInput`s)."""
  data = run.data
  if process.num_clusters > data.num_silos:
    raise ValueError(f"num_clusters={process.num_clusters} is more than the "
                     f"{data.num_silos} silos")
  accounts = SiloAccounts(
      data.train_sizes, private=process.config.private,
      batch_size=process.config.batch_size, epochs_per_round=process.epochs_per_round,
      rounds=rounds, num_selections=process.num_selections(rounds),
      selection_budget_share=process.selection_budget_share,
      sampling=process.config.sampling, target_epsilon=run.target_epsilon,
      target_delta=run.target_delta, noise_multiplier=run.noise_multiplier,
      protocol=run.protocol, preprocessing_events=run.preprocessing_events,
      ledger_csv=run.ledger_csv,
      integer_coordinates=(process.model.num_parameters if process.config.integer_noise
                           else 0))
  inputs = [SiloInput(x, y, np.float32(z), key, np.float32(s), np.float32(m))
            for x, y, z, key, s, m in zip(
                data.x_train, data.y_train, accounts.process_noise_multipliers,
                keys.unit_keys(run.seed, data.num_silos), accounts.selection_epsilons,
                accounts.sizes)]
  return accounts, inputs


def _simulate(process, runs, rounds: int, eval_every: int, progress) -> list:
  """Runs `runs` with `process` (a runner: one run, or several stacked by a
  vectorized runner's `prepare_runs`); one `SimulationResult` per run."""
  check_run_length(rounds, eval_every)
  start = time.perf_counter()
  set_up = [_set_up(process, run, rounds) for run in runs]
  accounts = [account for account, _ in set_up]
  if len(runs) == 1:
    inputs = process.prepare(set_up[0][1])
  else:
    inputs = process.prepare_runs([run.process for run in runs],
                                  [silo_inputs for _, silo_inputs in set_up])
  bounds = np.cumsum([0] + [run.data.num_silos for run in runs])
  silo_metrics = (getattr(process, "evaluate_silos", None)
                  or _evaluation_here(process, runs, bounds))
  train_sizes, test_sizes = ([n for run in runs for n in getattr(run.data, field)]
                             for field in ("train_sizes", "test_sizes"))

  def evaluate(state, client_states, rounds_done):
    """Per run: (train, test, silo_train, silo_test, weights) after `rounds_done`
    rounds (one per run)."""
    return [(pooled(silo_train, train_sizes[a:b]), pooled(silo_test, test_sizes[a:b]),
             silo_train, silo_test, weights)
            for a, b, (weights, silo_train, silo_test) in zip(
                bounds[:-1], bounds[1:], silo_metrics(state, client_states, rounds_done))]

  active = [True] * len(runs)   # a run whose budget a round would pass stops alone
  histories = [[] for _ in runs]
  with tff_workers_stopped():
    state = process.initialize()
    client_states = process.initial_client_states(state, int(bounds[-1]))
    metrics = {}

    def before(r):
      charge_round(accounts, active, r)
      return any(active)

    def step(r):
      del r
      nonlocal state, client_states, metrics
      state, client_states, metrics = (
          process.next(state, client_states, inputs) if all(active)
          else process.next(state, client_states, inputs, active))

    def after(r):
      for account, on in zip(accounts, active):
        if on:
          account.finish_round(r)

    def evaluate_now(r):
      evaluated = evaluate(state, client_states, [a.rounds_done for a in accounts])
      for i, on in enumerate(active):
        if on:
          histories[i].append((r, *evaluated[i][:2]))

    log = run_rounds(rounds, step, before=before, after=after, evaluate=evaluate_now,
                     eval_every=eval_every, progress=progress, start=start)
    final = evaluate(state, client_states, [a.rounds_done for a in accounts])
    server = process.server_models(state)
  clusters = process.cluster_assignments(client_states)
  wall = time.perf_counter() - start
  results = []
  for i, (account, (train, test, silo_train, silo_test, weights)) in enumerate(
      zip(accounts, final)):
    histories[i].append((account.rounds_done, train, test))
    privacy = account.final_privacy()
    results.append(SimulationResult(
        algorithm=process.name, rounds=account.rounds_done, metric=process.model.metric,
        train_metric=train, test_metric=test, silo_train_metric=silo_train,
        silo_test_metric=silo_test, privacy=privacy, history=tuple(histories[i]),
        clusters=None if clusters is None else clusters[bounds[i]:bounds[i + 1]],
        round_seconds=log.round_seconds, wall_seconds=wall,
        silo_weights=tuple(weights.silos()),
        server_weights=server[i], runs_stacked=len(runs),
        aggregator_measurements=(_flat(metrics.get("aggregator", {}))
                                 if len(runs) == 1 and isinstance(metrics, dict) else {})))
  return results


def _evaluation_here(process, runs, bounds):
  """`evaluate_silos(state, client_states, rounds_done per run)` on the runs' data
  in this process: per run (its silos' `SiloModels`, train metric, test metric). (A
  runner whose silos' data is elsewhere has its own: `tff_silo.sharding`.)"""
  evaluator = SiloEvaluator(process.model)
  x_train, y_train, x_test, y_test = (
      [x for run in runs for x in getattr(run.data, field)]
      for field in ("x_train", "y_train", "x_test", "y_test"))

  def evaluate_silos(state, client_states, rounds_done):
    weights = [None] * len(runs)
    silo_train, silo_test = np.zeros(bounds[-1]), np.zeros(bounds[-1])
    for done in sorted(set(rounds_done)):   # (stacked runs stopped at different rounds)
      models = process.evaluation_weights(state, client_states, done)
      ran = [i for i, d in enumerate(rounds_done) if d == done]
      silos = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in ran])
      for i in ran:
        weights[i] = models.subset(np.arange(bounds[i], bounds[i + 1]))
      pick = lambda arrays: [arrays[k] for k in silos]
      silo_train[silos] = evaluator(models.subset(silos), pick(x_train), pick(y_train))[1]
      silo_test[silos] = evaluator(models.subset(silos), pick(x_test), pick(y_test))[1]
    return [(w, silo_train[a:b], silo_test[a:b])
            for a, b, w in zip(bounds[:-1], bounds[1:], weights)]

  return evaluate_silos


def _flat(measurements, prefix: str = "") -> dict:
  """A nested structure of a factory's measurements as {"a/b": scalar or list}."""
  if isinstance(measurements, dict) or hasattr(measurements, "_asdict"):
    items = (measurements._asdict() if hasattr(measurements, "_asdict")
             else measurements).items()
    out = {}
    for name, value in items:
      out.update(_flat(value, f"{prefix}{name}/"))
    return out
  value = np.asarray(measurements)
  if value.size == 0:
    return {}
  return {prefix.rstrip("/"): value.item() if value.ndim == 0 else value.tolist()}
