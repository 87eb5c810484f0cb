"""`benchmarks.paired`: paired differences of methods with confidence intervals, and
`benchmarks.summarize --paired` on run and compare CSVs."""

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks import paired
from tests import binaries


def test_the_t_interval_is_students_and_covers_at_its_level():
  """d = 1, 2, 3: mean 2, sd 1, t_{0.975, 2} = 4.302653 (tables); and over 4,000
  samples of 5 normal differences the interval holds the true mean in 95% of them
  (within 3 binomial standard errors)."""
  low, high = paired.interval([1.0, 2.0, 3.0])
  half = 4.302652729911275 / math.sqrt(3)
  assert (low, high) == pytest.approx((2 - half, 2 + half), rel=1e-9)
  assert all(math.isnan(v) for v in paired.interval([1.0]))
  rng = np.random.default_rng(7)
  samples = rng.normal(0.3, 2.0, size=(4000, 5))
  held = [low <= 0.3 <= high for low, high in map(paired.interval, samples)]
  assert abs(np.mean(held) - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 4000)
  with pytest.raises(ValueError, match="method must be one of"):
    paired.interval([1.0, 2.0], method="normal")


def test_the_bootstrap_interval_is_reproducible_and_brackets_the_mean():
  d = np.random.default_rng(3).normal(1.0, 0.5, size=12)
  first = paired.interval(d, method="bootstrap")
  assert first == paired.interval(d, method="bootstrap")
  assert first[0] < d.mean() < first[1]
  assert first[1] - first[0] < 2 * (paired.interval(d)[1] - d.mean())   # not wider
  # than about the t interval: same data, same level


def _rows(metric="mse"):
  """Two epsilons x 4 seeds; a beats b by 0.1 at epsilon 1 everywhere, and at
  epsilon 2 by +-0.05 (no difference); c only at seed 0; one row of b missing."""
  rows = []
  for epsilon in (1.0, 2.0):
    for seed in range(4):
      base = 1.0 + seed
      rows.append(dict(method="b", epsilon=epsilon, seed=seed, test_metric=base))
      gap = -0.1 if epsilon == 1.0 else (0.05 if seed % 2 else -0.05)
      rows.append(dict(method="a", epsilon=epsilon, seed=seed, test_metric=base + gap))
  rows.append(dict(method="c", epsilon=1.0, seed=0, test_metric=0.0))
  rows = [r for r in rows if not (r["method"] == "b" and r["epsilon"] == 2.0
                                  and r["seed"] == 3)]
  frame = pd.DataFrame(rows)
  if metric == "accuracy":
    frame = frame.assign(test_metric=-frame.test_metric)
  return frame


def test_differences_pair_cells_holding_both_with_the_metrics_direction():
  table = paired.differences(_rows(), [("a", "b"), ("a", "c")], label="method",
                             cell=["seed"], group=["epsilon"], metric="mse")
  ab = table[table.b == "b"].set_index("epsilon")
  assert list(ab.pairs) == [4, 3, 7]   # epsilon 1, 2, all: b's missing row dropped
  assert ab.loc[1.0, "mean_difference"] == pytest.approx(-0.1)
  assert ab.loc[1.0, "a_better"] == 4 and ab.loc[1.0, "verdict"] == "a better"
  assert ab.loc[2.0, "verdict"] == "not resolved"   # -0.05, +0.05, -0.05
  ac = table[table.b == "c"]
  assert list(ac.pairs) == [1, 1] and math.isnan(ac.ci_low.iloc[0])
  # accuracy: higher is better, the same gaps turned around
  flipped = paired.differences(_rows("accuracy"), [("a", "b")], label="method",
                               cell=["seed"], group=["epsilon"], metric="accuracy")
  first = flipped.set_index("epsilon").loc[1.0]
  assert first.mean_difference == pytest.approx(0.1) and first.verdict == "a better"
  reversed_ = paired.differences(_rows(), [("b", "a")], label="method", cell=["seed"],
                                 group=["epsilon"], metric="mse")
  assert reversed_.set_index("epsilon").loc[1.0, "verdict"] == "b better"


def test_a_cell_with_two_rows_of_a_method_is_an_error_not_an_average():
  rows = pd.concat([_rows(), _rows().iloc[:1]])
  with pytest.raises(ValueError, match="more than one row in a cell"):
    paired.differences(rows, [("a", "b")], label="method", cell=["seed"],
                       group=["epsilon"])


