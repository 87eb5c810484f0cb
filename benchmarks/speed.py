"""Speed of the two backends side by side (TFF's runtime vs `tff_silo.backends.vectorized`).

Parts (--parts, all by default), every figure a median over --repeats with the
backends alternating within each repeat, so drift of the machine hits both alike:
- `school`: the School MR-MTL DP run (thesis app. B.4: 200 rounds, B = 32, clip 1,
  lr 0.01, epsilon 6, delta 1e-3, lambda 1, seed 0) as `python -m benchmarks.run` in
  a fresh process, timed from outside (imports, data, calibration, tracing, rounds,
  evaluation, shutdown); also its steady-state seconds per round and peak memory.
- `digits`: rounds of `benchmarks.run`'s default (digits CNN silos, MR-MTL, no DP),
  steady-state seconds per round, in a fresh process per run.
- `sweep`: --sweep_runs School MR-MTL runs (epsilons x seeds, each run one of
  `SWEEP_CONFIGS`' learning rates and lambdas in turn, as a grid's trials) in one
  fresh process on the vectorized backend (`run_simulations`: the runs stacked as
  one program), its trials per second, against one fresh single run of it.
- `ifca`: School IFCA-preconditioned MR-MTL under DP (the `school` settings, selection
  in the first 10% of rounds), fresh process per run.
- `dprivate`: d-private clustered FL on Galli et al.'s two-cluster data (nu 5, U 7,
  --dprivate_rounds rounds), fresh process per run.
- `hypernet`: UDP-Alg as `python -m benchmarks.hypernet` (digits, 50 users, q 0.1,
  S 0.1, z 1, K 20 local steps, --hypernet_rounds rounds), fresh process per run.
- `protocol`: the School MR-MTL DP run of `school` on the vectorized backend, fresh
  process end to end, under the paper's protocol (`--protocol=paper`: every silo's
  size public, 85 distinct settings to calibrate and account) against the honest
  default (one assumed size), alternating.
- `calibration`: the noise calibration alone of a School DP run (seed 0's silos, the
  `school` settings), cold (a fresh process), under the paper's protocol (every
  silo's size public: one setting per distinct size), the honest default (one
  assumed size: one setting) and replace-one (sampling without replacement, each
  silo's size public), alternating.
- `memory`: one DP MR-MTL round of the vectorized backend on Fashion-MNIST-sized
  silos (40 x 1,500 random 28x28 images, batch 64), in a fresh process with the
  default memory budget and with none: peak memory after the round, its time.
- `cnn_share`: in a fresh process, this machine's float32 GEMM rate, and a DP
  MR-MTL round of the digits CNN and of Fashion-MNIST-sized silos (`CNN_WORKLOADS`)
  with its useful FLOP/s (`cnn.training_flops`) as a share of that rate; beside it
  the same network's plain step (one model, no DP, a DP step's silos x B examples
  as one batch): what TensorFlow's kernels reach for its layers without
  per-example work, and `dp_over_plain`, the DP round's time per example over the
  plain step's; and the same round without DP (its silos' stacked models, the
  same examples), `dp_over_plain_round` the DP round's time over it; and the DP
  round XLA-compiled (`--xla`'s path). A round's time is the median of
  `CNN_TIMED_ROUNDS` after a traced one (one under XLA). Then where a DP step's
  time goes (`_step_pieces_ms`). Peak memory is the process's, after all.
- `sampling`: in a fresh process, DP local training of one silo of n rows (a linear
  model on 20 features, batch 64, public size n, `SAMPLING_STEPS` steps) for each n of
  `SAMPLING_SIZES` (up to a 130,000-person pandemic silo), Poisson and without
  replacement: seconds per DP step (both draw a word or uniform per row: Poisson
  sampling's exact inclusion test, `poisson_sampling`, and a batch without
  replacement's permutation).
- `xla`: the vectorized backend's rounds with and without --xla (XLA-compiled, static
  shapes), alternating, each a fresh process: the `school` run, --digits_rounds DP
  rounds of the digits CNN (MR-MTL, epsilon 4) and the `hypernet` run: seconds per
  round, end to end (XLA's compilation included), peak memory.
- `executors`: `benchmarks.compare`'s quick preset (the README's main job) with
  --executor=local (two batches at once in threads) and --executor=ray (a local
  cluster of this machine's CPUs, started by the run, one CPU a task), alternating,
  each a fresh process: end to end seconds, the peak memory of the run and every
  process it started (sampled every 0.5 s: the driver, and Ray's GCS, raylet and
  workers), the largest worker's own peak (its rows'), and whether the rows are the
  same (times, memory and the clock aside).
- `executors_school`: the same for a part of the School grid (MR-MTL, Ditto and
  Mocha, seed 0, two learning rates: 420 trials).
- `ray_overhead`: in a fresh process, a local Ray cluster's start and
  --overhead_tasks tasks that do nothing (`executors.RayCluster.run`): a task's round
  trip one at a time (median), and the seconds a task of all of them at once.
- on a machine where TensorFlow sees a GPU, `digits` also runs the vectorized
  backend with --device=gpu.

    uv run python -m benchmarks.speed --data_dir=../shared/data --repeats=3
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import flags

from benchmarks import common, configs
from benchmarks.common import UsageError
from benchmarks.harness import spec

PARTS = ("school", "digits", "sweep", "ifca", "dprivate", "hypernet", "protocol",
         "calibration", "memory", "cnn_share", "sampling", "xla", "executors",
         "executors_school", "ray_overhead")
MEMORY_BUDGETS = ("default", "none")
PROTOCOLS = ("paper", "honest")   # the protocol part's
CALIBRATION_PROTOCOLS = PROTOCOLS + ("replace_one",)
DEFAULT_PARTS = ("school", "digits", "sweep")
SWEEP_EPSILONS = (1.0, 2.0, 4.0, 8.0)
SWEEP_CONFIGS = ((0.01, 1.0), (0.03, 0.3), (0.003, 3.0))   # (lr, lambda), in turn
# Columns every row of this binary has: an existing --output without them is refused.
SIGNATURE = ("part", "backend", "device", "end_to_end_seconds")
SCHOOL = configs.PRESETS["school"]
SCHOOL_EPSILON = 6.0

FLAGS = flags.FLAGS
SPEC = spec.Spec(
    data_dir=spec.string(None, "Folder with school.mat."),
    parts=spec.strings(list(DEFAULT_PARTS), "Comma-separated parts, of {choices}.",
                       choices=PARTS),
    repeats=spec.integer(3, "Fresh-process runs per backend to take medians of.",
                         bounds=">= 1"),
    rounds=spec.integer(200, "Rounds of a School run.", bounds=">= 1"),
    digits_rounds=spec.integer(20, "Rounds of a digits run.", bounds=">= 1"),
    sweep_runs=spec.integer(20, "School runs in the one-process sweep.", bounds=">= 1"),
    dprivate_rounds=spec.integer(150, "Rounds of a dprivate run.", bounds=">= 1"),
    hypernet_rounds=spec.integer(50, "Rounds of a hypernet run.", bounds=">= 1"),
    overhead_tasks=spec.integer(50, "Tasks of the ray_overhead part.", bounds=">= 1"),
    **common.output_group(output=("speed.csv", "CSV file rows are appended to.")),
)
SPEC.define()
# The children this binary starts; under a module of their own, out of --help.
INTERNAL = "benchmarks.speed (internal: the timed children)"
CHILDREN = spec.Spec(
    memory_child=spec.string(None, "One of {choices}; run the memory part's round in "
                             "this process and print it as JSON.",
                             choices=MEMORY_BUDGETS),
    cnn_share_child=spec.boolean(False, "Run the cnn_share part in this process and "
                                 "print it as JSON."),
    sampling_child=spec.boolean(False, "Run the sampling part in this process and "
                                "print it as JSON."),
    sweep_child=spec.boolean(False, "Run the sweep in this process and print its "
                             "timings as JSON."),
    calibration_child=spec.string(None, "One of {choices}; calibrate the School run "
                                  "under it in this process and print the timing as "
                                  "JSON.", choices=CALIBRATION_PROTOCOLS),
    overhead_child=spec.boolean(False, "Run the ray_overhead part in this process and "
                                "print it as JSON."),
)
CHILDREN.define(module_name=INTERNAL)


class Settings(spec.Spec(SPEC.params, CHILDREN.params).settings_class(
    "_Fields", module=__name__)):
  """`benchmarks.speed`'s settings (`SPEC`, and the timed children's, `CHILDREN`),
  checked (`from_flags`)."""

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags (a memory child's only its own); raises UsageError."""
    SPEC.check_choices()
    CHILDREN.check_choices()
    child = FLAGS.sweep_child or FLAGS.calibration_child is not None
    if (FLAGS.memory_child is None
        and not (FLAGS.cnn_share_child or FLAGS.sampling_child or FLAGS.overhead_child)):
      if not child:
        common.check_output(FLAGS.output, SIGNATURE)
      SPEC.check_ranges({})
      needs_school = child or {"school", "sweep", "ifca", "protocol", "calibration",
                               "xla", "executors_school"} & set(FLAGS.parts)
      if needs_school and not (FLAGS.data_dir and os.path.isfile(
          os.path.join(FLAGS.data_dir, "school.mat"))):
        raise UsageError("--data_dir must be a folder with school.mat; got "
                         f"{FLAGS.data_dir}")
    return cls(**SPEC.values(), **CHILDREN.values())


