"""Every figure the binaries draw (no flags: the binaries pass what a figure needs).

Conventions (issue 29): a numeric log epsilon axis with the non-private point set
apart; one y per panel where scales differ; a log y where values span decades;
chance and noiseless reference lines where they frame the result; legends that
say what a band is.
"""

from __future__ import annotations

import io
import math
import os

import numpy as np

from benchmarks.tables import epsilon_label, signal_to_noise


def _pyplot():
  """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(fig, path: str, dpi: int = 120, tight: bool = False) -> None:
  """Writes `fig` to `path` (`tight`: grown to hold a legend beside the axes)
  atomically (`common.write_atomically`: a full disk left a 0-byte PNG; now the
  old file or none, and a one-line error naming `path`)."""
  from benchmarks import common
  plt = _pyplot()
  buffer = io.BytesIO()
  extension = os.path.splitext(path)[1].lstrip(".").lower() or "png"
  try:
    fig.savefig(buffer, format=extension, dpi=dpi, bbox_inches="tight" if tight else None)
  finally:
    plt.close(fig)
  common.write_atomically(path, buffer.getvalue())


def _chance_line(ax, value: float | None, label: str | None = None) -> None:
  """A random guess's value as a dotted line (nothing for None)."""
  if value is not None:
    ax.axhline(value, ls=":", color="grey", label=label or f"chance ({value:.3g})")


# --- benchmarks.compare ---------------------------------------------------------------

def _against_epsilon(ax, selected, column: str, chance: float | None = None) -> None:
  """`column` of the selected rows against epsilon, one line per method: the mean
  over seeds with a band of one sd, on a log epsilon axis; the non-private cells as
  points set apart on the right (side by side); a log y when the largest value is
  4 or more times the smallest, so that the small ones stay readable; `chance`
  (a random guess's value) dotted."""
  finite = sorted(e for e in selected.epsilon.unique() if math.isfinite(e))
  apart = (finite[-1] if finite else 1.0) * 3   # where the non-private points go
  for i, (method, rows) in enumerate(selected.groupby("method", sort=False)):
    stats = rows.groupby("epsilon")[column].agg(["mean", "std"]).fillna(0.0)
    private = stats[np.isfinite(stats.index)]
    color = f"C{i}"
    ax.plot(private.index, private["mean"], marker="o", color=color, label=method)
    ax.fill_between(private.index, private["mean"] - private["std"],
                    private["mean"] + private["std"], color=color, alpha=0.2, lw=0)
    if np.isinf(stats.index).any():
      point = stats.loc[np.inf]
      ax.errorbar([apart * 1.06 ** i], [point["mean"]], yerr=[point["std"]], marker="s",
                  color=color, capsize=3, ls="none")
  ax.set_xscale("log")
  ticks = finite + ([apart] if np.isinf(selected.epsilon).any() else [])
  ax.set_xticks(ticks, [f"{e:g}" for e in finite]
                + (["non-private"] if len(ticks) > len(finite) else []))
  ax.minorticks_off()
  if len(ticks) > len(finite):
    ax.axvline((finite[-1] * apart) ** 0.5 if finite else apart / 2, color="grey",
               ls=":", lw=0.8)
  values = selected[column][np.isfinite(selected[column])]
  if len(values) and values.min() > 0 and values.max() >= 4 * values.min():
    from matplotlib import ticker
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
      axis(ticker.FormatStrFormatter("%g"))   # 0.03, not 3 x 10^-2
  _chance_line(ax, chance)
  ax.set_xlabel("per-silo epsilon (log scale)")
  ax.legend(title=f"mean, band: sd over {selected.seed.nunique()} seeds",
            title_fontsize=7, fontsize=7)


def privacy_utility(selected, title: str, path: str, chance: float | None = None,
                    tuned: bool = True) -> None:
  """`benchmarks.compare`: the selected models' test metric against epsilon;
  `chance` (the accuracy of a uniform guess) dotted; `tuned` False: every method
  ran one configuration."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  _against_epsilon(ax, selected, "test_metric", chance)
  ax.set_ylabel(f"test {selected.metric.iloc[0]}"
                + (" (tuned on validation)" if tuned else ""))
  ax.set_title(title, fontsize=9)
  fig.tight_layout()
  _save(fig, path)


def leakage(selected, title: str, path: str) -> None:
  """`benchmarks.compare --membership`: the selected models' membership inference
  AUC against epsilon, chance (0.5) dotted."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  _against_epsilon(ax, selected[selected.mia_auc.notna()], "mia_auc", chance=0.5)
  ax.set_ylabel("membership inference AUC (pooled; chance 0.5)")
  ax.set_title(title, fontsize=9)
  fig.tight_layout()
  _save(fig, path)