@pytest.mark.cli
def test_summarize_prints_the_paired_table_of_a_run_csv(tmp_path):
  """A run CSV's algorithms (one with two lambdas, labelled by lambda) paired by
  seed within epsilon and a setting that varies; a pair the CSV lacks ends in one
  line."""
  rows = []
  for seed in range(3):
    for algorithm, lam, value in (("fedavg", 0.0, 1.0), ("mrmtl", 0.1, 0.9),
                                  ("mrmtl", 1.0, 1.2)):
      for split, worse in ((0.2, 0.0), (0.8, 0.3 * (algorithm == "mrmtl"))):
        rows.append(dict(dataset="school", algorithm=algorithm, lam=lam, epsilon=2.0,
                         seed=seed, test_metric=value + worse + 0.01 * seed,
                         train_metric=0.0, epsilon_spent_max=2.0, test_fraction=split,
                         noise_multiplier_mean=1.0, wall_seconds=1.0, metric="mse"))
  csv = tmp_path / "run.csv"
  pd.DataFrame(rows).to_csv(csv, index=False)
  done = binaries.run("summarize", str(csv), "--paired=mrmtl lam=0.1:fedavg")
  assert done.returncode == 0, done.stderr
  # a setting that varies (here the test share) is a group of its own
  assert "| mrmtl lam=0.1 | fedavg | 2 | 0.2 | 3 | -0.1000 | [-0.1000, -0.1000] | " \
         "3 of 3 | a better |" in done.stdout
  assert "| mrmtl lam=0.1 | fedavg | 2 | 0.8 | 3 | 0.2000 | [0.2000, 0.2000] | " \
         "0 of 3 | b better |" in done.stdout
  done = binaries.run("summarize", str(csv), "--paired=mrmtl:fedavg")
  assert done.returncode == 2 and done.stderr.strip().splitlines() == [
      "error: --paired: no rows of mrmtl; the CSV has fedavg, mrmtl lam=0.1, "
      "mrmtl lam=1"]


@pytest.mark.cli
def test_a_method_without_a_setting_is_paired_within_each_of_its_values(tmp_path):
  """IFCA at 2 and 4 clusters, selecting every round or in 10% (labels), beside
  FedAvg, which has neither setting: FedAvg's cells pair with each cluster count's,
  not with none (a group of their own)."""
  rows = []
  for seed in range(3):
    rows.append(dict(algorithm="fedavg", test_metric=1.0 + 0.01 * seed))
    for clusters in (2, 4):
      for fraction in (1.0, 0.1):
        rows.append(dict(algorithm="ifca", num_clusters=clusters,
                         selection_fraction=fraction,
                         test_metric=1.0 + 0.01 * seed + 0.1 * clusters * fraction))
    for row in rows[-5:]:
      row.update(dataset="school", lam=0.0, epsilon=1.0, seed=seed, train_metric=0.0,
                 epsilon_spent_max=1.0, noise_multiplier_mean=1.0, wall_seconds=1.0,
                 metric="mse")
  csv = tmp_path / "run.csv"
  pd.DataFrame(rows).to_csv(csv, index=False)
  done = binaries.run("summarize", str(csv), "--paired=ifca selection_fraction=1:fedavg")
  assert done.returncode == 0, done.stderr
  for clusters, gap in ((2, "0.2000"), (4, "0.4000")):
    assert (f"| ifca selection_fraction=1 | fedavg | 1 | {clusters} | 3 | {gap} | "
            f"[{gap}, {gap}] | 0 of 3 | b better |") in done.stdout
  # an empty value of a method that has the setting is a value (no early stopping)
  rows = [dict(row, algorithm="dprivate_clustering", patience=patience,
               test_metric=row["test_metric"] + (0.5 if patience == 6 else 0.0))
          for row in rows if row["algorithm"] == "fedavg" for patience in (6, None)]
  rows += [r for r in pd.read_csv(csv).to_dict("records") if r["algorithm"] == "fedavg"]
  pd.DataFrame(rows).to_csv(csv, index=False)
  done = binaries.run("summarize", str(csv), "--paired=dprivate_clustering:fedavg")
  assert done.returncode == 0, done.stderr
  for patience, gap in (("6", "0.5000"), ("-", "0.0000")):
    assert (f"| dprivate_clustering | fedavg | 1 | {patience} | 3 | {gap} |"
            in done.stdout), done.stdout