def _school_args(s, algorithm="mrmtl"):
  return ["--dataset=school", f"--data_dir={s.data_dir}", f"--methods={algorithm}",
          "--lams=1", f"--epsilon={SCHOOL_EPSILON:g}", "--delta=1e-3",
          f"--rounds={s.rounds}", "--seeds=0"]


def _part_args(part, s):
  """(binary, its flags) of a part timed as fresh runs."""
  if part == "hypernet":
    return "hypernet", ["--methods=hypernet", "--sampling_rates=0.1",
                        "--clips=0.1", "--noise_multipliers=1",
                        f"--rounds={s.hypernet_rounds}"]
  return "run", _run_args(part, s)


def _run_args(part, s):
  """benchmarks.run's flags of a part."""
  if part == "school":
    return _school_args(s)
  if part == "ifca":
    return _school_args(s, "ifca_mrmtl")
  if part == "digits":
    return ["--methods=mrmtl", f"--rounds={s.digits_rounds}"]
  return ["--dataset=two_cluster", "--methods=dprivate_clustering", "--nu=5",
          "--clients_per_round=7", f"--rounds={s.dprivate_rounds}"]


XLA_WORKLOADS = ("school", "digits_dp", "hypernet")


def _xla_workloads(s):
  """The xla part's (workload, (binary, its flags))."""
  return (("school", ("run", _school_args(s))),
          ("digits_dp", ("run", ["--methods=mrmtl", f"--rounds={s.digits_rounds}",
                                 "--epsilon=4"])),
          ("hypernet", _part_args("hypernet", s)))