def lambda_panels(lam_rows, selected, path: str, *, every_trial: bool,
                  chance: float | None = None) -> None:
  """`benchmarks.compare`: the test metric against lambda, one panel (and y) per
  epsilon, the untuned methods' means dashed, `chance` dotted. `every_trial` (free
  tuning): `lam_rows` are trials, drawn per (method, lambda, seed) at the best
  validation score as a mean with an sd band; otherwise the selected models alone,
  at the lambda each selected."""
  from benchmarks import grid
  import seaborn as sns
  plt = _pyplot()
  epsilons = sorted(selected.epsilon.unique())
  metric = selected.metric.iloc[0]
  columns = min(4, len(epsilons))
  rows = -(-len(epsilons) // columns)
  fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.2 * rows),
                           squeeze=False)
  for ax in axes.flat[len(epsilons):]:
    ax.set_visible(False)
  for ax, epsilon in zip(axes.flat, epsilons):
    part = lam_rows[lam_rows.epsilon == epsilon]
    if not every_trial:
      sns.scatterplot(data=part, x="lam", y="test_metric", hue="method", ax=ax,
                      legend=ax is axes.flat[0])
    else:
      best = part.loc[grid.score(part).groupby([part.method, part.lam,
                                                part.seed]).idxmin()]
      best = best[np.isfinite(best.test_metric)]
      sns.lineplot(data=best, x="lam", y="test_metric", hue="method", marker="o",
                   errorbar="sd", ax=ax, legend=ax is axes.flat[0])
    for other, color in (("local", "black"), ("fedavg", "grey")):   # not a hue's
      line = selected[(selected.method == other) & (selected.epsilon == epsilon)]
      if len(line):
        ax.axhline(line.test_metric.mean(), ls="--", color=color, label=other)
    _chance_line(ax, chance)
    ax.set_xscale("log")
    ax.set_title(epsilon_label(epsilon, "epsilon"), fontsize=9)
    ax.set_xlabel("lambda" if every_trial else "lambda selected (each seed)")
    ax.set_ylabel(f"test {metric}")
  # one legend for every panel, beside them (inside one it hides curves)
  handles, labels = axes[0][0].get_legend_handles_labels()
  if axes[0][0].get_legend() is not None:
    axes[0][0].get_legend().remove()
  fig.tight_layout()
  fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
             fontsize=8, title_fontsize=7, title=(
                 f"band: sd over\n{lam_rows.seed.nunique()} seeds;\ndashed: untuned\n"
                 "methods' mean" if every_trial else "dashed: untuned\nmethods' mean"))
  _save(fig, path, tight=True)


# --- benchmarks.summarize ---------------------------------------------------------------

def against_setting(selected, column: str, path: str,
                    chance: float | None = None) -> None:
  """`benchmarks.summarize` of several `benchmarks.compare` runs: the selected
  models' test metric against a data setting they differ in (`column`, thesis Fig.
  1.6's mask probability), one line per method with a band of one sd over seeds, one
  panel per epsilon; `chance` dotted."""
  plt = _pyplot()
  epsilons = sorted(selected.epsilon.unique())
  fig, axes = plt.subplots(1, len(epsilons), figsize=(3.6 * len(epsilons) + 1.6, 3.8),
                           squeeze=False)
  for ax, epsilon in zip(axes[0], epsilons):
    cell = selected[selected.epsilon == epsilon]
    for i, (method, rows) in enumerate(cell.groupby("method", sort=False)):
      stats = rows.groupby(column)["test_metric"].agg(["mean", "std"]).fillna(0.0)
      ax.plot(stats.index, stats["mean"], marker="o", color=f"C{i}", label=method)
      ax.fill_between(stats.index, stats["mean"] - stats["std"],
                      stats["mean"] + stats["std"], color=f"C{i}", alpha=0.2, lw=0)
    _chance_line(ax, chance)
    ax.set_xticks(sorted(cell[column].unique()))
    ax.set_xlabel(column.replace("_", " "))
    ax.set_title(epsilon_label(epsilon, "epsilon"), fontsize=9)
  axes[0][0].set_ylabel(f"test {selected.metric.iloc[0]} (tuned on validation)")
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
             title=f"mean, band: sd\nover {selected.seed.nunique()} seeds",
             title_fontsize=7)
  fig.tight_layout()
  _save(fig, path, tight=True)


