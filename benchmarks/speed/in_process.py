"""The speed parts that run in a child of this binary (`sweep`, `calibration`,
`memory`, `sampling`): what the child runs (`*_in_process`, printing JSON) and the
rows the parent makes of it (`*_part`)."""

from __future__ import annotations

import json
import statistics
import time

from benchmarks import common
from benchmarks.speed import fresh
from benchmarks.speed.fresh import PROTOCOLS, SCHOOL, SCHOOL_EPSILON

MEMORY_BUDGETS = ("default", "none")
CALIBRATION_PROTOCOLS = PROTOCOLS + ("replace_one",)
SWEEP_EPSILONS = (1.0, 2.0, 4.0, 8.0)
SWEEP_CONFIGS = ((0.01, 1.0), (0.03, 0.3), (0.003, 3.0))   # (lr, lambda), in turn
# The sampling part's silo sizes and DP steps per size.
SAMPLING_SIZES = (2_000, 20_000, 130_000)
SAMPLING_STEPS = 1000
def sweep(s):
  """The sweep, run here: every (epsilon, seed) School MR-MTL run (the i-th with
  SWEEP_CONFIGS' i-th configuration, cyclically) on the vectorized backend, as one
  `run_simulations` call (the runs stacked into one program)."""
  start = time.perf_counter()
  from tff_silo import algorithms, data, keys, models
  from tff_silo.privacy import PrivacyProtocol
  from tff_silo.simulation import Run, run_simulations
  settings = [(e, seed) for seed in range(s.sweep_runs) for e in SWEEP_EPSILONS]
  silos, runs = {}, []
  for i, (epsilon, seed) in enumerate(settings[:s.sweep_runs]):
    if seed not in silos:
      silos[seed] = data.load_school(s.data_dir, seed=seed, standardize="public")
    lr, lam = SWEEP_CONFIGS[i % len(SWEEP_CONFIGS)]
    definition = algorithms.mrmtl_algorithm(
        models.model_for(silos[seed]), silos[seed].feature_shape,
        client_learning_rate=lr, batch_size=SCHOOL.batch_size, lam=lam,
        l2_norm_clip=SCHOOL.clip)
    runs.append(Run(definition, silos[seed], target_epsilon=epsilon,
                    target_delta=SCHOOL.delta,
                    seed=keys.run_seed(seed, dict(epsilon=epsilon, lr=lr, lam=lam)),
                    protocol=PrivacyProtocol(assumed_silo_size=SCHOOL.assumed_silo_size)))
  results = run_simulations(runs, rounds=s.rounds, backend="vectorized")
  print(json.dumps(dict(runs=len(runs), seconds=time.perf_counter() - start,
                        peak_memory_mb=common.peak_memory_mb(),
                        test_metric_median=statistics.median(
                            r.test_metric for r in results))))


def calibration(s):
  """The calibration of a School DP run (seed 0's silos, the `school` settings) under
  --calibration_child's protocol, run here: its seconds and distinct settings."""
  from tff_silo import data
  from tff_silo.privacy import PAPER, PrivacyProtocol
  from tff_silo.privacy.silo_accounts import calibrate_silos
  sizes = data.load_school(s.data_dir, seed=0, standardize="public").train_sizes
  protocol, sampling = {
      "paper": (PAPER, "poisson"),
      "honest": (PrivacyProtocol(assumed_silo_size=SCHOOL.assumed_silo_size), "poisson"),
      "replace_one": (PrivacyProtocol("replace_one"), "without_replacement"),
  }[s.calibration_child]
  start = time.perf_counter()
  privacy = calibrate_silos(sizes, batch_size=SCHOOL.batch_size, epochs_per_round=1,
                            rounds=s.rounds, target_epsilon=SCHOOL_EPSILON,
                            target_delta=SCHOOL.delta, protocol=protocol,
                            sampling=sampling)
  seconds = time.perf_counter() - start
  settings = len(set(zip(privacy.sampling_rates.tolist(), privacy.steps.tolist())))
  print(json.dumps(dict(seconds=seconds, settings=settings, silos=len(sizes),
                        peak_memory_mb=common.peak_memory_mb())))


def random_image_silos(name, num_silos, train, test, shape):
  """`num_silos` silos of `train` / `test` uniform random images of `shape` with
  10 random labels (seed 0): Fashion-MNIST-sized work without the dataset."""
  import numpy as np
  from tff_silo.data.silos import make_silos
  rng = np.random.default_rng(0)
  images = lambda n: [rng.random((n, *shape), np.float32) for _ in range(num_silos)]
  labels = lambda n: [rng.integers(0, 10, n).astype(np.float32)
                      for _ in range(num_silos)]
  return make_silos(name, "multiclass", images(train), labels(train), images(test),
                    labels(test), num_classes=10)


