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
- `xla`: the vectorized backend's rounds without and with --xla (XLA-compiled, static
  shapes) and with --device=xla_cpu (the same HLO on PJRT's CPU client), in turns,
  each a fresh process: the `school` run, --digits_rounds DP
  rounds of the digits CNN (MR-MTL, epsilon 4) and the `hypernet` run: seconds per
  round, end to end (XLA's compilation included), peak memory; then once each
  (`xla_memory`, untimed) with --device_memory: the device memory of its largest
  round program, estimated by XLA's buffer assignment (for the CPU).
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

Each part's code is a module of this package: `fresh` (the parts timed as fresh
runs of the binaries), `in_process` (sweep, calibration, memory, sampling: run in a
child of this binary), `cnn_share`, `cluster` (executors, ray_overhead), `report`
(the medians printed after the rows).
"""

from __future__ import annotations

import os
import time

from absl import flags

from benchmarks import common
from benchmarks.common import UsageError
from benchmarks.harness import spec
from benchmarks.speed import cluster, cnn_share, fresh, in_process, report

PARTS = ("school", "digits", "sweep", "ifca", "dprivate", "hypernet", "protocol",
         "calibration", "memory", "cnn_share", "sampling", "xla", "executors",
         "executors_school", "ray_overhead")
DEFAULT_PARTS = ("school", "digits", "sweep")
# The parts needing --data_dir (School's file).
SCHOOL_PARTS = ("school", "sweep", "ifca", "protocol", "calibration", "xla",
                "executors_school")
# Columns every row of this binary has: an existing --output without them is refused.
SIGNATURE = ("part", "backend", "device", "end_to_end_seconds")

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
                             choices=in_process.MEMORY_BUDGETS),
    cnn_share_child=spec.boolean(False, "Run the cnn_share part in this process and "
                                 "print it as JSON."),
    sampling_child=spec.boolean(False, "Run the sampling part in this process and "
                                "print it as JSON."),
    sweep_child=spec.boolean(False, "Run the sweep in this process and print its "
                             "timings as JSON."),
    calibration_child=spec.string(None, "One of {choices}; calibrate the School run "
                                  "under it in this process and print the timing as "
                                  "JSON.", choices=in_process.CALIBRATION_PROTOCOLS),
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
      needs_school = child or set(SCHOOL_PARTS) & set(FLAGS.parts)
      if needs_school and not (FLAGS.data_dir and os.path.isfile(
          os.path.join(FLAGS.data_dir, "school.mat"))):
        raise UsageError("--data_dir must be a folder with school.mat; got "
                         f"{FLAGS.data_dir}")
    return cls(**SPEC.values(), **CHILDREN.values())


# The children this binary starts, by their flag: what each runs.
_CHILDREN = {
    "memory_child": lambda s: in_process.memory(s.memory_child),
    "cnn_share_child": lambda s: cnn_share.in_process(),
    "sampling_child": lambda s: in_process.sampling(),
    "sweep_child": in_process.sweep,
    "calibration_child": in_process.calibration,
    "overhead_child": lambda s: cluster.overhead(s.overhead_tasks),
}
# The parts measured here, in turn, each adding its rows.
_PARTS = ((fresh.FRESH_PARTS + ("xla", "protocol"), fresh.parts),
          (("sweep",), in_process.sweep_part),
          (("calibration",), in_process.calibration_part),
          (("memory",), in_process.memory_part),
          (("cnn_share",), cnn_share.part),
          (("sampling",), in_process.sampling_part),
          (("executors", "executors_school", "ray_overhead"), cluster.parts))


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = Settings.from_flags()
  for name, run_child in _CHILDREN.items():
    if getattr(s, name) not in (None, False):
      run_child(s)
      return

  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()   # so the child in flight is stopped too
  rows = []

  def add_row(**row) -> dict:
    """Appends `row` with the machine's cores and the time it finished."""
    rows.append(dict(row, cpus=os.cpu_count(),
                     finished=time.strftime("%Y-%m-%dT%H:%M:%S")))
    return rows[-1]

  for names, measure in _PARTS:
    if set(names) & set(s.parts):
      measure(s, add_row)
  for row in rows:
    common.append_row(s.output, row)
  report.report(rows)
  print(f"rows appended to {s.output}")