def run_summary(df, path: str) -> None:
  """`benchmarks.summarize`: the test metric of `benchmarks.run` rows per method
  (and lambda; d-private clustering per nu, unsanitized first), mean +- sd over
  seeds."""
  import seaborn as sns
  plt = _pyplot()
  nus = df.nu if "nu" in df else [math.nan] * len(df)

  def label(algorithm, lam, nu):
    if algorithm in ("mrmtl", "ditto"):
      return f"{algorithm} (lam={lam:g})"
    if algorithm == "dprivate_clustering":
      return f"{algorithm} (nu={'none' if math.isnan(nu) else f'{nu:g}'})"
    return algorithm

  df = df.assign(method=[label(*v) for v in zip(df.algorithm, df.lam, nus)],
                 order=[-1.0 if math.isnan(nu) else nu for nu in nus])
  fig, ax = plt.subplots()
  sns.pointplot(data=df, x="method", y="test_metric", errorbar="sd",
                order=list(dict.fromkeys(df.sort_values("order", kind="stable").method)),
                linestyles="none", capsize=0.2, ax=ax)
  ax.set_ylabel(f"test {df.metric.iloc[0]} (mean +- sd over seeds)")
  ax.tick_params(axis="x", rotation=30)
  fig.tight_layout()
  _save(fig, path)


# --- benchmarks.tuning_cost -----------------------------------------------------------

def tuning_cost(rows, summary, title: str, path: str) -> None:
  """E(lambda) per condition; at the right, the error tuning reaches under each
  (x) beside the untuned baselines at the one-release noise (local: one line;
  FedAvg, near it here: its own)."""
  import pandas as pd
  import seaborn as sns
  plt = _pyplot()
  df = pd.DataFrame(rows)
  df = df[df.lam > 0]
  conditions = list(dict.fromkeys(df.condition))
  colors = dict(zip(conditions, sns.color_palette("viridis", len(conditions))))
  fig, ax = plt.subplots(figsize=(8.5, 4.5))
  sns.lineplot(data=df, x="lam", y="error", hue="condition", ax=ax, palette=colors,
               linewidth=1.3)
  right = df.lam.max() * 3
  for entry in summary:
    if np.isfinite(entry["tuned_error"]):
      ax.plot([right], [entry["tuned_error"]], marker="x", ms=8, mew=2, ls="none",
              color=colors[entry["condition"]])
  ax.plot([], [], marker="x", ls="none", color="grey",
          label="after tuning (oracle score), per condition")
  private = next(s for s in summary if s["condition"] == "private")
  ax.axhline(private["local_error"], ls="--", color="black", lw=1,
             label=f"local, untuned ({private['local_error']:.4f})")
  ax.axhline(private["fedavg_error"], ls=":", color="firebrick", lw=1.5,
             label=f"FedAvg, untuned ({private['fedavg_error']:.4f})")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("lambda")
  ax.set_ylabel("MR-MTL error E(lambda)")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
  fig.tight_layout()
  _save(fig, path)


# --- benchmarks.audit -------------------------------------------------------------------

def audit(df, title: str, path: str) -> None:
  """Per method, the epsilon a run reports (bar) and the lower bound the audit
  proves (dot; one per mutation, the honest run's filled): a dot above its bar
  refutes the report."""
  plt = _pyplot()
  methods = list(dict.fromkeys(df.method))
  fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(methods), 4))
  x = np.arange(len(methods))
  honest = df[df.mutation == "none"].set_index("method")
  ax.bar(x, [honest.epsilon_reported.get(m, np.nan) for m in methods], width=0.6,
         color="lightgrey", edgecolor="black", label="reported (ledgers)")
  markers = dict(none="o", noise_div4="v", rate_x2="s")
  for mutation, part in df.groupby("mutation", sort=False):
    part = part.set_index("method")
    ax.plot(x, [part.epsilon_lower.get(m, np.nan) for m in methods],
            marker=markers.get(mutation, "x"), ls="none", ms=8,
            mfc="black" if mutation == "none" else "none", mec="black",
            label=("audited lower bound" if mutation == "none"
                   else f"audited, mutation {mutation} (reported as honest)"))
  ax.set_xticks(x, methods)
  ax.set_ylabel("epsilon")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  _save(fig, path)