@pytest.mark.cli
def test_summarize_reports_compare_runs_apart_by_mask_and_draws_against_it(tmp_path):
  """Two compare runs of one preset at mask probabilities 0 and 0.4 (thesis Fig.
  1.6), in two files: a report and paired table per mask, and --plot draws the
  metric against the mask; rows of one mask have nothing to draw against."""
  paths = []
  for mask in (0.0, 0.4):
    rows = [dict(row_type=kind, preset="digits", method=method, epsilon=4.0, seed=seed,
                 lam=lam, tuning="free", metric="accuracy", mask_probability=mask,
                 test_metric=0.8 - mask * (method == "mrmtl") + 0.01 * seed)
            for kind in ("trial", "selected") for seed in range(3)
            for method, lam in (("local", 0.0), ("mrmtl", 1.0))]
    paths.append(tmp_path / f"mask_{mask}.csv")
    pd.DataFrame(rows).to_csv(paths[-1], index=False)
  figure = tmp_path / "masks.png"
  done = binaries.run("summarize", *map(str, paths), "--paired=mrmtl:local",
                      f"--plot={figure}")
  assert done.returncode == 0, done.stderr
  assert "**mask_probability = 0**" in done.stdout
  assert "**mask_probability = 0.4**" in done.stdout
  assert "| mrmtl | local | 4 | 0 | 3 | 0.0000 | [0.0000, 0.0000] | 0 of 3 | " \
         "not resolved |" in done.stdout
  assert "| mrmtl | local | 4 | 0.4 | 3 | -0.4000 | [-0.4000, -0.4000] | 0 of 3 | " \
         "b better |" in done.stdout
  assert figure.stat().st_size > 0
  done = binaries.run("summarize", str(paths[0]), f"--plot={tmp_path / 'one.png'}")
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
  assert "--plot of benchmarks.compare rows draws" in done.stderr
  assert not (tmp_path / "one.png").exists()
  done = binaries.run("summarize", str(paths[0]), str(paths[0]))   # one run twice
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
  assert ("local at epsilon 4, seed 0 (digits) has more than one selected row: the "
          "CSV(s) hold several compare runs of one cell") in done.stderr, done.stderr


def _pandemic_rows(gaps, seeds=3):
  """Pandemic rows of mrmtl, local and fedavg at sigma 0: fedavg's AP 0.003, the
  others that plus `gaps[method]` times 1 + seed / 10."""
  rows = []
  for seed in range(seeds):
    for method in ("mrmtl", "local", "fedavg"):
      rows.append(dict(method=method, lam=0.0003 if method == "mrmtl" else math.nan,
                       seed=seed, sigma=0.0, clip=math.nan, positives=38,
                       average_precision=0.003 + gaps.get(method, 0) * (1 + seed / 10)))
  return rows


def test_the_pandemic_comparison_says_when_its_rows_cannot_compare_methods():
  from benchmarks import tables
  separated = tables.pandemic_comparison(_pandemic_rows({"mrmtl": 0.01,
                                                         "local": 0.01}), "x")
  assert "| mrmtl | fedavg | 0 | 3 | 0.0110 |" in separated
  assert "| a better |" in separated and "too small" not in separated
  noisy = _pandemic_rows({})
  for row, wobble in zip(noisy, [0.001, -0.001, 0, -0.002, 0.002, 0, 0, 0, 0.0005]):
    row["average_precision"] += wobble
  tied = tables.pandemic_comparison(noisy, "more --seeds")
  assert "not resolved" in tied and "| a better |" not in tied
  assert "| b better |" not in tied
  assert tied.strip().endswith("over 3 seeds (held-out positives: 38): this setting is "
                               "too small to compare methods; more --seeds may "
                               "(benchmarks/RESULTS.md, Pandemic forecasting).")
  one = tables.pandemic_comparison(_pandemic_rows({"mrmtl": 0.01}, seeds=1), "x")
  assert one.startswith("One seed, so no interval")
  alone = [r for r in _pandemic_rows({}) if r["method"] == "mrmtl"]
  assert tables.pandemic_comparison(alone, "x") == ""
  # a run of methods without lambda: the binary's rows hold lam None
  centralized = [dict(r, method="centralized", lam=None) for r in _pandemic_rows({})
                 if r["method"] == "fedavg"]
  assert tables.pandemic_comparison(centralized, "x") == ""


def test_labels_name_the_setting_a_method_ran_several_values_of():
  import pandas as pd
  rows = pd.DataFrame(dict(method=["mrmtl", "mrmtl", "mrmtl", "local", "local"],
                           lam=[0.1, 1.0, None, None, None]))
  assert list(paired.labels(rows, "method", ["lam", "lr"])) == [
      "mrmtl lam=0.1", "mrmtl lam=1", "mrmtl lam=none", "local", "local"]