def _fresh_run(env, binary_args, backend, device="auto"):
  """Runs benchmarks.<binary> in a fresh process; (seconds from outside, its row)."""
  import pandas as pd
  binary, args = binary_args
  with tempfile.TemporaryDirectory() as tmp:
    csv = os.path.join(tmp, "row.csv")
    cmd = [sys.executable, "-m", f"benchmarks.{binary}", *args, f"--backend={backend}",
           f"--device={device}", f"--output={csv}"]
    start = time.perf_counter()
    returncode, stderr = _child(cmd, env)
    seconds = time.perf_counter() - start
    if returncode:
      raise UsageError(f"benchmarks.{binary} failed: {_last_line(stderr)}")
    return seconds, pd.read_csv(csv).iloc[0]


def _child(cmd, env, stdout=subprocess.DEVNULL):
  """Runs `cmd`; (return code, stderr[, stdout]). The child is stopped (SIGTERM, then
  SIGKILL) when this process is interrupted or terminated, so none outlives it."""
  child = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                           env=env)
  try:
    out, err = child.communicate()
  except BaseException:
    child.terminate()
    try:
      child.wait(timeout=10)
    except subprocess.TimeoutExpired:
      child.kill()
    raise
  return (child.returncode, err) if stdout is subprocess.DEVNULL else (
      child.returncode, err, out)


def _last_line(text: str) -> str:
  lines = [line for line in text.strip().splitlines() if line.strip()]
  return lines[-1] if lines else "no error message"


def _sweep_in_process(s):
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


def _speed_child(what: str, env, *args):
  """Runs this binary with `args` in a fresh process; (seconds from outside, the
  JSON it printed last)."""
  start = time.perf_counter()
  returncode, stderr, stdout = _child([sys.executable, "-m", "benchmarks.speed", *args],
                                      env, stdout=subprocess.PIPE)
  if returncode:
    raise UsageError(f"the {what} failed: {_last_line(stderr)}")
  return time.perf_counter() - start, json.loads(stdout.strip().splitlines()[-1])


def _sweep(env, s):
  return _speed_child("sweep", env, "--sweep_child", f"--data_dir={s.data_dir}",
                      f"--rounds={s.rounds}", f"--sweep_runs={s.sweep_runs}")


def _calibration_in_process(s):
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


def _random_image_silos(name, num_silos, train, test, shape):
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


def _memory_in_process(budget: str):
  """The memory part's round, run here with the default budget or none."""
  from tff_silo import algorithms, models
  from tff_silo.backends.vectorized import training
  from tff_silo.privacy import PrivacyProtocol
  from tff_silo.simulation import run_simulation
  if budget == "none":
    training.MEMORY_BUDGET_FLOATS = 2 ** 62   # every silo in one chunk
  silos = _random_image_silos("fmnist_sized", 40, 1500, 250, (28, 28, 1))
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


# The cnn_share part's DP CNN workloads: (name, silos, images per silo, image
# shape, channels, hidden, batch); the digits as `benchmarks.run`'s default.
CNN_WORKLOADS = (("digits", 40, None, (8, 8, 1), (32, 64), None, 16),
                 ("fmnist_sized", 10, 1500, (28, 28, 1), (16, 32), 64, 64))
GEMM_SIZE = 2048
# Timed rounds of each cnn_share workload (after a traced one; one under XLA).
CNN_TIMED_ROUNDS = 5


def _median_seconds(call, repeats: int) -> float:
  """The median time of `repeats` calls of `call`, after one untimed."""
  call()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _gemm_flops_per_second(repeats=10) -> float:
  """This machine's float32 GEMM rate: the median of `repeats` timed 2048^3
  matmuls (2 n^3 FLOPs each), after one untimed."""
  import tensorflow as tf
  a = tf.random.normal([GEMM_SIZE, GEMM_SIZE])
  matmul = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
  return 2 * GEMM_SIZE ** 3 / _median_seconds(lambda: matmul(a).numpy(), repeats)


def _plain_step_seconds(model, shape, examples: int, repeats=10) -> float:
  """The median time of `model`'s plain training step (one model's gradient of
  its batch loss, no DP) on `examples` random images, after one untimed."""
  import tensorflow as tf
  weights = [tf.constant(w) for w in model.initial_weights(0)]
  x = tf.random.stateless_uniform([examples, *shape], seed=[0, 0])
  y = tf.cast(tf.random.stateless_uniform([examples], [0, 1], 0, 10, tf.int32),
              tf.float32)

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = model.batch_loss(weights, x, y)
    return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(loss, weights)])

  return _median_seconds(lambda: step(x, y).numpy(), repeats)