# --- benchmarks.hypernet ----------------------------------------------------------------

def hypernet_accuracy(df, *, delta: float, num_classes: int, majority: float,
                      path: str) -> None:
  """Mean user accuracy against epsilon (left) and against the round's
  signal-to-noise bound (right): the clipped mean's largest norm S over the noise's
  norm sigma sqrt(P) (sigma per coordinate, P the hypernetwork's parameters), which
  is q W / (z sqrt(P)) without a weight cap. Colour S, or P where S is one value;
  marker z (left) or the expected users a round q N (right), size q (left); runs
  without noise dashed; chance (one class in `num_classes`) and `majority`
  (predicting each user's most frequent class) dotted."""
  import pandas as pd
  import seaborn as sns
  plt = _pyplot()
  if "hypernet_parameters" not in df:   # FedAvg's rows alone
    df = df.assign(hypernet_parameters=np.nan)
  private = df[np.isfinite(df.epsilon)]
  private = private.assign(
      S=private.l2_norm_clip.astype(str), z=private.noise_multiplier.map(
          lambda z: f"{z:g}"),
      q=private.sampling_rate,
      P=private.hypernet_parameters.map(lambda p: f"{int(p):,}"),
      users=(private.sampling_rate * private.num_users).map(lambda u: f"{u:.3g}"),
      snr=signal_to_noise(private))
  colour = "S" if private.S.nunique() > 1 or private.P.nunique() < 2 else "P"
  fig, axes = plt.subplots(1, 2, figsize=(17, 4.8))
  if len(private):
    sns.scatterplot(data=private, x="epsilon", y="mean_user_accuracy", hue=colour,
                    style="z", size="q", sizes=(30, 120), ax=axes[0])
    sns.scatterplot(data=private, x="snr", y="mean_user_accuracy", hue=colour,
                    style="users", s=70, ax=axes[1])
    for ax in axes:
      ax.set_xscale("log")
  for i, (label, part) in enumerate(df[~np.isfinite(df.epsilon)].groupby(
      ["algorithm", "sampling_rate", "l2_norm_clip", "hypernet_parameters"],
      dropna=False, sort=False)):
    size = f", P={int(label[3]):,}" if np.isfinite(label[3]) else ""
    clip = "none" if pd.isna(label[2]) else f"{label[2]:g}"
    for ax in axes:
      ax.axhline(part.mean_user_accuracy.mean(), ls="--", color=f"C{i + 3}",
                 label=f"{label[0]} (no noise, q={label[1]}, S={clip}{size})")
  for ax in axes:
    _chance_line(ax, 1 / num_classes, f"chance (1/{num_classes})")
    ax.axhline(majority, ls=":", color="black",
               label=f"each user's most frequent class ({majority:.3f}; labels "
               "read without noise)")
    ax.set_ylabel("mean accuracy over users")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
  axes[0].set_xlabel(f"user-level epsilon at delta={delta:g} (covers phi and the "
                     "noised aggregates)")
  axes[1].set_xlabel("signal-to-noise bound of a round: S / (sigma sqrt(P))")
  fig.suptitle("accuracies: each user's own model, from its un-noised embedding "
               "(outside the user-level guarantee)", fontsize=8)
  fig.tight_layout()
  _save(fig, path)


# --- benchmarks.pandemic ----------------------------------------------------------------