def memory(budget: str):
  """The memory part's round, run here with the default budget or none."""
  from tff_silo import algorithms, models
  from tff_silo.backends.vectorized import training
  from tff_silo.privacy import PrivacyProtocol
  from tff_silo.simulation import run_simulation
  if budget == "none":
    training.MEMORY_BUDGET_FLOATS = 2 ** 62   # every silo in one chunk
  silos = random_image_silos("fmnist_sized", 40, 1500, 250, (28, 28, 1))
  model = models.small_cnn((28, 28, 1), 10, channels=(16, 32), hidden=64)
  definition = algorithms.mrmtl_algorithm(model, silos.feature_shape,
                                          client_learning_rate=0.05, batch_size=64,
                                          lam=1.0, l2_norm_clip=1.0)
  after_round = []
  result = run_simulation(
      definition, silos, rounds=1, target_epsilon=4.0, target_delta=1e-5,
      backend="vectorized", protocol=PrivacyProtocol(public_silo_sizes=True),
      progress=lambda *_: after_round.append(common.peak_memory_mb()))
  print(json.dumps(dict(peak_after_round_mb=after_round[0],
                        round_seconds=float(result.round_seconds[0]),
                        examples_per_chunk=training.chunk_examples(model),
                        test_metric=result.test_metric, rounds=1)))


def sampling():
  """The sampling part, run here: for each sampling and size, one traced and one
  timed call of `train_locally` (`SAMPLING_STEPS` DP steps of 64 examples, expected
  under Poisson)."""
  import numpy as np
  import tensorflow as tf
  from tff_silo import models
  from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
  model = models.linear_regression(20)
  zeros = [tf.zeros(s) for s in model.weight_shapes]
  out = dict(steps=[])
  rng = np.random.default_rng(0)
  data = {n: (tf.constant(rng.normal(size=(n, 20)).astype(np.float32)),
              tf.constant(rng.normal(size=n).astype(np.float32))) for n in SAMPLING_SIZES}
  for sampling in ("poisson", "without_replacement"):
    config = LocalTrainingConfig(learning_rate=0.01, batch_size=64, l2_norm_clip=1.0,
                                 steps=SAMPLING_STEPS, sampling=sampling)
    train = tf.function(lambda x, y, key, config=config: train_locally(
        model, config, zeros, zeros, 0.0, x, y, 1.0, key))
    for n, (x, y) in data.items():
      train(x, y, tf.constant([0, 0]))[0].numpy()
      start = time.perf_counter()
      train(x, y, tf.constant([1, 0]))[0].numpy()
      out["steps"].append(dict(sampling=sampling, silo_size=n, step_seconds=(
          time.perf_counter() - start) / SAMPLING_STEPS))
  out["peak_memory_mb"] = common.peak_memory_mb()
  print(json.dumps(out))


# --- the parent's side: a child per part, its JSON as rows ---------------------------

def sweep_part(s, add_row) -> None:
  seconds, result = fresh.speed_child(
      "sweep", "--sweep_child", f"--data_dir={s.data_dir}", f"--rounds={s.rounds}",
      f"--sweep_runs={s.sweep_runs}")
  add_row(part="sweep", backend="vectorized", device="cpu", repeat=0,
          end_to_end_seconds=seconds, peak_memory_mb=result["peak_memory_mb"],
          test_metric=result["test_metric_median"], rounds=s.rounds, runs=result["runs"])


def calibration_part(s, add_row) -> None:
  for repeat in range(s.repeats):   # cold: each a fresh process
    for protocol in (CALIBRATION_PROTOCOLS if repeat % 2 == 0
                     else CALIBRATION_PROTOCOLS[::-1]):
      _, result = fresh.speed_child("calibration", f"--calibration_child={protocol}",
                                    f"--data_dir={s.data_dir}", f"--rounds={s.rounds}")
      add_row(part="calibration", backend="none", device="cpu", repeat=repeat,
              protocol=protocol, end_to_end_seconds=result["seconds"],
              peak_memory_mb=result["peak_memory_mb"], settings=result["settings"],
              silos=result["silos"], rounds=s.rounds)
      print(f"calibration {protocol} repeat {repeat}: {result['settings']} settings "
            f"in {result['seconds']:.2f} s", flush=True)


def memory_part(s, add_row) -> None:
  del s   # (one round of each budget)
  for budget in MEMORY_BUDGETS:
    seconds, result = fresh.speed_child("memory part", f"--memory_child={budget}")
    add_row(part="memory", backend="vectorized", device="cpu", repeat=0,
            memory_budget=budget, end_to_end_seconds=seconds,
            seconds_per_round_median=result["round_seconds"],
            peak_memory_mb=result["peak_after_round_mb"],
            examples_per_chunk=result["examples_per_chunk"],
            test_metric=result["test_metric"], rounds=1)
    print(f"memory budget {budget}: {result['examples_per_chunk']} examples per chunk, "
          f"round {result['round_seconds']:.1f} s, peak after the round "
          f"{result['peak_after_round_mb']:.0f} MB", flush=True)


def sampling_part(s, add_row) -> None:
  del s
  seconds, result = fresh.speed_child("sampling part", "--sampling_child")
  for step in result["steps"]:
    add_row(part="sampling", backend="none", device="cpu", repeat=0, **step,
            end_to_end_seconds=seconds, peak_memory_mb=result["peak_memory_mb"],
            rounds=1)
    print(f"{step['sampling']} n={step['silo_size']}: "
          f"{step['step_seconds'] * 1e3:.2f} ms per DP step", flush=True)
