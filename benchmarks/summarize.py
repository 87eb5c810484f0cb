r"""Summarize `benchmarks.run` CSVs: a markdown table of means over seeds, and
optionally a seaborn plot of the test metric per algorithm and lambda.

    uv run python -m benchmarks.summarize benchmarks/out/school_dp.csv \
        --plot=benchmarks/out/school.png
"""

from __future__ import annotations

import os

from absl import flags

from benchmarks import common, plots
from benchmarks.tables import summary_table, to_markdown

FLAGS = flags.FLAGS
flags.DEFINE_string("plot", None, "Write a PNG plot of the test metric here.")

# Columns a `benchmarks.run` CSV has, which the table needs.
REQUIRED = ("dataset", "algorithm", "lam", "epsilon", "seed", "test_metric",
            "train_metric", "epsilon_spent_max", "noise_multiplier_mean", "wall_seconds",
            "metric")


@common.takes_arguments
def main(argv):
  paths = argv[1:]
  if not paths:
    raise common.UsageError("give one or more CSV files written by benchmarks.run")
  if FLAGS.plot:
    common.check_figure_path(FLAGS.plot)
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise common.UsageError(f"no such file: {', '.join(missing)}")
  import pandas as pd
  df = pd.concat([common.read_rows(p, REQUIRED, flag=None) for p in paths],
                 ignore_index=True)
  if df.empty:
    raise common.UsageError(f"{', '.join(paths)} hold(s) no rows")
  print(to_markdown(summary_table(df)))
  if FLAGS.plot:
    plots.run_summary(df, FLAGS.plot)
    print(f"\nplot written to {FLAGS.plot}")


if __name__ == "__main__":
  common.run_main(main)