def pandemic_ap(df, curve_columns, title: str, path: str) -> None:
  """AP against the node-level epsilon: one curve per setting (the columns of
  `curve_columns` that vary among private rows), the mean over seeds with a band
  of one sd; its non-private rows' mean dashed (band likewise); the positive rate
  (a random forecaster's AP) dotted. A mode other than `honest` has no guarantee
  (an uncapped degree, shuffled batches): its curves say so."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4))
  private = np.isfinite(df.epsilon_theorem)
  varying = [c for c in curve_columns if df.loc[private, c].nunique() > 1] or ["method"]
  for setting, part in df[private].groupby(varying if len(varying) > 1 else varying[0]):
    setting = setting if isinstance(setting, tuple) else (setting,)
    label = ", ".join(str(v) if c == "method" else f"{c} {v}"
                      for c, v in zip(varying, setting))
    if (part["mode"] != "honest").any():
      label += " (epsilon not a guarantee)"
    curve = part.groupby("epsilon_theorem").average_precision.agg(["mean", "std"])
    curve = curve.fillna(0.0)
    line, = ax.plot(curve.index, curve["mean"], "o-", label=label)
    ax.fill_between(curve.index, curve["mean"] - curve["std"],
                    curve["mean"] + curve["std"], color=line.get_color(), alpha=0.2,
                    lw=0)
    match = df[df.sigma == 0]
    for c, v in zip(varying, setting):
      match = match[match[c] == v]
    if len(match):
      mean, sd = match.average_precision.mean(), match.average_precision.std()
      ax.axhline(mean, ls="--", lw=0.8, color=line.get_color(), label=f"{label}, no DP")
      if np.isfinite(sd):
        ax.axhspan(mean - sd, mean + sd, color=line.get_color(), alpha=0.08, lw=0)
  if "positive_rate" in df and df.positive_rate.notna().any():
    ax.axhline(df.positive_rate.mean(), ls=":", color="grey",
               label="positive rate (a random forecaster)")
  ax.set_xscale("log")
  ax.set_xlabel("node-level epsilon (replace one node of the capped graph, Theorem "
                "2.4.4's exponent), delta = 1/(10 n)", fontsize=8)
  ax.set_ylabel("average precision (held-out households, pooled)")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=6, title=f"mean, band: sd over {df.seed.nunique()} seeds",
            title_fontsize=6)
  fig.tight_layout()
  _save(fig, path)


def pandemic_degree(df, title: str, path: str) -> None:
  """Fig. 2.8: node-level epsilon against S, the examples a node lies in (log-log),
  one curve per sigma; a panel per exponent (`node_level.EXPONENT_LABEL`), one y
  scale for both. An epsilon beyond 1e4 is off the axis (the lowest order's
  bound: no guarantee worth the name)."""
  from tff_silo.privacy.node_level import EXPONENT_LABEL
  plt = _pyplot()
  panels = list(EXPONENT_LABEL)
  fig, axes = plt.subplots(1, len(panels), figsize=(10, 4), sharey=True)
  for ax, rel in zip(axes, panels):
    for i, (sigma, part) in enumerate(df[df.neighbouring == rel].groupby("sigma")):
      part = part[part.epsilon <= 1e4].sort_values("max_neighbourhoods")
      ax.plot(part.max_neighbourhoods, part.epsilon, "o-", ms=3, color=f"C{i}",
              label=f"sigma {sigma:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("S: the examples one node lies in (S1 + 1 under a cap of S1)")
    ax.set_title(EXPONENT_LABEL[rel], fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
  axes[0].set_ylabel("node-level epsilon (values above 1e4 not drawn)")
  axes[0].legend(fontsize=7, title="one curve per sigma (exact, no seeds)",
                 title_fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  _save(fig, path)


def pandemic_gradient_norms(batch, norms, clip: float, title: str, path: str) -> None:
  """Fig. 2.9: per-example gradient norms of one batch by position, positives
  marked (left); every training example's norm by label, at the initial and the
  trained model (right, log x); lines at clip / 5 and clip. `batch`: frame of
  norm, label; `norms`: frame of model, label, norm."""
  plt = _pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  left.plot(np.arange(len(batch)), batch.norm, lw=0.8, color="C0",
            label="one batch, trained model")
  hit = batch.label > 0
  left.plot(np.flatnonzero(hit), batch.norm[hit], "o", color="C3",
            label=f"its {int(hit.sum())} positive(s)")
  left.set_xlabel("example in the batch")
  left.set_ylabel("per-example gradient L2 norm")
  bins = np.logspace(np.log10(max(norms.norm.min(), 1e-6)), np.log10(norms.norm.max()), 60)
  for i, ((model, label), part) in enumerate(norms.groupby(["model", "label"])):
    right.hist(part.norm, bins=bins, histtype="step", density=True, color=f"C{i}",
               label=f"{model} model, {'positives' if label else 'negatives'} "
               f"({len(part):,})")
  right.set_xscale("log")
  right.set_yscale("log")
  right.set_xlabel("per-example gradient L2 norm (all training examples)")
  right.set_ylabel("density")
  for ax in (left, right):
    for value, style, name in ((clip / 5, ":", f"C / 5 = {clip / 5:g}"),
                               (clip, "--", f"C = {clip:g}")):
      (ax.axhline if ax is left else ax.axvline)(value, color="k", ls=style, lw=0.8,
                                                  label=name)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  _save(fig, path)


def pandemic_time(timed, path: str) -> None:
  """Load + train seconds and peak memory against persons, median per method."""
  plt = _pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
  for method, part in timed.groupby("method"):
    part = part.groupby("persons")[["load", "train_seconds", "memory"]].median()
    line, = left.plot(part.index, part.load + part.train_seconds, "o-",
                      label=f"{method}: load + train")
    left.plot(part.index, part.train_seconds, "x:", color=line.get_color(),
              label=f"{method}: train")
    right.plot(part.index, part.memory, "o-", color=line.get_color(), label=method)
  for ax, label in ((left, "seconds (median)"), (right, "peak memory of the process, GB")):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("persons")
    ax.set_ylabel(label)
    ax.legend(fontsize=7)
  fig.tight_layout()
  _save(fig, path)


# --- benchmarks.attacks -----------------------------------------------------------------

def _setting_label(defense: str, value: float) -> str:
  return {"none": "no defense", "laplace": f"Laplace nu={value:g}",
          "dp_sgd": f"DP-SGD z={value:g}", "clip": f"clip C={value:g}"}[defense]


def _reconstructions(df, defense, value, shown):
  rows = df[(df.defense == defense) & (df.parameter == value)]
  images = [None] * shown
  for _, row in rows[rows.image < shown].iterrows():
    batch = np.load(row["images_file"])
    images[int(row["image"])] = batch[int(row["image"]) % len(batch)]
  return images


def reconstruction_grid(df, x, y, shown: int, title: str, path: str) -> None:
  """Ground truth (top row) and each defense setting's reconstructions of the
  first `shown` images (read from the rows' `images_file`)."""
  plt = _pyplot()
  shown = min(shown, len(y))
  settings = df.drop_duplicates(["defense", "parameter"])[["defense", "parameter"]]
  fig, axes = plt.subplots(len(settings) + 1, shown, squeeze=False,
                           figsize=(1.1 * shown + 1.6, 1.1 * (len(settings) + 1)))
  rows = [("ground truth", x)] + [
      (_setting_label(d, v), _reconstructions(df, d, v, shown))
      for d, v in settings.itertuples(index=False)]
  for r, (label, images) in enumerate(rows):
    for c in range(shown):
      ax = axes[r, c]
      if images[c] is not None:
        image = np.clip(images[c], 0, 1)
        ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray",
                  vmin=0, vmax=1)
      ax.set_xticks([]), ax.set_yticks([])
      if c == 0:
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
      if r == 0:
        ax.set_title(f"label {y[c]}", fontsize=8)
  fig.suptitle(title)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))
  _save(fig, path, dpi=60)


