r"""Summarize `benchmarks.run` CSVs: a markdown table of means over seeds, and
optionally a seaborn plot of the test metric per algorithm and lambda; or
`benchmarks.compare` CSVs' report (their selected rows; one per value of a data
setting their runs differ in, such as --mask_probability, and with --plot the test
metric against it: thesis Fig. 1.6). --paired adds the paired differences of
methods with confidence intervals (`benchmarks.paired`), by seed within each
epsilon (and each privacy or run setting, such as --test_fraction, that differs
between rows).

    uv run python -m benchmarks.summarize benchmarks/out/school_dp.csv \
        --plot=benchmarks/out/school.png --paired=mrmtl:fedavg,mrmtl:local
"""

from __future__ import annotations

import os

from absl import flags
import numpy as np

from benchmarks import common, paired, plots, tables
from benchmarks.tables import summary_table, to_markdown

FLAGS = flags.FLAGS
flags.DEFINE_string("plot", None, "Write a PNG plot of the test metric here (compare "
                    "rows: against the data setting their runs differ in).")
flags.DEFINE_list("paired", None, "Pairs a:b of methods to difference cell by cell "
                  "(a `run` CSV's algorithm, 'algorithm lam=X lr=Y finetune_fraction=Z "
                  "selection_fraction=W' where it ran several lambdas, rates or "
                  "fractions; a `compare` CSV's method), with confidence intervals. A "
                  "compare report pairs each lambda method with the others under DP "
                  "already; --paired adds a table of the named pairs, non-private "
                  "cells included, with --ci's interval.")
flags.DEFINE_string("ci", "t", f"One of {', '.join(paired.METHODS)}: --paired's 95% "
                    "interval, Student t or a percentile bootstrap.")

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
  pairs = _pairs(FLAGS.paired)
  import pandas as pd
  compare = [p for p in paths if _compare_csv(p)]
  if compare and len(compare) < len(paths):
    raise common.UsageError(f"{compare[0]} holds benchmarks.compare rows and "
                            f"{(set(paths) - set(compare)).pop()} does not: summarize "
                            "the two kinds apart")
  df = pd.concat([common.read_rows(p, COMPARE_REQUIRED if compare else REQUIRED,
                                   flag=None) for p in paths], ignore_index=True)
  if df.empty:
    raise common.UsageError(f"{', '.join(paths)} hold(s) no rows")
  if compare:
    df = df[df.row_type == "selected"]
    settings = tables.varying(df, tables.COMPARE_SETTINGS)
    _one_model_per_cell(df, settings)
    if FLAGS.plot and not settings:
      raise common.UsageError(
          "--plot of benchmarks.compare rows draws the test metric against a setting "
          f"the runs differ in ({', '.join(tables.COMPARE_SETTINGS)}); these rows "
          "share theirs, and compare drew their figures")
    print(tables.compare_report(df))
  else:
    print(to_markdown(summary_table(df)))
  if pairs:
    with common.usage_errors():
      print("\n" + _paired(df, pairs, compare))
  if FLAGS.plot:
    if compare:
      plots.against_setting(df, settings[0], FLAGS.plot, _chance(df))
    else:
      plots.run_summary(df, FLAGS.plot)
    print(f"\nplot written to {FLAGS.plot}")


def _chance(selected):
  """The accuracy of a uniform guess on the compare rows' preset (None: a regression,
  or rows of several presets)."""
  from benchmarks import configs, datasets
  if selected.preset.nunique() != 1:
    return None
  return datasets.DATASETS[configs.COMPARE_PRESETS[selected.preset.iloc[0]].dataset
                           ].chance


def _one_model_per_cell(selected, settings):
  """Compare rows hold one selected model per method, epsilon and seed (within each
  setting); a UsageError in one line names a cell two runs selected twice."""
  cell = ["preset", "method", "epsilon", "seed", *settings]
  twice = selected[selected.duplicated(cell, keep=False)]
  if not twice.empty:
    first = twice.iloc[0]
    raise common.UsageError(
        f"{first.method} at epsilon {first.epsilon:g}, seed {first.seed} "
        f"({first.preset}) has more than one selected row: the CSV(s) hold several "
        "compare runs of one cell (over other grids or flags); summarize each run's "
        "rows apart")


# Columns a `benchmarks.compare` CSV has, which its report needs.
COMPARE_REQUIRED = ("row_type", "preset", "method", "epsilon", "seed", "test_metric",
                    "metric", "lam", "tuning")


def _compare_csv(path: str) -> bool:
  """Whether `path` holds `benchmarks.compare` rows (a file that cannot be read is
  `common.read_rows`' to refuse)."""
  import pandas as pd
  try:
    return "row_type" in pd.read_csv(path, nrows=0).columns
  except (ValueError, OSError):   # (pandas' parser and empty-data errors included)
    return False


def _pairs(given) -> list:
  """--paired as (a, b) tuples; a UsageError in one line for a malformed pair (or
  --ci outside its choices)."""
  if FLAGS.ci not in paired.METHODS:
    raise common.UsageError(f"--ci must be one of {', '.join(paired.METHODS)}; got "
                            f"{FLAGS.ci}")
  pairs = [tuple(item.split(":")) for item in given or ()]
  for pair in pairs:
    if len(pair) != 2 or not all(pair) or pair[0] == pair[1]:
      raise common.UsageError(f"--paired takes pairs a:b of two methods, got "
                              f"{':'.join(pair)}")
  return pairs


# A run CSV's settings that name an algorithm's rows apart in --paired's labels
# (where the algorithm ran several values) rather than grouping the cells.
LABELLED = ("lam", "lr", "finetune_fraction", "selection_fraction")


def _paired(df, pairs, compare: bool) -> str:
  """The paired-differences table of `pairs` in `df` (a run or compare CSV's rows),
  by seed within each epsilon and setting the rows differ in; a method the setting
  does not apply to (its value empty: FedAvg's number of clusters) pairs within each
  value."""
  import pandas as pd
  if compare:
    label = df.method
  else:   # an algorithm that ran several lambdas (rates, ...): one label per value
    label = paired.labels(df, "algorithm", LABELLED)
  df = df.assign(label=label, epsilon=df.epsilon.fillna(float("inf")))
  missing = sorted({m for pair in pairs for m in pair} - set(df.label))
  if missing:
    raise common.UsageError(f"--paired: no rows of {', '.join(missing)}; the CSV has "
                            f"{', '.join(sorted(set(df.label)))}")
  private = df[np.isfinite(df.epsilon)]   # (a setting of DP only: None without)
  # a setting applies to the methods with a value of it (where one of them has it
  # empty, that is a value too: no early stopping)
  applies = lambda c: df.label.isin(set(df.label[df[c].notna()]))
  settings = [c for c in tables.SETTING_GROUP if c in df and c not in LABELLED
              and df[c][applies(c)].astype(str).nunique() > 1]
  group = ["epsilon"] + (tables.varying(df, tables.COMPARE_SETTINGS) if compare else
                         tables.varying(private, tables.PRIVACY_GROUP) + settings)
  for column in settings:   # a method without the setting is paired within each value
    apart = ~applies(column)
    df = pd.concat([df[~apart]] + [df[apart].assign(**{column: value})
                                   for value in df.loc[~apart, column].unique()],
                   ignore_index=True)
  table = paired.differences(df, pairs, label="label", cell=["seed"], group=group,
                             metric=df.metric.iloc[0], method=FLAGS.ci)
  return paired.to_markdown(table, df.metric.iloc[0], method=FLAGS.ci)


if __name__ == "__main__":
  common.run_main(main)
