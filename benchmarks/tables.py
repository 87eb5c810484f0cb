"""The binaries' tables (no flags: any binary or test may import it): means over
seeds of `benchmarks.run` rows, grouped so that rows of different privacy settings
are never averaged together; `benchmarks.compare`'s markdown report; the printed
tables of the other binaries."""

from __future__ import annotations

import math

import numpy as np

from benchmarks import paired
from benchmarks.grid import LAMBDA_METHODS

GROUP = ["dataset", "algorithm", "lam", "epsilon"]
# Every privacy setting: rows differing in any of them are never averaged together.
PRIVACY_GROUP = ["delta", "clip", "sampling", "protocol", "neighbouring",
                 "public_silo_sizes", "assumed_silo_size", "standardize", "weighted",
                 "aggregator", "silo_epsilon", "silo_delta"]
# Settings of the clustering algorithms and of misbehaving silos, grouped by where a
# CSV has them.
SETTING_GROUP = ["num_clusters", "selection_fraction", "nu", "patience",
                 "corrupt_silos", "corruption", "test_fraction", "finetune_fraction",
                 "mask_probability"]
# The data settings of `benchmarks.compare` rows (`grid.setting_columns`): rows of
# several runs that differ in one are reported apart.
COMPARE_SETTINGS = ["mask_probability"]
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


def print_frame(df, columns=None, number: str = ".4g") -> None:
  """`df` (its `columns` present, in that order) as fixed-width text, floats in
  the format `number`."""
  if columns is not None:
    df = df[[c for c in columns if c in df]]
  print(df.to_string(index=False, float_format=lambda v: format(v, number)))


def epsilon_label(epsilon, prefix: str) -> str:
  """A table column or panel title: `prefix` and epsilon, or non-private."""
  return "non-private" if math.isinf(epsilon) else f"{prefix} {epsilon:g}"


# --- benchmarks.compare ---------------------------------------------------------------

def _grid_table(selected, column: str, lambdas: bool) -> str:
  """Markdown: method x epsilon, `column` mean +- sd over seeds (and the lambdas
  selected)."""
  epsilons = sorted(selected.epsilon.unique())
  lines = ["| method | " + " | ".join(epsilon_label(e, "eps") for e in epsilons) + " |",
           "|---" * (len(epsilons) + 1) + "|"]
  for method, part in selected.groupby("method", sort=False):
    cells = []
    for epsilon in epsilons:
      values = part[part.epsilon == epsilon][column]
      if values.empty:
        cells.append("-")
        continue
      text = (f"{values.mean():.4f} +- {values.std(ddof=1):.4f}" if len(values) > 1
              else f"{values.mean():.4f}")
      if lambdas and method in LAMBDA_METHODS:
        lams = part[part.epsilon == epsilon].lam
        text += " (lam " + "/".join(f"{v:g}" for v in sorted(lams.unique())) + ")"
      cells.append(text)
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def varying(rows, columns) -> list:
  """Those of `columns` whose value differs between `rows` (NaN counts as one)."""
  return [c for c in columns if c in rows and rows[c].astype(str).nunique() > 1]


def compare_report(selected) -> str:
  """The markdown report: test metric (and, where attacks ran, membership
  inference) of the selected models, and the paired wins; one report per value of
  a data setting the rows vary (rows of several runs: `COMPARE_SETTINGS`)."""
  settings = varying(selected, COMPARE_SETTINGS)
  if settings:
    return "\n".join(
        "**" + ", ".join(f"{c} = {v:g}" for c, v in zip(
            settings, key if isinstance(key, tuple) else (key,))) + "**\n\n"
        + compare_report(part) for key, part in selected.groupby(
            settings if len(settings) > 1 else settings[0], sort=True, dropna=False))
  metric = selected.metric.iloc[0]
  tunings = "; ".join(sorted(selected.tuning.unique()))
  units = ""
  if "privacy_unit" in selected and (selected.privacy_unit == "user").any():
    users = ", ".join(sorted(selected[selected.privacy_unit == "user"].method.unique()))
    units = (f" Under DP the epsilon of {users} is user-level (a silo's whole data, "
             "add/remove one silo), the others' example-level in each silo; the "
             "user-level one covers the hypernetwork's phi and noised aggregates, "
             "not its test metric (each user's model, from its un-noised embedding).")
  if "aggregator" in selected and (selected.aggregator.fillna("mean") != "mean").any():
    names = ", ".join(sorted(selected.aggregator.dropna().unique()))
    units += f" Server aggregator: {names}"
    if "silo_epsilon_spent" in selected and selected.silo_epsilon_spent.notna().any():
      units += (f", silo-level epsilon {selected.silo_epsilon_spent.max():.3g} at delta "
                f"{selected.silo_delta_with_sampler_tail.max():.3g} per trial (tuning "
                "not counted; it covers the server's aggregates, not the personalized "
                "models or their metrics)")
    units += "."
  out = (_grid_table(selected, "test_metric", True) + f"\nTest {metric}, mean +- sd "
         f"over seeds; tuning {tunings}.{units} A row's epsilon covers its own "
         "release; rows on the same silos (one seed) compose.\n" + _wins(selected))
  if "mia_auc" in selected and selected.mia_auc.notna().any():
    out += ("\n" + _grid_table(selected, "mia_auc", False) + "\nMembership inference "
            "against the same models (threshold attack, every silo's training vs "
            "test examples pooled): ROC AUC, 0.5 is a coin flip.\n")
  return out