def inversion_curves(df, path: str) -> bool:
  """Median PSNR and SSIM (interquartile band) against nu and against z, the
  undefended medians dotted; False (nothing drawn) without either sweep."""
  import seaborn as sns
  plt = _pyplot()
  sweeps = [(d, t) for d, t in (("laplace", "Euclidean Laplace nu"),
                                ("dp_sgd", "DP-SGD noise multiplier z"))
            if (df.defense == d).any()]
  if not sweeps:
    return False
  fig, axes = plt.subplots(2, len(sweeps), squeeze=False, figsize=(5 * len(sweeps), 7))
  baseline = df[df.defense == "none"].groupby("method")[["psnr", "ssim"]].median()
  for c, (defense, title) in enumerate(sweeps):
    for r, metric in enumerate(("psnr", "ssim")):
      ax = axes[r, c]
      sns.lineplot(data=df[df.defense == defense], x="parameter", y=metric,
                   hue="method", estimator="median", errorbar=("pi", 50), marker="o",
                   ax=ax)
      for value in baseline[metric]:
        ax.axhline(value, ls=":", color="gray")
      ax.set_xscale("log")
      ax.set_xlabel(title)
      ax.set_ylabel(metric.upper() + (" (dB)" if metric == "psnr" else ""))
  fig.suptitle("Reconstruction quality vs noise (median, IQR; dotted: no defense)")
  fig.tight_layout()
  _save(fig, path, dpi=100)
  return True
