"""Paired differences between methods, with confidence intervals (issue 56): two
methods run on the same silos and keys in a cell (an epsilon and a seed, say), so
their difference in a cell removes what the cell shares (the split, the draw of
the data), and the spread that matters is that of the differences, not of each
method's metric over seeds.

For a pair (a, b) and a group of cells, d_i = metric(a, cell i) - metric(b, cell i)
over the n cells holding both; the interval is Student's t, mean(d) +- t_{n-1}
sd(d) / sqrt(n) (it needs n >= 2), or a percentile bootstrap of mean(d) (10,000
resamples of the cells, a fixed generator: the same rows give the same interval).
No flags: any binary or test may import it.
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("t", "bootstrap")
BOOTSTRAP_RESAMPLES = 10_000
# Metrics where higher is better; the rest (mse) lower: the rule tuning selects by
# (`grid.score`).
HIGHER_IS_BETTER = ("accuracy", "average_precision")


def lower_is_better(metric: str) -> bool:
  return metric not in HIGHER_IS_BETTER


def interval(differences, level: float = 0.95, method: str = "t") -> tuple:
  """(low, high): the `level` confidence interval of the mean of `differences`
  (NaNs where fewer than 2)."""
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  d = np.asarray(differences, dtype=float)
  if len(d) < 2:
    return math.nan, math.nan
  if method == "t":
    from scipy import stats
    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean() - half), float(d.mean() + half)
  rng = np.random.default_rng(0)
  means = d[rng.integers(0, len(d), size=(BOOTSTRAP_RESAMPLES, len(d)))].mean(axis=1)
  return (float(np.quantile(means, 0.5 - level / 2)),
          float(np.quantile(means, 0.5 + level / 2)))


def labels(rows, by: str, settings):
  """Each row's label for `differences`: its `by` value (a method), with
  " setting=value" for each of `settings` that method ran several values of."""
  import pandas as pd
  label = rows[by].copy()
  for setting in (s for s in settings if s in rows):
    several = rows.groupby(by)[setting].transform("nunique") > 1
    label[several] += f" {setting}=" + rows.loc[several, setting].map(
        lambda v: "none" if pd.isna(v) else f"{v:g}")   # (a row without the setting)
  return label


def differences(rows, pairs, *, label: str, cell, group=(), value: str = "test_metric",
                metric: str = "mse", level: float = 0.95, method: str = "t"):
  """A DataFrame, one row per (a, b) of `pairs` and group of `rows` (the values of
  the `group` columns, then all groups together as "all"): `pairs` cells where both
  `label` values have a `value` (cells: the `cell` columns' values; a cell with more
  than one row of a label is an error), `mean_difference` (a - b), the interval
  `ci_low`, `ci_high`, `a_better` (cells where a is better: lower where
  `lower_is_better(metric)`), and `verdict`: "a better", "b better" (the interval
  excludes 0) or "not resolved"."""
  import pandas as pd
  cell, group = list(cell), list(group)
  rows = rows.assign(**{c: rows[c].astype(object).where(rows[c].notna(), "-")
                        for c in group + cell})   # (NaN would drop out of a pivot)
  duplicated = rows.duplicated(subset=[label, *group, *cell], keep=False)
  if duplicated.any():
    first = rows[duplicated].iloc[0]
    raise ValueError(f"{label}={first[label]} has more than one row in a cell ("
                     + ", ".join(f"{c}={first[c]}" for c in group + cell) + "): "
                     "tell the rows apart by another group column")
  lower = lower_is_better(metric)
  groups = ([(dict(zip(group, key if isinstance(key, tuple) else (key,))), part)
             for key, part in rows.groupby(group if len(group) > 1 else group[0],
                                           sort=True, dropna=False)]
            if group else [])
  if len(groups) != 1:
    groups.append(({c: "all" for c in group}, rows))
  out = []
  for a, b in pairs:
    for names, part in groups:
      table = part.pivot_table(index=group + cell, columns=label, values=value,
                               aggfunc="first")
      if a not in table or b not in table:
        continue
      both = table[[a, b]].dropna()
      d = (both[a] - both[b]).to_numpy()
      low, high = interval(d, level, method)
      better = int(np.sum(d < 0) if lower else np.sum(d > 0))
      verdict = ("not resolved" if not (low > 0 or high < 0)
                 else "a better" if (high < 0) == lower else "b better")
      out.append(dict(a=a, b=b, **names, pairs=len(d),
                      mean_difference=float(d.mean()) if len(d) else math.nan,
                      ci_low=low, ci_high=high, a_better=better, verdict=verdict))
  return pd.DataFrame(out)


def to_markdown(table, metric: str, level: float = 0.95, method: str = "t") -> str:
  """`differences`' table as markdown, with what its numbers are."""
  if table.empty:
    return "(no pair of methods shares a cell)\n"
  group = list(table.columns[2:list(table.columns).index("pairs")])
  head = ["a", "b", *group, "pairs", "mean a - b", f"{level:.0%} CI", "a better in",
          "verdict"]
  lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
  for row in table.to_dict("records"):
    ci = ("-" if math.isnan(row["ci_low"])
          else f"[{row['ci_low']:.4f}, {row['ci_high']:.4f}]")
    cells = [row["a"], row["b"], *(f"{row[c]:g}" if isinstance(row[c], float)
                                   else str(row[c]) for c in group),
             str(row["pairs"]), f"{row['mean_difference']:.4f}", ci,
             f"{row['a_better']} of {row['pairs']}", row["verdict"]]
    lines.append("| " + " | ".join(cells) + " |")
  direction = "lower" if lower_is_better(metric) else "higher"
  kind = "Student t" if method == "t" else "percentile bootstrap"
  return ("\n".join(lines) + f"\n\nPaired differences a - b of test {metric} "
          f"({direction} is better), one pair per cell holding both; {level:.0%} {kind} "
          "interval of the mean difference; the verdict names the better method where "
          "the interval excludes 0.\n")
