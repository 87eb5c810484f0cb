"""Summarize `benchmarks.run` CSVs: a markdown table of means over seeds, and
optionally a seaborn plot of the test metric per algorithm and lambda.

    python -m benchmarks.summarize benchmarks/out/school_dp.csv --plot=school.png
"""

from __future__ import annotations

import os
import sys

from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
flags.DEFINE_string("plot", None, "Write a PNG plot of the test metric here.")

GROUP = ["dataset", "algorithm", "lam", "epsilon"]
# Every privacy setting: rows differing in any of them are never averaged together.
PRIVACY_GROUP = ["delta", "clip", "sampling", "protocol", "neighbouring",
                 "public_silo_sizes", "assumed_silo_size", "standardize", "weighted",
                 "aggregator", "silo_epsilon", "silo_delta"]
# Settings of the clustering algorithms and of misbehaving silos, grouped by where a
# CSV has them.
SETTING_GROUP = ["num_clusters", "selection_fraction", "nu", "patience",
                 "corrupt_silos", "corruption"]
# Clustering, aggregator and robustness figures, averaged (leakage, silo epsilon:
# the largest) where a CSV has them.
EXTRA_STATS = {"ari_mean": ("ari", "mean"),
               "ari_outside_guarantee_mean": ("ari_outside_guarantee", "mean"),
               "leakage_max": ("leakage_max", "max"),
               "validation_loss": ("validation_loss", "mean"),
               "silo_eps_max": ("silo_epsilon_spent", "max"),   # a DP aggregator's
               # with misbehaving silos: the honest silos' pooled test metric
               "honest_test_mean": ("honest_test_metric", "mean")}


def summary_table(df):
  """Mean and std over seeds of the test/train metric, the privacy spent and, for
  clustering runs, the cluster quality and the d-privacy leakage; rows are grouped
  by every privacy setting the CSV records."""
  group = GROUP + [c for c in PRIVACY_GROUP + SETTING_GROUP if c in df.columns]
  df = df.assign(**{c: df[c].astype(object).where(df[c].notna(),
                                                  "none" if c == "epsilon" else "-")
                    for c in group if c != "dataset" and c != "algorithm"})
  if "epsilon_if_poisson_max" not in df.columns:
    df = df.assign(epsilon_if_poisson_max=float("nan"))
  stats = {name: spec for name, spec in EXTRA_STATS.items() if spec[0] in df.columns}
  table = df.groupby(group, sort=False).agg(
      seeds=("seed", "nunique"), test_mean=("test_metric", "mean"),
      test_std=("test_metric", "std"), train_mean=("train_metric", "mean"),
      eps_spent_max=("epsilon_spent_max", "max"),
      eps_if_poisson_max=("epsilon_if_poisson_max", "max"),
      noise_mult_mean=("noise_multiplier_mean", "mean"), **stats,
      seconds=("wall_seconds", "median"))
  return table.reset_index()


def to_markdown(table) -> str:
  cols = list(table.columns)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for row in table.itertuples(index=False):
    cells = [f"{v:.4f}" if isinstance(v, float) else str(v) for v in row]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(df, path):
  import matplotlib
  matplotlib.use("Agg")
  import seaborn as sns
  df = df.assign(method=[f"{a} (lam={l:g})" if a in ("mrmtl", "ditto") else a
                         for a, l in zip(df.algorithm, df.lam)])
  ax = sns.pointplot(data=df, x="method", y="test_metric", errorbar="sd",
                     linestyles="none", capsize=0.2)
  ax.set_ylabel(f"test {df.metric.iloc[0]} (mean +- sd over seeds)")
  ax.tick_params(axis="x", rotation=30)
  ax.figure.tight_layout()
  ax.figure.savefig(path, dpi=120)


# Columns a `benchmarks.run` CSV has, which the table needs.
REQUIRED = ("dataset", "algorithm", "lam", "epsilon", "seed", "test_metric",
            "train_metric", "epsilon_spent_max", "noise_multiplier_mean", "wall_seconds",
            "metric")


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
    plot(df, FLAGS.plot)
    print(f"\nplot written to {FLAGS.plot}")


if __name__ == "__main__":
  common.run_main(main)