def _step_pieces_ms(model, shape, num_silos: int, batch: int, repeats=10) -> dict:
  """Where a DP step of `num_silos` silos x `batch` random images goes, each piece
  the median of `repeats` calls (ms): the silos' stacked models' gradient without
  DP (`stacked_plain`); their clipped penalized sums under DP (`clipped`); the
  same with every silo padded to the widest of a Poisson step (`clipped_padded`,
  the median widest of 200 draws); one step's noise (`noise`)."""
  import numpy as np
  import tensorflow as tf
  from tff_silo.privacy import dp_sgd, gaussian
  weights = [tf.constant(np.stack([w] * num_silos)) for w in model.initial_weights(0)]
  penalty = [0.01 * w for w in weights]

  def data(width):
    x = tf.random.stateless_uniform([num_silos, width, *shape], seed=[0, 0])
    y = tf.random.stateless_uniform([num_silos, width], [0, 1], 0, 10, tf.int32)
    return x, tf.cast(y, tf.float32), tf.ones([num_silos, width])

  @tf.function
  def stacked_plain(x, y, mask):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = tf.reduce_sum(model.loss_fn(model.stacked_apply_fn(weights, x), y) * mask)
    return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(loss, weights)])

  @tf.function
  def clipped(x, y, mask):
    return tf.add_n([tf.reduce_sum(s) for s in dp_sgd.clipped_stacked_sums(
        model.stacked_per_example_gradients_fn(weights, x, y), penalty, mask, 1.0)])

  noise = tf.function(
      lambda key: tf.reduce_sum(gaussian.normal(key, model.num_parameters)))
  widest = int(np.median([np.random.default_rng(i).poisson(batch, num_silos).max()
                          for i in range(200)]))
  time_ms = lambda fn, *args: 1e3 * _median_seconds(lambda: fn(*args).numpy(), repeats)
  return dict(stacked_plain=time_ms(stacked_plain, *data(batch)),
              clipped=time_ms(clipped, *data(batch)),
              clipped_padded=time_ms(clipped, *data(widest)), widest=widest,
              noise=time_ms(noise, tf.zeros([num_silos, 2], tf.int32)))