def _wins(selected) -> str:
  """How often each lambda method beats each other method in the same private
  (epsilon, seed) cell, and by how much (`benchmarks.paired`: the mean paired
  difference and its interval, per epsilon and over all cells): the paired
  comparison the seed spread above hides."""
  metric = selected.metric.iloc[0]
  private = selected[np.isfinite(selected.epsilon)]
  methods = sorted(private.method.unique())
  pairs = [(method, other) for method in methods if method in LAMBDA_METHODS
           for other in methods if other not in LAMBDA_METHODS]
  table = paired.differences(private, pairs, label="method", cell=["seed"],
                             group=["epsilon"], metric=metric)
  if table.empty:
    return ""
  overall = table[table.epsilon == "all"] if (table.epsilon == "all").any() else table
  lines = []
  for method, part in overall.groupby("a", sort=False):
    lines.append(f"Under DP, {method} beats " + ", ".join(
        f"{r.b} in {r.a_better} of {r.pairs}" for r in part.itertuples())
                 + " (epsilon, seed) cells.\n")
  return "".join(lines) + "\n" + paired.to_markdown(table, metric)


# --- the other binaries ---------------------------------------------------------------

def signal_to_noise(df):
  """Per `benchmarks.hypernet` row, a round's signal-to-noise bound: the clipped
  mean's largest norm S over the noise's norm sigma sqrt(P) (sigma, the noise per
  coordinate of phi's step, is z max(w_u) S / (q W); P, the hypernetwork's
  parameters): q W / (z sqrt(P)) with every w_u = 1. inf without noise; NaN for
  FedAvg (whose rows alone have no hypernetwork size)."""
  import numpy as np
  if "hypernet_parameters" not in df:
    return df.sigma * np.nan
  with np.errstate(divide="ignore"):
    return df.l2_norm_clip / (df.sigma * np.sqrt(df.hypernet_parameters))


def hypernet_summary(df):
  """`benchmarks.hypernet` rows: means over seeds per algorithm and privacy
  setting (the largest epsilon; `signal_to_noise`)."""
  keys = ["algorithm", "sampling_rate", "l2_norm_clip", "noise_multiplier"]
  return df.assign(signal_to_noise=signal_to_noise(df)).fillna(
      {k: "-" for k in keys[1:]}).groupby(keys, sort=False).agg(
      seeds=("seed", "nunique"), epsilon=("epsilon", "max"),
      signal_to_noise=("signal_to_noise", "first"),
      test_accuracy=("test_accuracy", "mean"),
      mean_user_accuracy=("mean_user_accuracy", "mean"),
      wall_seconds=("wall_seconds", "mean")).reset_index()


# `benchmarks.pandemic`'s printed columns
PANDEMIC_COLUMNS = ["method", "mode", "sample_size", "sigma", "lam", "loss", "alpha",
                    "architecture", "epsilon_theorem", "epsilon_code",
                    "average_precision", "lift", "recall_at_half", "train_seconds"]


# The thesis' comparisons (Table 2.6): personalization against one model and each
# other, as (a, b) pairs of methods; and the settings rows of one pandemic
# invocation may differ in besides method, lambda and seed.
PANDEMIC_COMPARED = (("mrmtl", "fedavg"), ("local", "fedavg"), ("mrmtl", "local"))
_PANDEMIC_SETTINGS = ("sigma", "mode", "sample_size", "loss", "alpha", "architecture",
                      "feature_set", "clip")


def pandemic_comparison(rows, larger: str) -> str:
  """The pandemic methods' paired AP differences by seed (`paired.differences`)
  within each sigma and setting that varies, or why `rows` cannot tell methods
  apart: one seed, or intervals that all include 0 (then `larger` names what
  may). Empty where no compared pair of methods ran."""
  import pandas as pd
  df = pd.DataFrame(rows)
  if df.empty or "average_precision" not in df:
    return ""
  df = df.assign(label=paired.labels(df, "method", ["lam"]))
  pairs = [(a, b) for a, b in PANDEMIC_COMPARED if {a, b} <= set(df.label)]
  if not pairs:
    return ""
  positives = ", ".join(f"{p:g}" for p in sorted(set(df.positives.dropna())))
  seeds = df.seed.nunique()
  if seeds < 2:
    return (f"One seed, so no interval: these rows cannot tell methods apart "
            f"(held-out positives: {positives}). Give --seeds=0,1,2 to compare them.")
  group = [c for c in _PANDEMIC_SETTINGS if c in df and df[c].nunique() > 1]  # NaN: none
  table = paired.differences(df, pairs, label="label", cell=["seed"],
                             group=group or ["sigma"], value="average_precision",
                             metric="average_precision")
  text = paired.to_markdown(table, "average_precision")
  if (table.verdict == "not resolved").all():
    text += (f"\nNo pair of methods is told apart over {seeds} seeds (held-out "
             f"positives: {positives}): this setting is too small to compare methods; "
             f"{larger} may (benchmarks/RESULTS.md, Pandemic forecasting).\n")
  return text


def inversion_summary(df):
  """`benchmarks.attacks` inversion rows: medians over images per method and
  defense setting."""
  return (df.groupby(["method", "defense", "parameter"], sort=False)
          .agg(psnr=("psnr", "median"), ssim=("ssim", "median"),
               label_accuracy=("label_correct", "mean"), images=("image", "count"),
               epsilon=("epsilon", "first"), leakage=("leakage", "first"))
          .reset_index())
