"""The speed parts timed as fresh runs of the binaries (`school`, `digits`, `ifca`,
`dprivate`, `hypernet`, `xla`, `protocol`): each a child process timed from outside,
the backends (or settings) alternating within each repeat; and the child processes
every part starts (`child`, `speed_child`), stopped with this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import configs
from benchmarks.common import UsageError

PROTOCOLS = ("paper", "honest")   # the protocol part's
SCHOOL = configs.PRESETS["school"]
SCHOOL_EPSILON = 6.0
FRESH_PARTS = ("school", "digits", "ifca", "dprivate", "hypernet")
XLA_WORKLOADS = ("school", "digits_dp", "hypernet")
# The xla part's modes, (the row's device, flags, --device), in turns: TensorFlow's
# uncompiled rounds, its XLA, and the same HLO on PJRT's CPU client.
XLA_MODES = (("cpu", [], "cpu"), ("cpu+xla", ["--xla"], "cpu"), ("xla_cpu", [], "xla_cpu"))


def school_args(s, algorithm="mrmtl"):
  return ["--dataset=school", f"--data_dir={s.data_dir}", f"--methods={algorithm}",
          "--lams=1", f"--epsilon={SCHOOL_EPSILON:g}", "--delta=1e-3",
          f"--rounds={s.rounds}", "--seeds=0"]


def part_args(part, s):
  """(binary, its flags) of a part timed as fresh runs."""
  if part == "hypernet":
    return "hypernet", ["--methods=hypernet", "--sampling_rates=0.1",
                        "--clips=0.1", "--noise_multipliers=1",
                        f"--rounds={s.hypernet_rounds}"]
  return "run", run_args(part, s)


def run_args(part, s):
  """benchmarks.run's flags of a part."""
  if part == "school":
    return school_args(s)
  if part == "ifca":
    return school_args(s, "ifca_mrmtl")
  if part == "digits":
    return ["--methods=mrmtl", f"--rounds={s.digits_rounds}"]
  return ["--dataset=two_cluster", "--methods=dprivate_clustering", "--nu=5",
          "--clients_per_round=7", f"--rounds={s.dprivate_rounds}"]


def xla_workloads(s):
  """The xla part's (workload, (binary, its flags))."""
  return (("school", ("run", school_args(s))),
          ("digits_dp", ("run", ["--methods=mrmtl", f"--rounds={s.digits_rounds}",
                                 "--epsilon=4"])),
          ("hypernet", part_args("hypernet", s)))


def fresh_run(binary_args, backend, device="auto"):
  """Runs benchmarks.<binary> in a fresh process; (seconds from outside, its row)."""
  import pandas as pd
  binary, args = binary_args
  with tempfile.TemporaryDirectory() as tmp:
    csv = os.path.join(tmp, "row.csv")
    cmd = [sys.executable, "-m", f"benchmarks.{binary}", *args, f"--backend={backend}",
           f"--device={device}", f"--output={csv}"]
    start = time.perf_counter()
    returncode, stderr = child(cmd)
    seconds = time.perf_counter() - start
    if returncode:
      raise UsageError(f"benchmarks.{binary} failed: {last_line(stderr)}")
    return seconds, pd.read_csv(csv).iloc[0]


def child(cmd, stdout=subprocess.DEVNULL):
  """Runs `cmd`; (return code, stderr[, stdout]). The child is stopped (SIGTERM, then
  SIGKILL) when this process is interrupted or terminated, so none outlives it."""
  process = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
  try:
    out, err = process.communicate()
  except BaseException:
    process.terminate()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
    raise
  return (process.returncode, err) if stdout is subprocess.DEVNULL else (
      process.returncode, err, out)


def last_line(text: str) -> str:
  lines = [line for line in text.strip().splitlines() if line.strip()]
  return lines[-1] if lines else "no error message"


def speed_child(what: str, *args):
  """Runs this binary with `args` in a fresh process; (seconds from outside, the
  JSON it printed last)."""
  start = time.perf_counter()
  returncode, stderr, stdout = child([sys.executable, "-m", "benchmarks.speed", *args],
                                     stdout=subprocess.PIPE)
  if returncode:
    raise UsageError(f"the {what} failed: {last_line(stderr)}")
  return time.perf_counter() - start, json.loads(stdout.strip().splitlines()[-1])


def gpu_present() -> bool:
  import tensorflow as tf
  return bool(tf.config.list_physical_devices("GPU"))




def parts(s, add_row) -> None:
  """The fresh-run parts of `s.parts`, --repeats times (their rows added)."""
  backends = [("tff", "cpu"), ("vectorized", "cpu")]
  digits_backends = backends + ([("vectorized", "gpu")] if "digits" in s.parts
                                 and gpu_present() else [])   # (imports TensorFlow)

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
    for part in FRESH_PARTS:
      if part not in s.parts:
        continue
      choices = digits_backends if part == "digits" else backends
      for backend, device in (choices if repeat % 2 == 0 else choices[::-1]):
        record(part, backend, device, *fresh_run(part_args(part, s), backend, device),
               repeat)
    if "xla" in s.parts:
      turn = repeat % len(XLA_MODES)
      for workload, (binary, args) in xla_workloads(s):
        for label, extra, device in XLA_MODES[turn:] + XLA_MODES[:turn]:
          record("xla", "vectorized", label, *fresh_run(
              (binary, args + extra), "vectorized", device), repeat, workload=workload)
    if "protocol" in s.parts:
      for protocol in PROTOCOLS if repeat % 2 == 0 else PROTOCOLS[::-1]:
        paper = ["--protocol=paper"] if protocol == "paper" else []
        record("protocol", "vectorized", "cpu", *fresh_run(
            ("run", school_args(s) + paper), "vectorized", "cpu"), repeat,
               protocol=protocol)
  if "xla" in s.parts:   # once: not timed (the estimate compiles each program again)
    for workload, (binary, args) in xla_workloads(s):
      seconds, run = fresh_run((binary, args + ["--device_memory"]), "vectorized",
                               "xla_cpu")
      add_row(part="xla_memory", backend="vectorized", device="xla_cpu",
              workload=workload, end_to_end_seconds=seconds, repeat=0,
              device_memory_mb=float(run.device_memory_mb),
              peak_memory_mb=float(run.peak_memory_mb))
      print(f"xla_memory {workload}: the largest round program holds "
            f"{run.device_memory_mb:.1f} MB on the device (arguments, results and "
            "temporaries; XLA's buffer assignment for the CPU)", flush=True)
