"""The cluster speed parts: `benchmarks.compare` with --executor=local and
--executor=ray side by side (`executors`, `executors_school`), and a local Ray
cluster's overhead per task (`ray_overhead`)."""

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

from benchmarks import common
from benchmarks.common import UsageError
from benchmarks.speed import fresh

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
                     f"{fresh.last_line(''.join(errors))}")
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


def overhead(tasks: int):
  """Run in a child: a local Ray cluster and `tasks` tasks of `_noop`; prints (as
  JSON) the cluster's start, the median round trip of one task at a time, the
  seconds per task of all at once."""
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
  print(json.dumps(dict(start_seconds=started, round_trip_seconds=statistics.median(one),
                        seconds_per_task=(time.perf_counter() - t0) / tasks,
                        peak_memory_mb=common.peak_memory_mb())))


def parts(s, add_row) -> None:
  """The executors, executors_school and ray_overhead parts (their rows added)."""
  for part in ("executors", "executors_school"):
    if part not in s.parts:
      continue
    for repeat in range(s.repeats):
      trials, added = {}, []
      for executor in EXECUTORS if repeat % 2 == 0 else EXECUTORS[::-1]:
        with tempfile.TemporaryDirectory() as folder:
          seconds, peak, trials[executor] = _compare_fresh(part, executor, folder, s)
        added.append(add_row(
            part=part, backend="vectorized", device="cpu", executor=executor,
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
    seconds, result = fresh.speed_child("ray_overhead part", "--overhead_child",
                                        f"--overhead_tasks={s.overhead_tasks}")
    add_row(part="ray_overhead", backend="none", device="cpu", executor="ray",
            repeat=0, end_to_end_seconds=seconds, tasks=s.overhead_tasks, **result)
    print(f"ray_overhead: cluster start {result['start_seconds']:.1f} s, a task's "
          f"round trip {result['round_trip_seconds'] * 1e3:.1f} ms one at a time, "
          f"{result['seconds_per_task'] * 1e3:.2f} ms a task of "
          f"{s.overhead_tasks} at once", flush=True)


