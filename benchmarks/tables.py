"""Tables of `benchmarks.run` rows: means over seeds, grouped so that rows of
different privacy settings are never averaged together (no flags: any binary or
test may import it)."""

from __future__ import annotations

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
