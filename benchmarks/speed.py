"""Speed of the School MR-MTL DP run (thesis app. B.4 settings: 200 rounds, B = 32,
clip 1, lr 0.01, epsilon = 6, delta = 1e-3, lambda = 1, one seed).

End to end: each repeat runs `python -m benchmarks.run` for that configuration in a
fresh process (imports, data loading, per-silo calibration, tracing, 200 rounds,
evaluation, worker shutdown) and times it from outside. Steady state: the median
seconds per round that the run itself records. Reports medians over repeats.

    python -m benchmarks.speed --data_dir=../shared/data --repeats=3
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "Folder with school.mat.")
flags.DEFINE_integer("repeats", 3, "Fresh-process runs to take the median of.")
flags.DEFINE_integer("rounds", 200, "Rounds per run.")
flags.DEFINE_string("output", "benchmarks/out/speed.csv", "CSV file rows are appended to.")


def main(argv):
  del argv
  import pandas as pd
  if not FLAGS.data_dir or not os.path.isfile(os.path.join(FLAGS.data_dir, "school.mat")):
    print(f"error: --data_dir must be a folder with school.mat; got {FLAGS.data_dir}",
          file=sys.stderr)
    sys.exit(2)
  rows = []
  for repeat in range(FLAGS.repeats):
    with tempfile.TemporaryDirectory() as tmp:
      csv = os.path.join(tmp, "row.csv")
      cmd = [sys.executable, "-m", "benchmarks.run", "--dataset=school",
             f"--data_dir={FLAGS.data_dir}", "--algorithm=mrmtl", "--lam=1",
             "--epsilon=6", "--delta=1e-3", f"--rounds={FLAGS.rounds}", "--seeds=0",
             f"--output={csv}"]
      start = time.perf_counter()
      subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      end_to_end = time.perf_counter() - start
      run = pd.read_csv(csv).iloc[0]
    rows.append(dict(repeat=repeat, rounds=FLAGS.rounds, end_to_end_seconds=end_to_end,
                     in_process_seconds=run.wall_seconds,
                     seconds_per_round_median=run.seconds_per_round_median,
                     test_metric=run.test_metric, epsilon_spent_max=run.epsilon_spent_max,
                     cpus=os.cpu_count(), finished=time.strftime("%Y-%m-%dT%H:%M:%S")))
    print(f"repeat {repeat}: end to end {end_to_end:.1f} s, "
          f"{run.seconds_per_round_median:.4f} s/round", flush=True)
  df = pd.DataFrame(rows)
  os.makedirs(os.path.dirname(FLAGS.output) or ".", exist_ok=True)
  df.to_csv(FLAGS.output, mode="a", header=not os.path.exists(FLAGS.output), index=False)
  print(f"median end to end: {statistics.median(df.end_to_end_seconds):.1f} s; "
        f"median steady-state round: {statistics.median(df.seconds_per_round_median):.4f} s "
        f"({FLAGS.repeats} repeats, {FLAGS.rounds} rounds)")


if __name__ == "__main__":
  app.run(main)