def _cnn_share_in_process():
  """The cnn_share part, run here: the GEMM rate, then for each workload a traced
  and `CNN_TIMED_ROUNDS` timed DP MR-MTL rounds (public sizes: a silo's steps times
  B examples expected) and their useful FLOP/s (`cnn.training_flops` per example);
  the same without DP, and XLA-compiled."""
  import numpy as np
  from tff_silo import algorithms, data, models
  from tff_silo.backends.vectorized import programs
  from tff_silo.models import cnn
  from tff_silo.privacy import PrivacyProtocol
  from tff_silo.simulation import run_simulation
  gemm = _gemm_flops_per_second()
  out = dict(gemm_gflops=gemm / 1e9, workloads={})
  for name, num_silos, per_silo, shape, channels, hidden, batch in CNN_WORKLOADS:
    silos = (data.load_rotated_masked_digits(num_silos=num_silos, seed=0)
             if per_silo is None
             else _random_image_silos(name, num_silos, per_silo, 10, shape))
    model = models.small_cnn(shape, silos.num_classes, channels=channels, hidden=hidden)
    rounds = {}
    # The DP round, the same round without DP, and the DP round XLA-compiled: the
    # median of the rounds after the first (traced, or compiled, in it).
    for key, clip, xla in (("dp", 1.0, False), ("plain", None, False),
                           ("dp_xla", 1.0, True)):
      definition = algorithms.mrmtl_algorithm(
          model, shape, client_learning_rate=0.05, batch_size=batch, lam=1.0,
          l2_norm_clip=clip)
      privacy = dict(target_epsilon=4.0, target_delta=1e-5) if clip else {}
      with programs.xla_rounds(xla):
        rounds[key] = float(np.median(run_simulation(
            definition, silos, rounds=1 + (1 if xla else CNN_TIMED_ROUNDS),
            backend="vectorized", protocol=PrivacyProtocol(public_silo_sizes=True),
            **privacy).round_seconds[1:]))
    sizes = np.asarray(silos.train_sizes)
    examples = float(np.sum(np.maximum(1, sizes // batch) * np.minimum(batch, sizes)))
    seconds = rounds["dp"]
    achieved = examples * cnn.training_flops(shape, model.weight_shapes) / seconds
    step_examples = num_silos * batch   # a DP step's, as one batch
    plain_seconds = _plain_step_seconds(model, shape, step_examples)
    plain = step_examples * cnn.training_flops(shape, model.weight_shapes) / plain_seconds
    out["workloads"][name] = dict(round_seconds=seconds, examples=examples,
                                  gflops=achieved / 1e9, share_of_gemm=achieved / gemm,
                                  plain_share_of_gemm=plain / gemm,
                                  dp_over_plain=plain / achieved,
                                  plain_round_seconds=rounds["plain"],
                                  dp_over_plain_round=seconds / rounds["plain"],
                                  xla_round_seconds=rounds["dp_xla"],
                                  plain_step_ms=1e3 * plain_seconds,
                                  steps=float(np.max(np.maximum(1, sizes // batch))),
                                  **{f"step_{k}": v for k, v in _step_pieces_ms(
                                      model, shape, num_silos, batch).items()})
  out["peak_memory_mb"] = common.peak_memory_mb()
  print(json.dumps(out))


# The sampling part's silo sizes and DP steps per size.
SAMPLING_SIZES = (2_000, 20_000, 130_000)
SAMPLING_STEPS = 1000


def _sampling_in_process():
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


EXECUTOR_GRIDS = {   # the executors parts' compare grids (flags besides the output)
    "executors": (),   # the quick preset: the README's main job
    "executors_school": ("--preset=school", "--methods=mrmtl,ditto,mocha", "--seeds=0",
                         "--lrs=0.01,0.1"),   # 420 trials (RESULTS.md)
}
EXECUTORS = common.EXECUTORS
# Columns a rerun of the same rows changes besides the *_seconds: memory, the clock.
TIMING_COLUMNS = ("seconds_per_round_median", "peak_memory_mb", "finished")


def _tree_memory_mb(pid: int) -> float:
  """The resident memory of process `pid` and all its descendants (a Ray driver's
  cluster: its GCS, raylet and workers), in MB."""
  import psutil
  try:
    parent = psutil.Process(pid)
    processes = [parent, *parent.children(recursive=True)]
  except psutil.NoSuchProcess:
    return 0.0
  total = 0
  for p in processes:
    try:
      total += p.memory_info().rss
    except psutil.NoSuchProcess:
      pass
  return total / 2**20


def _compare_fresh(part, executor, folder, s):
  """`benchmarks.compare` of the part's grid with `executor` in a fresh process:
  (seconds from outside, the peak over 0.5 s samples of the memory of it and every
  process it started, its trial rows)."""
  import pandas as pd
  cmd = [sys.executable, "-m", "benchmarks.compare", *EXECUTOR_GRIDS[part],
         f"--output_dir={folder}", f"--executor={executor}"]
  if part == "executors_school":
    cmd.append(f"--data_dir={s.data_dir}")
  start = time.perf_counter()
  child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
  peak, errors = 0.0, []
  reader = threading.Thread(target=lambda: errors.append(child.stderr.read()))
  reader.start()
  try:
    while child.poll() is None:
      peak = max(peak, _tree_memory_mb(child.pid))
      time.sleep(0.5)
  except BaseException:
    child.terminate()
    raise
  finally:
    reader.join()
  seconds = time.perf_counter() - start
  if child.returncode:
    raise UsageError(f"benchmarks.compare --executor={executor} failed: "
                     f"{_last_line(''.join(errors))}")
  csv = next(os.path.join(folder, f) for f in sorted(os.listdir(folder))
             if f.endswith(".csv"))
  rows = pd.read_csv(csv)
  return seconds, peak, rows[rows.row_type == "trial"]


def _same_rows(a, b) -> bool:
  """Whether two runs wrote the same rows (but for times, memory and the clock)."""
  columns = [c for c in a.columns
             if c not in TIMING_COLUMNS and not c.endswith("_seconds")]
  if sorted(a.columns) != sorted(b.columns):
    return False
  a, b = (t.sort_values("run_key").reset_index(drop=True)[columns] for t in (a, b))
  return a.equals(b)


def _noop(settings, batch, progress):
  """A batch that does nothing (the overhead part's task)."""
  del settings, progress
  return batch


@dataclasses.dataclass(frozen=True)
class _Nothing:
  pass


def _overhead_in_process(tasks: int):
  """A local Ray cluster and `tasks` tasks of `_noop`: (the cluster's start, the
  median round trip of one task at a time, the seconds per task of all at once)."""
  from benchmarks import executors
  start = time.perf_counter()
  cluster = executors.RayCluster("auto")
  started = time.perf_counter() - start
  work = executors.Work(_noop, _Nothing(), "benchmarks.speed")
  list(cluster.run(work, [[0]]))   # the workers' first start
  one = []
  for i in range(tasks):
    t0 = time.perf_counter()
    list(cluster.run(work, [[i]]))
    one.append(time.perf_counter() - t0)
  t0 = time.perf_counter()
  list(cluster.run(work, [[i] for i in range(tasks)]))
  return started, statistics.median(one), (time.perf_counter() - t0) / tasks


def _gpu_present() -> bool:
  import tensorflow as tf
  return bool(tf.config.list_physical_devices("GPU"))


def _median_rows(rows, part, backend, device):
  chosen = [r for r in rows if r["part"] == part and r["backend"] == backend
            and r["device"] == device]
  if not chosen:
    return None
  keys = [k for k, v in chosen[0].items() if isinstance(v, float)]
  return {k: statistics.median(r[k] for r in chosen) for k in keys}


def _report(rows):
  print("\nmedians (ratio = tff / vectorized, side by side):")
  for part in EXECUTOR_GRIDS:
    runs = {e: [r for r in rows if r["part"] == part and r.get("executor") == e]
            for e in EXECUTORS}
    if all(runs.values()):
      (local, local_mb, local_w), (ray, ray_mb, ray_w) = [
          [statistics.median(r[k] for r in runs[e]) for k in (
              "end_to_end_seconds", "peak_memory_mb", "worker_peak_memory_mb")]
          for e in EXECUTORS]
      print(f"  {part} end to end: local {local:.1f} s, ray {ray:.1f} s, local / ray "
            f"{local / ray:.2f}x; peak memory in all {local_mb:.0f} / {ray_mb:.0f} MB "
            f"(largest worker {ray_w:.0f} MB)")
  for part, seconds in (("school", "end_to_end_seconds"),
                        ("school", "seconds_per_round_median"),
                        ("digits", "seconds_per_round_median"),
                        ("ifca", "end_to_end_seconds"),
                        ("ifca", "seconds_per_round_median"),
                        ("dprivate", "end_to_end_seconds"),
                        ("dprivate", "seconds_per_round_median"),
                        ("hypernet", "end_to_end_seconds"),
                        ("hypernet", "seconds_per_round_median")):
    tff = _median_rows(rows, part, "tff", "cpu")
    vec = _median_rows(rows, part, "vectorized", "cpu")
    if tff and vec:
      print(f"  {part} {seconds}: tff {tff[seconds]:.4f}, vectorized "
            f"{vec[seconds]:.4f}, ratio {tff[seconds] / vec[seconds]:.1f}x; peak memory "
            f"tff {tff['peak_memory_mb']:.0f} MB, vectorized {vec['peak_memory_mb']:.0f} MB")
  gpu = _median_rows(rows, "digits", "vectorized", "gpu")
  cpu = _median_rows(rows, "digits", "vectorized", "cpu")
  if gpu and cpu:
    print(f"  digits vectorized round: cpu {cpu['seconds_per_round_median']:.4f} s, gpu "
          f"{gpu['seconds_per_round_median']:.4f} s")
  protocol = {p: [r for r in rows if r["part"] == "protocol" and r["protocol"] == p]
              for p in PROTOCOLS}
  if all(protocol.values()):
    (paper, paper_mb), (honest, honest_mb) = [
        [statistics.median(r[k] for r in protocol[p])
         for k in ("end_to_end_seconds", "peak_memory_mb")] for p in PROTOCOLS]
    print(f"  School DP run end to end (vectorized): paper protocol {paper:.2f} s, honest "
          f"default {honest:.2f} s, paper / honest {paper / honest:.2f}x; peak memory "
          f"{paper_mb:.0f} / {honest_mb:.0f} MB")
  calibration = {p: [r for r in rows if r["part"] == "calibration"
                     and r["protocol"] == p] for p in CALIBRATION_PROTOCOLS}
  if all(calibration.values()):
    seconds = {p: statistics.median(r["end_to_end_seconds"] for r in calibration[p])
               for p in CALIBRATION_PROTOCOLS}
    print(f"  calibration (cold, School epsilon {SCHOOL_EPSILON:g}): " + ", ".join(
        f"{p} {calibration[p][0]['settings']} setting(s) {seconds[p]:.2f} s"
        for p in CALIBRATION_PROTOCOLS)
          + f"; paper / honest {seconds['paper'] / seconds['honest']:.1f}x")
  for workload in XLA_WORKLOADS:
    xla = {device: [r for r in rows if r["part"] == "xla" and r["workload"] == workload
                    and r["device"] == device] for device in ("cpu", "cpu+xla")}
    if all(xla.values()):
      (plain, plain_end, plain_mb), (compiled, compiled_end, compiled_mb) = [
          [statistics.median(r[k] for r in xla[d]) for k in (
              "seconds_per_round_median", "end_to_end_seconds", "peak_memory_mb")]
          for d in ("cpu", "cpu+xla")]
      print(f"  {workload} rounds, XLA / not: {compiled:.4f} / {plain:.4f} s per round "
            f"({compiled / plain:.2f}x), end to end {compiled_end:.1f} / {plain_end:.1f} s "
            f"({compiled_end / plain_end:.2f}x); peak memory {compiled_mb:.0f} / "
            f"{plain_mb:.0f} MB")
  sweep = [r for r in rows if r["part"] == "sweep"]
  single = _median_rows(rows, "school", "vectorized", "cpu")
  for r in sweep:
    line = (f"  sweep of {r['runs']} runs in one process: {r['end_to_end_seconds']:.1f} s "
            f"({r['runs'] / r['end_to_end_seconds']:.2f} trials/s), peak "
            f"{r['peak_memory_mb']:.0f} MB")
    if single:
      line += (f"; {r['end_to_end_seconds'] / single['end_to_end_seconds']:.2f}x one fresh "
               f"vectorized run ({single['end_to_end_seconds']:.1f} s)")
    print(line)
  for sampling in ("poisson", "without_replacement"):
    steps = [r for r in rows if r["part"] == "sampling" and r["sampling"] == sampling]
    if steps:
      print(f"  {sampling} DP step of one silo by its size n (batch 64): " + ", ".join(
          f"n={r['silo_size']:,} {r['step_seconds'] * 1e3:.2f} ms" for r in steps)
            + f"; largest / smallest {steps[-1]['step_seconds'] / steps[0]['step_seconds']:.2f}x"
            + f", sizes {steps[-1]['silo_size'] / steps[0]['silo_size']:.0f}x")


def _executor_parts(s, add_row) -> None:
  """The executors, executors_school and ray_overhead parts (their rows added)."""
  for part in ("executors", "executors_school"):
    if part not in s.parts:
      continue
    for repeat in range(s.repeats):
      trials, added = {}, []
      for executor in EXECUTORS if repeat % 2 == 0 else EXECUTORS[::-1]:
        with tempfile.TemporaryDirectory() as folder:
          seconds, peak, trials[executor] = _compare_fresh(part, executor, folder, s)
        added.append(add_row(part=part, backend="vectorized", device="cpu", executor=executor,
                repeat=repeat, end_to_end_seconds=seconds, peak_memory_mb=peak,
                worker_peak_memory_mb=float(trials[executor].peak_memory_mb.max()),
                trials=len(trials[executor]), rounds=int(trials[executor].rounds.max())))
        print(f"{part} --executor={executor} repeat {repeat}: {seconds:.1f} s end to "
              f"end, peak {peak:.0f} MB in all", flush=True)
      same = _same_rows(trials["local"], trials["ray"])
      for row in added:
        row["same_rows"] = same
      print(f"{part} repeat {repeat}: the same rows: {same}", flush=True)
  if "ray_overhead" in s.parts:
    seconds, result = _speed_child("ray_overhead part", os.environ, "--overhead_child",
                                   f"--overhead_tasks={s.overhead_tasks}")
    add_row(part="ray_overhead", backend="none", device="cpu", executor="ray",
            repeat=0, end_to_end_seconds=seconds, tasks=s.overhead_tasks, **result)
    print(f"ray_overhead: cluster start {result['start_seconds']:.1f} s, a task's "
          f"round trip {result['round_trip_seconds'] * 1e3:.1f} ms one at a time, "
          f"{result['seconds_per_task'] * 1e3:.2f} ms a task of "
          f"{s.overhead_tasks} at once", flush=True)


def main(argv):
  if len(argv) > 1:
    raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  s = Settings.from_flags()
  if s.memory_child is not None:
    _memory_in_process(s.memory_child)
    return
  if s.cnn_share_child:
    _cnn_share_in_process()
    return
  if s.sampling_child:
    _sampling_in_process()
    return
  if s.sweep_child:
    _sweep_in_process(s)
    return
  if s.calibration_child is not None:
    _calibration_in_process(s)
    return
  if s.overhead_child:
    started, one, each = _overhead_in_process(s.overhead_tasks)
    print(json.dumps(dict(start_seconds=started, round_trip_seconds=one,
                          seconds_per_task=each, peak_memory_mb=common.peak_memory_mb())))
    return

  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()   # so the child in flight is stopped too
  backends = [("tff", "cpu"), ("vectorized", "cpu")]
  digits_backends = backends + ([("vectorized", "gpu")] if "digits" in s.parts
                                 and _gpu_present() else [])   # (imports TensorFlow)
  rows = []

  def add_row(**row) -> dict:
    """Appends `row` with the machine's cores and the time it finished."""
    rows.append(dict(row, cpus=os.cpu_count(),
                     finished=time.strftime("%Y-%m-%dT%H:%M:%S")))
    return rows[-1]

  def record(part, backend, device, seconds, run, repeat, **extra):
    row = add_row(part=part, backend=backend, device=device, repeat=repeat, **extra,
                  end_to_end_seconds=seconds, in_process_seconds=float(run.wall_seconds),
                  seconds_per_round_median=float(run.seconds_per_round_median),
                  peak_memory_mb=float(run.peak_memory_mb),
                  test_metric=float(run.get("test_metric", run.get("test_accuracy"))),
                  rounds=int(run.rounds))
    print(f"{part} {backend}/{device} repeat {repeat}: {seconds:.1f} s end to end, "
          f"{row['seconds_per_round_median']:.4f} s/round, "
          f"{row['peak_memory_mb']:.0f} MB, metric {row['test_metric']:.4f}", flush=True)

  for repeat in range(s.repeats):
    for part in ("school", "digits", "ifca", "dprivate", "hypernet"):
      if part not in s.parts:
        continue
      choices = digits_backends if part == "digits" else backends
      for backend, device in (choices if repeat % 2 == 0 else choices[::-1]):
        record(part, backend, device, *_fresh_run(
            os.environ, _part_args(part, s), backend, device), repeat)
    if "xla" in s.parts:
      for workload, (binary, args) in _xla_workloads(s):
        for xla in (False, True) if repeat % 2 == 0 else (True, False):
          record("xla", "vectorized", "cpu+xla" if xla else "cpu", *_fresh_run(
              os.environ, (binary, args + ["--xla"] * xla), "vectorized", "cpu"),
                 repeat, workload=workload)
    if "protocol" in s.parts:
      for protocol in PROTOCOLS if repeat % 2 == 0 else PROTOCOLS[::-1]:
        paper = ["--protocol=paper"] if protocol == "paper" else []
        record("protocol", "vectorized", "cpu", *_fresh_run(
            os.environ, ("run", _school_args(s) + paper), "vectorized", "cpu"), repeat,
               protocol=protocol)
  if "sweep" in s.parts:
    seconds, result = _sweep(os.environ, s)
    add_row(part="sweep", backend="vectorized", device="cpu", repeat=0,
            end_to_end_seconds=seconds, peak_memory_mb=result["peak_memory_mb"],
            test_metric=result["test_metric_median"], rounds=s.rounds,
            runs=result["runs"])
  if "calibration" in s.parts:
    for repeat in range(s.repeats):   # cold: each a fresh process
      for protocol in (CALIBRATION_PROTOCOLS if repeat % 2 == 0
                       else CALIBRATION_PROTOCOLS[::-1]):
        _, result = _speed_child("calibration", os.environ,
                                 f"--calibration_child={protocol}",
                                 f"--data_dir={s.data_dir}", f"--rounds={s.rounds}")
        add_row(part="calibration", backend="none", device="cpu", repeat=repeat,
                protocol=protocol, end_to_end_seconds=result["seconds"],
                peak_memory_mb=result["peak_memory_mb"], settings=result["settings"],
                silos=result["silos"], rounds=s.rounds)
        print(f"calibration {protocol} repeat {repeat}: {result['settings']} settings "
              f"in {result['seconds']:.2f} s", flush=True)
  if "memory" in s.parts:
    for budget in MEMORY_BUDGETS:
      seconds, result = _speed_child("memory part", os.environ,
                                     f"--memory_child={budget}")
      add_row(part="memory", backend="vectorized", device="cpu", repeat=0,
              memory_budget=budget, end_to_end_seconds=seconds,
              seconds_per_round_median=result["round_seconds"],
              peak_memory_mb=result["peak_after_round_mb"],
              examples_per_chunk=result["examples_per_chunk"],
              test_metric=result["test_metric"], rounds=1)
      print(f"memory budget {budget}: {result['examples_per_chunk']} examples per chunk, "
            f"round {result['round_seconds']:.1f} s, peak after the round "
            f"{result['peak_after_round_mb']:.0f} MB", flush=True)
  if "cnn_share" in s.parts:
    seconds, result = _speed_child("cnn_share part", os.environ, "--cnn_share_child")
    for name, w in result["workloads"].items():
      add_row(part="cnn_share", backend="vectorized", device="cpu", repeat=0,
              workload=name, end_to_end_seconds=seconds,
              seconds_per_round_median=w["round_seconds"],
              examples_per_round=w["examples"], gflops=w["gflops"],
              gemm_gflops=result["gemm_gflops"], share_of_gemm=w["share_of_gemm"],
              plain_share_of_gemm=w["plain_share_of_gemm"],
              dp_over_plain=w["dp_over_plain"],
              plain_round_seconds=w["plain_round_seconds"],
              dp_over_plain_round=w["dp_over_plain_round"],
              xla_round_seconds=w["xla_round_seconds"],
              **{k: w[k] for k in w if k.startswith("step") or k == "plain_step_ms"},
              peak_memory_mb=result["peak_memory_mb"], rounds=1)
      print(f"cnn_share {name}: DP round {w['round_seconds']:.2f} s, "
            f"{w['gflops']:.2f} GFLOP/s useful = {w['share_of_gemm']:.1%} of the "
            f"GEMM rate ({result['gemm_gflops']:.1f} GFLOP/s; the plain step "
            f"{w['plain_share_of_gemm']:.1%}), dp_over_plain="
            f"{w['dp_over_plain']:.2f}; the round without DP "
            f"{w['plain_round_seconds']:.2f} s (DP round / it: "
            f"{w['dp_over_plain_round']:.2f}); the DP round XLA-compiled "
            f"{w['xla_round_seconds']:.2f} s; peak {result['peak_memory_mb']:.0f} MB",
            flush=True)
      print(f"  a DP step's pieces: one model's plain step {w['plain_step_ms']:.0f} ms; "
            f"the silos' stacked step without DP {w['step_stacked_plain']:.0f} ms; "
            f"clipped {w['step_clipped']:.0f} ms, padded to the widest silo "
            f"({w['step_widest']}) {w['step_clipped_padded']:.0f} ms; noise "
            f"{w['step_noise']:.0f} ms; the DP round's step "
            f"{1e3 * w['round_seconds'] / w['steps']:.0f} ms", flush=True)
  if "sampling" in s.parts:
    seconds, result = _speed_child("sampling part", os.environ, "--sampling_child")
    for step in result["steps"]:
      add_row(part="sampling", backend="none", device="cpu", repeat=0, **step,
              end_to_end_seconds=seconds, peak_memory_mb=result["peak_memory_mb"],
              rounds=1)
      print(f"{step['sampling']} n={step['silo_size']}: "
            f"{step['step_seconds'] * 1e3:.2f} ms per DP step", flush=True)
  _executor_parts(s, add_row)
  for row in rows:
    common.append_row(s.output, row)
  _report(rows)
  print(f"rows appended to {s.output}")


if __name__ == "__main__":
  common.run_main(main)
