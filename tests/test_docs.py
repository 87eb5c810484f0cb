"""The numbers the README quotes come from what the commands print now (issue 54,
item 4: docs that cannot go stale)."""

import json
import os
import re

import pytest

from benchmarks import fidelity
from tests import binaries

README = os.path.join(binaries.ROOT, "README.md")


def _readme() -> str:
  with open(README) as f:
    return " ".join(f.read().split())   # line breaks as spaces


@pytest.mark.cli
@pytest.mark.slow
def test_the_readme_quotes_what_the_main_job_prints(tmp_path):
  done = binaries.run("compare", f"--output_dir={tmp_path}")
  assert done.returncode == 0, done.stderr[-2000:]
  beats = re.search(r"mrmtl beats fedavg in (\d+) of (\d+), local in (\d+) of (\d+)",
                    done.stdout)
  means = dict(re.findall(r"^\| (local|mrmtl) \| ([\d.]+) \+-", done.stdout, re.M))
  fedavg, cells, local, _ = beats.groups()
  gain = round(100 * (1 - float(means["mrmtl"]) / float(means["local"])))
  readme = _readme()
  assert (f"MR-MTL beats FedAvg in {fedavg} of {cells} private cells and local "
          f"training in {local} of {cells} (by {gain}% at epsilon 2: "
          f"{means['mrmtl']} against {means['local']} MSE)") in readme
  assert f"quick preset: {fedavg}/{cells} and {local}/{cells} private cells" in readme
  for other in ("local", "fedavg"):   # the paired table's line over all cells
    difference, low, high = re.search(
        rf"^\| mrmtl \| {other} \| all \| {cells} \| (\S+) \| \[(\S+), (\S+)\]",
        done.stdout, re.M).groups()
    name = {"local": "local", "fedavg": "FedAvg"}[other]
    assert re.search(rf"to {name} (is )?{difference}( MSE)? \[{low}, {high}\]", readme)


RESULTS = os.path.join(binaries.ROOT, "benchmarks", "RESULTS.md")
_DECIMAL = re.compile(r"\d+\.\d+(?:e-?\d+)?|\d+e-\d+")


def _table_rows(text: str, header: str) -> list:
  """The body rows of the markdown table in `text` whose header line starts with
  `header` (up to the blank line after it)."""
  table = text[text.index(header):]
  return table.split("\n\n")[0].splitlines()[2:]


def _recorded(number: str, text: str) -> bool:
  """Whether `text` holds `number`, as written or rounded from more digits."""
  if "e" in number:
    return number in text
  import decimal
  step = decimal.Decimal(1).scaleb(-len(number.split(".")[1]))   # its last digit
  return any(decimal.Decimal(found).quantize(step, decimal.ROUND_HALF_UP)
             == decimal.Decimal(number)
             for found in _DECIMAL.findall(text)
             if "e" not in found and decimal.Decimal(found).as_tuple().exponent
             <= step.as_tuple().exponent)


def test_the_findings_table_quotes_the_recorded_results():
  """Every decimal the README's findings table quotes is in the sections of
  `benchmarks/RESULTS.md` its row cites (as written, or rounded from a number with
  more digits there), and every cited section exists."""
  with open(README) as f:
    readme = f.read()
  with open(RESULTS) as f:
    results = f.read()
  rows = _table_rows(readme, "| finding | numbers | where |")
  assert len(rows) >= 8
  for row in rows:
    _, _, numbers, where, _ = row.split("|")
    cited = re.findall(r'"([^"]+)"', where)
    text = "".join(fidelity.sections(results, title) for title in cited)
    for title in cited:
      assert fidelity.sections(results, title), f"RESULTS.md has no section {title!r}"
    missing = [n for n in _DECIMAL.findall(numbers) if not _recorded(n, text)]
    assert not missing, (cited, missing)


def test_the_private_tuning_numbers_are_the_recorded_runs():
  """The README's numbers for `--tuning=private` (each run draws new plans, so no
  command reprints them) are those RESULTS.md records for the quick preset."""
  readme = _readme()
  with open(RESULTS) as f:
    harness = fidelity.sections(f.read(), "The comparison harness")
  quoted = readme[readme.index("Paying for it"):readme.index("sec. 1.7")]
  numbers = _DECIMAL.findall(quoted)
  assert len(numbers) >= 4
  assert all(_recorded(n, harness) for n in numbers), numbers


def _committed(name: str) -> str:
  """A rows file committed under benchmarks/results/."""
  return os.path.join(binaries.ROOT, "benchmarks", "results", name)


def _section(title: str) -> str:
  with open(RESULTS) as f:
    return fidelity.sections(f.read(), title)


def _paired_by_summarize(rows: str, pairs: str, title: str) -> tuple:
  """(what `summarize --paired` prints for committed `rows`, RESULTS.md's section
  `title`)."""
  done = binaries.run("summarize", _committed(rows), f"--paired={pairs}")
  assert done.returncode == 0, done.stderr
  return done.stdout, _section(title)


@pytest.mark.cli
def test_the_school_attribution_intervals_come_from_the_committed_rows():
  """Each paired interval RESULTS.md gives for School's gap is what `summarize`
  computes from the rows committed under benchmarks/results/."""
  printed, section = _paired_by_summarize(
      "school_attribution.csv.gz",
      "mrmtl lam=1 lr=0.01:fedavg lr=0.01,mrmtl lam=3 lr=0.03:fedavg lr=0.1",
      "School: what closes FedAvg's gap")
  quoted = re.findall(r"^\| (per silo|public ranges) \| [^|]+ \| (-\d\.\d+) \| "
                      r"(\[[^]]+\]) \| (\d) of 5 \|$", section, re.M)
  assert len(quoted) == 3
  features = {"per silo": "silo", "public ranges": "public"}
  for name, mean, interval, better in quoted:
    assert re.search(rf"\| 6 \| {features[name]} \| 5 \| {mean} \| {re.escape(interval)}"
                     rf" \| {better} of 5 \|", printed), (name, mean, interval)


def test_the_pandemic_comparison_in_results_is_the_committed_rows():
  """The paired table RESULTS.md shows for the pandemic binary's own comparison is
  what `tables.pandemic_comparison` prints for the rows committed beside it."""
  import pandas as pd
  from benchmarks import tables
  rows = pd.read_csv(_committed("pandemic_small_regions.csv.gz"))
  printed = tables.pandemic_comparison(rows.to_dict("records"), "x")
  section = _section("The binary's own comparison")
  lines = [l for l in printed.splitlines() if l.startswith("| m") or
           l.startswith("| l")]
  assert len(lines) == 9 and all(l in section for l in lines)


# The pairs RESULTS.md's pandemic tables at 3 seeds compare (Tables 2.2, 2.4, 2.5):
# a row's label is its loss, architecture, feature set and S1.
_FULL = "node+contact+location"
PANDEMIC_TABLE_PAIRS = [
    (f"focal 0.75 logistic {_FULL} S1=20", f"bce logistic {_FULL} S1=20"),
    (f"focal 0.75 logistic {_FULL} S1=20", f"focal 0.5 logistic {_FULL} S1=20"),
    (f"bce logistic {_FULL} S1=20", f"focal 0.25 logistic {_FULL} S1=20"),
    (f"focal 0.75 logistic {_FULL} S1=20", f"focal 0.75 mlp {_FULL} S1=20"),
    ("focal 0.75 logistic self S1=20", "focal 0.75 mlp self S1=20"),
    (f"focal 0.75 logistic {_FULL} S1=20", f"focal 0.75 logistic {_FULL} S1=15"),
    (f"focal 0.75 logistic {_FULL} S1=30", f"focal 0.75 logistic {_FULL} S1=20"),
    (f"focal 0.75 logistic {_FULL} S1=50", f"focal 0.75 logistic {_FULL} S1=30")]


def _pandemic_rows(name: str):
  """A committed pandemic rows file, its AP x 10^-2 as RESULTS.md's tables show it."""
  import pandas as pd
  rows = pd.read_csv(_committed(name))
  return rows.assign(average_precision=100 * rows.average_precision)


def _paired_by_seed(rows, pairs, value="average_precision", metric="average_precision"):
  """The paired table of `pairs` of labelled rows (pandemic rows' AP unless
  `value` and `metric` say otherwise), by seed."""
  from benchmarks import paired
  table = paired.differences(rows, pairs, label="label", cell=["seed"], value=value,
                             metric=metric)
  return paired.to_markdown(table, metric)


def pandemic_tables_paired() -> str:
  """The paired table of PANDEMIC_TABLE_PAIRS from the committed rows (AP x 10^-2)."""
  rows = _pandemic_rows("pandemic_tables.csv.gz")
  rows = rows.assign(feature_set=rows.feature_set.fillna(_FULL))
  loss = rows.loss.where(rows.loss == "bce", "focal " + rows.alpha.map("{:g}".format))
  rows = rows.assign(label=loss + " " + rows.architecture + " " + rows.feature_set
                     + " S1=" + rows.sample_size.astype(str))
  return _paired_by_seed(rows, PANDEMIC_TABLE_PAIRS)


def test_the_pandemic_tables_at_three_and_five_seeds_are_the_committed_rows():
  section = _section("Tables 2.2, 2.4 and 2.5 at 3 seeds, 2.2 at 5")
  lines = [l for l in pandemic_tables_paired().splitlines() if l.startswith("| ")][1:]
  assert len(lines) == len(PANDEMIC_TABLE_PAIRS)
  assert all(l in section for l in lines)


# Thesis Table 2.3's feature groups, in RESULTS.md's order, and the pairs its
# paired table compares (centralized logistic regression unless named).
TABLE23_SETS = ["self", "node", "node+contact", "node+location", _FULL]
TABLE23_PAIRS = [("centralized logistic node", "centralized logistic self"),
                 ("centralized logistic node+contact", "centralized logistic node"),
                 ("centralized logistic node+location", "centralized logistic node"),
                 (f"centralized logistic {_FULL}", "centralized logistic node"),
                 ("centralized mlp node", "centralized logistic node"),
                 (f"centralized mlp {_FULL}", "centralized mlp node"),
                 (f"mrmtl logistic {_FULL}", f"centralized logistic {_FULL}")]


def pandemic_table23() -> tuple:
  """Table 2.3's analogue from the committed rows: per feature set, AP x 10^-2 as
  mean +- sd over seeds of centralized and MR-MTL logistic regression and the
  centralized MLP ('-' where not run); and the paired table of TABLE23_PAIRS."""
  rows = _pandemic_rows("pandemic_table23.csv.gz")
  rows = rows.assign(label=rows.method + " " + rows.architecture + " "
                     + rows.feature_set)
  cells = []
  for feature_set in TABLE23_SETS:
    line = []
    for method, architecture in (("centralized", "logistic"), ("mrmtl", "logistic"),
                                 ("centralized", "mlp")):
      ap = rows[rows.label == f"{method} {architecture} {feature_set}"
                ].average_precision
      line.append(f"{ap.mean():.3f} +- {ap.std():.3f}" if len(ap) else "-")
    cells.append(" | ".join(line))
  return cells, _paired_by_seed(rows, TABLE23_PAIRS)


def test_the_table23_analogue_is_the_committed_rows():
  section = _section("Pandemic forecasting on a synthetic population")
  part = section[section.index("**Table 2.3 analogue: feature groups**"):]
  rows = [l for l in part.splitlines() if l.startswith("| ")][1:1 + len(TABLE23_SETS)]
  cells, table = pandemic_table23()
  assert len(rows) == len(cells) and all(
      f" | {c} | " in row for c, row in zip(cells, rows)), (cells, rows)
  lines = [l for l in table.splitlines() if l.startswith("| ")][1:]
  assert len(lines) == len(TABLE23_PAIRS) and all(l in part for l in lines), lines


def school_splits_table() -> str:
  """Thesis Fig. G.7's table from the committed rows: per training share and
  epsilon, local training's, FedAvg's and the best lambda's MR-MTL test MSE (mean of
  the seeds; lambda chosen on test, as the paper's figures do), and MR-MTL's paired
  difference to the better of the two endpoints."""
  import pandas as pd
  from benchmarks import paired
  rows = pd.read_csv(_committed("school_splits.csv.gz"))
  rows = rows.assign(epsilon=rows.epsilon.fillna(float("inf")),
                     label=rows.algorithm.where(rows.algorithm != "mrmtl",
                                                "mrmtl lam=" + rows.lam.map("{:g}".format)))
  lines = ["| training share | epsilon | local | FedAvg | MR-MTL (lambda*) | MR-MTL - "
           "better endpoint | 95% CI | MR-MTL better in |", "|---" * 8 + "|"]
  for (split, epsilon), part in rows.groupby(["test_fraction", "epsilon"]):
    means = part.groupby("label").test_metric.mean()
    best = means.filter(like="mrmtl").idxmin()
    endpoint = "local" if means["local"] < means["fedavg"] else "fedavg"
    d = paired.differences(part, [(best, endpoint)], label="label", cell=["seed"],
                           metric="mse").iloc[0]
    lines.append(
        f"| {1 - split:.0%} | {epsilon:g} | {means['local']:.4f} | "
        f"{means['fedavg']:.4f} | {means[best]:.4f} ({best.split('=')[1]}) | "
        f"{d.mean_difference:+.4f} ({endpoint}) | [{d.ci_low:.4f}, {d.ci_high:.4f}] | "
        f"{d.a_better} of {d.pairs} |")
  return "\n".join(lines)


# School's honest protocol, one part at a time (RESULTS: "School: the honest
# protocol's parts one at a time"): `benchmarks.run` rows by their server weights,
# then compare's trials (selected on test) and selected rows (on validation).
_PARTS = (("n_k", "the paper's protocol, public feature ranges"),
          ("unweighted", "+ equal server weights"),
          ("equal (sizes private)", "+ one assumed size, 88 (sizes private)"))
_KEPT = "+ 80% kept (validation coins), m = 70"
_VALIDATION = "+ lambda (and rate) chosen on validation"
_METHODS = ("fedavg", "mrmtl", "local")


def _by_test(rows, by: str):
  """`rows` labelled by method (and its lr and lambda where it ran several), and
  each method's label with the best mean test MSE over seeds: selection on test, as
  the paper's figures select."""
  from benchmarks import paired
  rows = rows.assign(label=paired.labels(rows, by, ("lam", "lr")))
  means = rows.groupby("label").test_metric.mean()
  return rows, {m: means[means.index.str.split().str[0] == m].idxmin()
                for m in _METHODS}


def _by_validation(rows, tuned: bool):
  """compare's selected rows labelled by method, and what each selected ('lam
  0.1/0.3, lr 0.1': the values over seeds; the rate where it was tuned)."""
  shown = lambda m: (["lam"] if m == "mrmtl" else []) + (["lr"] if tuned else [])
  chosen = {m: ", ".join(f"{c} " + "/".join(f"{v:g}" for v in sorted(
      rows[rows.method == m][c].unique())) for c in shown(m)) for m in _METHODS}
  return rows.assign(label=rows.method), {m: m for m in _METHODS}, chosen


def school_protocol_steps() -> list:
  """[(step, rate, labelled rows, each method's label, what each chose)] from the
  committed rows: each step at the paper's rate 0.01 and with the rate tuned."""
  import pandas as pd
  run = pd.read_csv(_committed("school_protocol_parts.csv.gz"))
  compare = pd.read_csv(_committed("school_protocol_parts_compare.csv.gz"))
  steps = []
  for name, rows, by in [(n, run[run.server_weights == w], "algorithm")
                         for w, n in _PARTS] + [
                             (_KEPT, compare[compare.row_type == "trial"], "method")]:
    for rate, part in (("0.01", rows[rows.lr == 0.01]), ("tuned on test", rows)):
      labelled, best = _by_test(part, by)
      chosen = {m: ", ".join(w.replace("=", " ") for w in best[m].split()[1:])
                for m in _METHODS}
      steps.append((name, rate, labelled, best, chosen))
  selected = compare[compare.row_type == "selected"]
  rates = selected.run_key.map(lambda key: len(json.loads(key)["lrs"]))   # the grid's
  steps.append((_VALIDATION, "0.01", *_by_validation(selected[rates == 1], False)))
  steps.append((_VALIDATION, "tuned on validation",
                *_by_validation(selected[rates > 1], True)))
  return steps


def _gap(rows, best, other: str):
  """MR-MTL's paired difference to `other`, by seed (`paired.differences`' row)."""
  from benchmarks import paired
  return paired.differences(rows, [(best["mrmtl"], best[other])], label="label",
                            cell=["seed"], metric="mse").iloc[0]


def school_protocol_parts_table() -> str:
  """Issue 56 item 3: MR-MTL, FedAvg and local training at epsilon 6 as the honest
  protocol's parts are switched on one at a time; MR-MTL's paired differences."""
  lines = ["| step | rate | FedAvg | MR-MTL | local | MR-MTL - FedAvg, 95% CI | "
           "better in | MR-MTL - local, 95% CI | better in |", "|---" * 9 + "|"]
  for name, rate, rows, best, chosen in school_protocol_steps():
    means = rows.groupby("label").test_metric.mean()
    cells = [name, rate] + [f"{means[best[m]]:.4f}" + (f" ({chosen[m]})" if chosen[m]
                                                        else "") for m in _METHODS]
    for other in ("fedavg", "local"):
      d = _gap(rows, best, other)
      cells += [f"{d.mean_difference:+.4f} [{d.ci_low:.4f}, {d.ci_high:.4f}]",
                f"{d.a_better} of {d.pairs}"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def school_protocol_changes_table() -> str:
  """How each step (and tuning the rate) moves MR-MTL - FedAvg, seed by seed: the
  mean change with its 95% t interval (+: the gap narrows)."""
  from benchmarks import paired
  gaps = {}
  for name, rate, rows, best, _ in school_protocol_steps():
    cells = rows.pivot_table(index="seed", columns="label", values="test_metric")
    gaps[name, rate != "0.01"] = cells[best["mrmtl"]] - cells[best["fedavg"]]

  def change(a, b) -> str:
    d = (gaps[b] - gaps[a]).to_numpy()
    low, high = paired.interval(d, 0.95, "t")
    return f"{d.mean():+.4f} [{low:.4f}, {high:.4f}]"

  names = list(dict.fromkeys(name for name, _ in gaps))
  lines = ["| step | at rate 0.01 | with the rate tuned | tuning the rate, at this "
           "step |", "|---" * 4 + "|"]
  for i, name in enumerate(names):
    steps = ["-", "-"] if i == 0 else [change((names[i - 1], t), (name, t))
                                       for t in (False, True)]
    lines.append(f"| {name} | " + " | ".join(steps + [change((name, False),
                                                               (name, True))]) + " |")
  lines.append("| all the parts together | " + " | ".join(
      change((names[0], t), (names[-1], t)) for t in (False, True)) + " | - |")
  return "\n".join(lines)


def test_the_school_protocol_parts_tables_are_the_committed_rows():
  section = _section("School: the honest protocol's parts one at a time")
  lines = school_protocol_parts_table().splitlines()
  assert len(lines) == 2 + 2 * 5 and all(line in section for line in lines), lines
  lines = school_protocol_changes_table().splitlines()
  assert len(lines) == 2 + 5 + 1 and all(line in section for line in lines), lines


def test_the_clip_8_table_is_the_committed_rows():
  """Fig. 1.3(d)'s stand-in at clip 8: each private accuracy RESULTS.md gives is the
  committed selected row's, rounded half up to 3 decimals (`_recorded`)."""
  import pandas as pd
  rows = pd.read_csv(_committed("fmnist_hetero_clip8.csv.gz"))
  rows = rows[rows.row_type == "selected"]
  section = _section("Label-skewed Fashion-MNIST silos")
  table = section[section.index("**At app. B.4's clip of 8**"):]
  names = {"local": "local", "mrmtl": "MR-MTL (lambda 0.1)", "fedavg": "FedAvg"}
  for method, part in rows.groupby("method"):
    line = next(l for l in table.splitlines() if l.startswith(f"| {names[method]} |"))
    cells = line.split("|")[2:4]
    for cell, epsilon in zip(cells, (1.0, 8.0)):
      value = part[part.epsilon == epsilon].test_metric.iloc[0]
      assert _recorded(cell.replace("*", "").split()[0], repr(value)), (method, cell)


def fmnist_hetero_lambda_table() -> str:
  """Fig. G.4's stand-in: MR-MTL's test accuracy at each lambda (rows) and epsilon
  (columns) from the committed trial rows, 3 decimals rounded half up, each
  column's best in bold."""
  import decimal
  import pandas as pd
  rows = pd.read_csv(_committed("fmnist_hetero_lambda.csv.gz"))
  grid = rows[rows.row_type == "trial"].pivot_table(index="lam", columns="epsilon",
                                                    values="test_metric")
  three = lambda v: str(decimal.Decimal(repr(v)).quantize(decimal.Decimal("0.001"),
                                                         decimal.ROUND_HALF_UP))
  lines = ["| lambda | epsilon 1 | epsilon 8 | without DP |", "|---|---|---|---|"]
  for lam, values in grid.iterrows():
    cells = [f"**{three(v)}**" if v == grid[e].max() else three(v)
             for e, v in values.items()]
    lines.append(f"| {lam:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def test_the_lambda_table_at_clip_8_is_the_committed_rows():
  lines = fmnist_hetero_lambda_table().splitlines()
  section = _section("Label-skewed Fashion-MNIST silos")
  assert len(lines) == 2 + 5 and all(line in section for line in lines), lines


def _clip8_trials():
  import pandas as pd
  rows = pd.read_csv(_committed("fmnist_hetero_clip8_lambda.csv.gz"))
  return rows[rows.row_type == "trial"]


def fmnist_hetero_lambda_means_table() -> str:
  """Fig. G.4's stand-in over 5 seeds: MR-MTL's mean +- sd test accuracy at each
  lambda, then local training's, at epsilon 1 and 8 (4 decimals)."""
  trials = _clip8_trials()
  lines = ["| lambda | epsilon 1 | epsilon 8 |", "|---|---|---|"]
  for lam, part in [(f"{lam:g}", part) for lam, part in
                    trials[trials.method == "mrmtl"].groupby("lam")] + [
                        ("local training", trials[trials.method == "local"])]:
    cells = [f"{g.mean():.4f} +- {g.std():.4f}"
             for _, g in part.groupby("epsilon").test_metric]
    lines.append(f"| {lam} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def fmnist_hetero_fixed_lambda_table() -> str:
  """MR-MTL at a fixed lambda against local training, paired by epsilon and seed:
  the mean difference and its 95% t interval (`benchmarks.paired`)."""
  from benchmarks import paired
  trials = _clip8_trials()
  local = trials[trials.method == "local"].set_index(["epsilon", "seed"]).test_metric
  lines = ["| MR-MTL's lambda | epsilon | pairs | mean MR-MTL - local | 95% CI | MR-MTL "
           "better in |", "|---|---|---|---|---|---|"]
  for lam in (0.001, 0.1):
    ours = trials[(trials.method == "mrmtl") & (trials.lam == lam)]
    d = (ours.set_index(["epsilon", "seed"]).test_metric - local).dropna()
    for epsilon, part in list(d.groupby(level="epsilon")) + [("all", d)]:
      low, high = paired.interval(part.values)
      name = epsilon if epsilon == "all" else f"{epsilon:g}"
      lines.append(f"| {lam:g} | {name} | {len(part)} | {part.mean():.4f} | "
                   f"[{low:.4f}, {high:.4f}] | {(part > 0).sum()} of {len(part)} |")
  return "\n".join(lines)


@pytest.mark.cli
def test_the_three_seed_clip_8_tables_are_the_committed_rows():
  printed, section = _paired_by_summarize("fmnist_hetero_clip8_lambda.csv.gz",
                                          "mrmtl:local", "Label-skewed Fashion-MNIST silos")
  quoted = re.findall(r"^\| mrmtl \| local \| .*$", section, re.M)
  assert len(quoted) == 3 and all(line in printed for line in quoted), quoted
  for table, length in ((fmnist_hetero_lambda_means_table(), 2 + 6),
                        (fmnist_hetero_fixed_lambda_table(), 2 + 6)):
    lines = table.splitlines()
    assert len(lines) == length and all(line in section for line in lines), lines


@pytest.mark.cli
def test_the_cluster_selection_intervals_come_from_the_committed_rows():
  every, tenth = "ifca selection_fraction=1", "ifca selection_fraction=0.1"
  printed, section = _paired_by_summarize(
      "school_ifca_selection.csv.gz", f"{every}:{tenth},{every}:fedavg",
      "Privacy overhead of cluster selection")
  names = {"10%": tenth, "FedAvg": "fedavg"}
  quoted = re.findall(r"^\| every round \| (10%|FedAvg) \| (\d) \| (\S+) \| (\[[^]]+\]) "
                      r"\| (\d) of 5 \|$", section, re.M)
  assert len(quoted) == 4
  for b, epsilon, mean, interval, better in quoted:
    assert (f"| {every} | {names[b]} | {epsilon} | 5 | {mean} | {interval} | "
            f"{better} of 5 |") in printed, (b, epsilon)


def test_the_galli_table_is_the_committed_rows():
  """Galli et al. sec. 5.1's table: each configuration's median rounds, mean
  validation RMSE and test MSE (3 significant digits) and composed leakage are the
  committed rows'."""
  import math
  import pandas as pd
  rows = pd.read_csv(_committed("galli_synthetic.csv.gz"))
  section = _section("d-private clustered FL on Galli et al.'s synthetic data")
  configurations = rows.groupby(["patience", "num_clusters", "nu"], dropna=False)
  assert len(configurations) == 6
  for (patience, k, nu), part in configurations:
    stopping = "150 rounds" if math.isnan(patience) else f"patience {patience:g}"
    start = f"| {stopping} | {k} | {'none' if math.isnan(nu) else f'{nu:g}'} |"
    line = next(l for l in section.splitlines() if l.startswith(start))
    cells = [c.strip() for c in line.split("|")[4:]]
    assert cells[0] == f"{part.rounds_run.median():g}", line
    assert cells[1].split()[0] == f"{part.validation_loss.mean():#.3g}", line
    assert cells[2] == f"{part.test_metric.mean():#.3g}", line
    if not math.isnan(nu):
      assert cells[6] == f"{part.leakage_max.min():.1f} .. {part.leakage_max.max():.1f}"


def test_the_tuning_cost_table_is_the_committed_rows():
  """Thesis Fig. 1.7's table: each condition's noise multiplier, best lambda on the
  grid, its error and local training's error (lambda 0) are the committed rows'
  (the tuned column is `tuning.expected_best` of the same errors, not stored)."""
  import pandas as pd
  rows = pd.read_csv(_committed("tuning_cost.csv.gz"))
  section = _section("The privacy cost of tuning lambda on mean estimation")
  names = {"non_private": "non-private", "private": "private (tuning not counted)",
           "poisson": "Poisson, mu = 10"}
  assert rows.condition.nunique() == 9
  for condition, part in rows.groupby("condition"):
    name = names.get(condition, condition.replace("tnb_eta=", "TNB eta = "))
    line = next(l for l in section.splitlines() if l.startswith(f"| {name} |"))
    z, lam, error, _, local = [c.strip() for c in line.split("|")[2:7]]
    best = part.loc[part.error.idxmin()]
    assert z == ("0" if best.noise_multiplier == 0 else
                 f"{best.noise_multiplier:.2f}"), line
    assert (lam, error) == (f"{best.lam:.2f}", f"{best.error:.5f}"), line
    assert local == f"{part[part.lam == 0].error.iloc[0]:.5f}", line


def test_the_school_splits_table_is_the_committed_rows():
  section = _section("School with 80, 50 and 20% for training")
  lines = school_splits_table().splitlines()
  assert len(lines) == 2 + 3 * 6 and all(line in section for line in lines)


@pytest.mark.cli
def test_the_vehicle_low_epsilon_intervals_come_from_the_committed_rows():
  printed, section = _paired_by_summarize(
      "vehicle_low_epsilon.csv.gz", "mrmtl:fedavg,mrmtl:local,mrmtl:finetune,ditto:mrmtl",
      "Vehicle at epsilon 0.1-0.9")
  quoted = re.findall(r"^\| \w+ \| \w+ \| (?:0\.5|all) \|.*$", section, re.M)
  assert len(quoted) == 8 and all(line in printed for line in quoted)


@pytest.mark.cli
def test_the_vehicle_sweep_table_and_intervals_come_from_the_committed_rows():
  """The Vehicle sweep's method x epsilon table (its bold marks the best of each
  column) and the paired intervals are what `summarize` prints for the rows."""
  printed, section = _paired_by_summarize(
      "vehicle_sweep.csv.gz", "mrmtl:fedavg,mrmtl:finetune,mrmtl:local",
      "Vehicle's epsilon sweep with the learning rate tuned")
  body = _table_rows(section, "| method | eps 1")
  assert len(body) == 5 and all(line.replace("**", "") in printed.splitlines()
                                for line in body)
  mean = lambda cell: float(cell.replace("**", "").split()[0])
  for column in zip(*[line.strip("|").split("|")[1:] for line in body]):
    best = max(map(mean, column))
    assert [("**" in cell) for cell in column] == [mean(c) == best for c in column]
  paired = _table_rows(section, "| a | b | epsilon")
  assert len(paired) == 18 and all(line in printed.splitlines() for line in paired)


@pytest.mark.cli
def test_the_vehicle_finetuning_intervals_come_from_the_committed_rows():
  pairs = ",".join([f"finetune finetune_fraction={f}:{b}" for b in ("fedavg", "local")
                    for f in ("0.25", "0.5", "0.75")] + ["fedavg:local"])
  printed, section = _paired_by_summarize("vehicle_finetune.csv.gz", pairs,
                                          "Vehicle: finetuning from 25, 50 and 75%")
  quoted = re.findall(r"^\| [\w .=]+ \| \w+ \| all \|.*$", section, re.M)
  assert len(quoted) == 7 and all(line in printed for line in quoted)


@pytest.mark.cli
def test_the_school_full_grid_tables_are_the_committed_rows():
  """Thesis Fig. 1.3(b) and G.3 under app. B.4's grids: every table line RESULTS.md
  gives for the full grid (means +- sd with the selected lambdas, the paired
  intervals) is a line `summarize` prints for the committed rows."""
  section = _section("School, the harness")
  part = section[section.index("**School with app. B.4's full grids**"):]
  _assert_summarized(_committed("school_full.csv.gz"),
                     part[:part.index("**School with honest tuning**")], 8 + 6)


def _assert_summarized(rows: str, part: str, at_least: int) -> None:
  """Every table line of RESULTS.md's `part` (at least `at_least` of them) is a
  line `summarize` prints for `rows`."""
  done = binaries.run("summarize", rows)
  assert done.returncode == 0, done.stderr
  lines = [line for line in part.splitlines() if line.startswith("| ")]
  assert len(lines) >= at_least, lines
  missing = [line for line in lines if line not in done.stdout.splitlines()]
  assert not missing, missing


def udp_grid_tables() -> tuple:
  """UDP-Alg's S x z x q grid (Nemala et al. Fig. 2's grid, 50 digits users, one
  seed) from the committed rows: mean user accuracy [sigma = z S / (q W)] and the
  user-level epsilon per (q, S, z); and the line for clipping alone (z = 0)."""
  import pandas as pd
  rows = pd.read_csv(_committed("udp_grid.csv.gz"))
  lines = ["| q | S | z=5: accuracy [sigma] | z=10: accuracy [sigma] | epsilon (z=5) | "
           "epsilon (z=10) |", "|---" * 6 + "|"]
  for (q, clip), part in rows[rows.noise_multiplier > 0].groupby(
      ["sampling_rate", "l2_norm_clip"]):
    run = part.set_index("noise_multiplier")
    lines.append(f"| {q:g} | {clip:g} | " + " | ".join(
        [f"{run.mean_user_accuracy[z]:.3f} [{run.sigma[z]:g}]" for z in (5, 10)]
        + [f"{run.epsilon[z]:.3f}" for z in (5, 10)]) + " |")
  clipped = rows[rows.noise_multiplier == 0].sort_values("l2_norm_clip")
  alone = "Clipping alone (z = 0, q = 0.1): " + ", ".join(
      f"S = {r.l2_norm_clip:g}: {r.mean_user_accuracy:.3f}" for r in clipped.itertuples())
  return "\n".join(lines), alone


def test_the_udp_grid_table_is_the_committed_rows():
  section = _section("UDP-Alg grid: S x z x q at delta = 1e-5")
  table, alone = udp_grid_tables()
  assert len(table.splitlines()) == 2 + 9 and table in section, table
  assert alone in " ".join(section.split()), alone


def membership_table() -> str:
  """Thesis sec. 2.5.3: the loss-threshold attack against each model set at each
  per-silo epsilon, from the committed rows: test and training accuracy, pooled AUC
  and advantage (mean +- sd over seeds), the median silo AUC over every seed's
  silos, and the largest advantage (epsilon, delta)-DP allows, (e^epsilon - 1 +
  2 delta) / (e^epsilon + 1)."""
  import math
  import pandas as pd
  rows = pd.read_csv(_committed("membership.csv.gz"), dtype={"silo": str})
  lines = ["| model set | per-silo epsilon (target; spent <=) | test acc | train acc | "
           "pooled AUC | pooled advantage | median silo AUC | DP bound on advantage |",
           "|---" * 8 + "|"]
  for (algorithm, epsilon), part in rows.groupby(["algorithm", "target_epsilon"],
                                                 sort=False):
    pooled = part[part.silo == "all"]
    train = pooled.train_accuracy.fillna(pooled.train_accuracy_outside_guarantee)
    delta = pooled.delta.max()
    bound = ("-" if math.isinf(epsilon) else
             f"{(math.exp(epsilon) - 1 + 2 * delta) / (math.exp(epsilon) + 1):.3f}")
    lines.append("| " + " | ".join([
        algorithm, "non-private" if math.isinf(epsilon) else f"{epsilon:g}",
        f"{pooled.test_accuracy.mean():.3f}", f"{train.mean():.3f}",
        f"{pooled.auc.mean():.3f} ± {pooled.auc.std():.3f}",
        f"{pooled.advantage.mean():.3f} ± {pooled.advantage.std():.3f}",
        f"{part[part.silo != 'all'].auc.median():.3f}", bound]) + " |")
  return "\n".join(lines)


def test_the_membership_table_is_the_committed_rows():
  """The table, and every model's spent epsilon at or below the target its row
  prints."""
  import pandas as pd
  section = _section("Membership inference against silo models")
  table = membership_table()
  assert len(table.splitlines()) == 2 + 12 and table in section, table
  rows = pd.read_csv(_committed("membership.csv.gz"))
  assert (rows.epsilon_spent <= rows.target_epsilon).all()
  assert rows.seed.nunique() == 3 and len(rows) == 3 * 12 * 41


def _figure_rows(name: str) -> str:
  """A rows file written beside its figure under benchmarks/figures/."""
  return os.path.join(binaries.ROOT, "benchmarks", "figures", name)


def _printed(cell: str, value: float) -> bool:
  """Whether `cell` (as "34.6", "6.85e6" or "0.012") is `value` rounded to the
  significant digits the cell prints."""
  mantissa = cell.split("e")[0].lstrip("0.").replace(".", "")
  return float(cell) == float(f"{value:.{max(len(mantissa), 1)}g}")


def test_the_degree_table_is_the_rows_beside_fig_2_8():
  """Thesis Fig. 2.8's table (the authors' add/remove exponent, epsilon by S and
  sigma) prints the committed CSV's epsilons to their digits."""
  import pandas as pd
  rows = pd.read_csv(_figure_rows("pandemic_degree.csv"))
  rows = rows[rows.neighbouring == "add_remove"]
  section = _section("Pandemic forecasting on a synthetic population")
  header = "| S | sigma 0.5 | 1 | 2 | 4.5 | 5 | 10 |"
  sigmas = [0.5] + [float(c) for c in header.split("|")[3:-1]]
  lines = _table_rows(section, header)
  assert len(lines) == 7, lines
  for line in lines:
    cells = [c.strip() for c in line.split("|")[1:-1]]
    for sigma, cell in zip(sigmas, cells[1:]):
      value = rows[(rows.max_neighbourhoods == int(cells[0]))
                   & (rows.sigma == sigma)].epsilon
      assert len(value) == 1 and _printed(cell, value.iloc[0]), (line, sigma)


def test_the_gradient_norm_table_is_the_rows_beside_fig_2_9():
  """Thesis Fig. 2.9's table of per-example gradient norms (median, 99th
  percentile, largest, shares below C / 5 and C) is the committed CSV's."""
  import pandas as pd
  rows = pd.read_csv(_figure_rows("pandemic_gradient_norms.csv"))
  rows = rows[rows.label != "all"]
  section = _section("Pandemic forecasting on a synthetic population")
  lines = _table_rows(section, "| model | label | median |")
  assert len(lines) == len(rows) == 4, lines
  for line, (_, row) in zip(lines, rows.iterrows()):
    cells = [c.strip() for c in line.split("|")[3:-1]]
    values = (row["median"], row.q99, row.largest, row.below_clip_5, row.below_clip)
    assert line.startswith(f"| {row.model}"), line
    assert ("positive" in line) == (float(row.label) == 1), line
    assert all(_printed(c, v) for c, v in zip(cells, values)), (line, values)


@pytest.mark.cli
def test_the_table_2_6_epsilons_are_what_the_accountant_prints():
  """Thesis Table 2.6's epsilon column in RESULTS is what `pandemic --epsilon_table`
  prints now (no data: the accountant alone, about a second)."""
  done = binaries.run("pandemic", "--epsilon_table")
  assert done.returncode == 0, done.stderr
  table = [l for l in done.stdout.splitlines() if l.startswith("|")]
  assert len(table) == 2 + 7, done.stdout
  assert "\n".join(table) in _section("Pandemic forecasting on a synthetic population")


@pytest.mark.cli
def test_the_digits_stand_in_tables_are_the_committed_rows():
  """Thesis Fig. 1.6's digits stand-in: the means table and the paired intervals
  RESULTS.md gives are lines `summarize` prints for the committed rows."""
  section = _section("Rotated & masked digits with the hypernetwork")
  _assert_summarized(_committed("digits.csv.gz"), section, 7 + 25)


# Table 2.6 at C = 5: the pairs its paired table compares (labels: clip and sigma).
TABLE26_PAIRS = [("no DP", "C=5 sigma=0.01"), ("no DP", "C=15 sigma=0.01"),
                 ("C=15 sigma=0.01", "C=5 sigma=0.01"), ("C=15 sigma=1", "C=5 sigma=1")]


def test_table_2_6_at_clip_5_is_the_committed_rows():
  """Thesis Table 2.6 at C = 5 and S1 = 30 (and C = 15 at two sigmas): each AP
  cell is mean +- sd over the seeds (x 10^-2) with its ratio to the non-private
  mean, and each epsilon the rows' (replace one node; the authors' exponent); the
  paired table is the rows' by seed."""
  rows = _pandemic_rows("pandemic_table26_c5.csv.gz")
  section = _section("Pandemic forecasting on a synthetic population")
  lines = _table_rows(section, "| sigma | AP x 10^-2, C = 5 (ratio) |")
  base = rows[rows.sigma == 0].average_precision.mean()
  def ap(part):
    assert part.seed.nunique() == len(part) == 3, part
    mean = part.average_precision.mean()
    return f"{mean:.3f} +- {part.average_precision.std():.3f} ({mean / base:.2g})"
  assert len(lines) == 6 and len(rows) == 3 * (6 + 2), lines
  for line in lines:
    cells = [c.strip() for c in line.split("|")[1:-1]]
    at = rows[rows.sigma == (0 if cells[0] == "non-private" else float(cells[0]))]
    five, fifteen = at[at["clip"].isna() | (at["clip"] == 5)], at[at["clip"] == 15]
    assert cells[1] == ap(five), line
    if len(fifteen):
      assert cells[2] == ap(fifteen), line
    else:
      assert cells[2] in ("-", "(the same run: no clipping)"), line
    if cells[0] != "non-private":
      for cell, column in ((cells[4], five.epsilon_theorem),
                           (cells[5], five.epsilon_code)):
        assert column.nunique() == 1 and _printed(cell, column.iloc[0]), line
  label = rows["clip"].map(lambda c: "no DP" if c != c else f"C={c:g}")
  rows = rows.assign(label=label.where(rows.sigma == 0,
                                       label + " sigma=" + rows.sigma.map("{:g}".format)))
  paired = [l for l in _paired_by_seed(rows, TABLE26_PAIRS).splitlines()
            if l.startswith("| ")]
  assert len(paired) == 1 + len(TABLE26_PAIRS)   # the header, a line a pair
  assert all(line in section for line in paired)


# Galli et al. Table 4's stand-in: the pairs its paired table compares.
GALLI_TABLE4_PAIRS = [(f"U=20 nu={nu}", "U=20 nu=none") for nu in (1, 5, 10, 15)] + [
    ("U=4 nu=15", "U=4 nu=none")]


def test_the_galli_table_4_stand_in_is_the_committed_rows():
  """Each nu's accuracy (mean +- sd over the seeds), the ARI of each seed and the
  largest composed leakage are the committed rows' (U = 20), and the paired table
  (U = 20, and U = 4 at nu 15) is theirs by seed (labels: U and nu; the ARI whether
  or not the run's guarantee covers it)."""
  import pandas as pd
  rows = pd.read_csv(_committed("galli_table4.csv.gz"))
  nu = rows.nu.map(lambda v: "none" if v != v else f"{v:g}")
  rows = rows.assign(ari=rows.ari_outside_guarantee.fillna(rows["ari"]),
                     label="U=" + rows.clients_per_round.astype(str) + " nu=" + nu)
  section = _section("d-private clustering on rotated Fashion-MNIST")
  twenty = rows[rows.clients_per_round == 20]
  assert len(twenty) == 5 * 3 and len(rows) == 5 * 3 + 2 * 3
  for nu, part in twenty.groupby(twenty.nu.fillna(0)):
    name = "none (paper: 0)" if nu == 0 else f"{nu:g}"
    line = next(l for l in section.splitlines() if l.startswith(f"| {name} |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    accuracy = part.test_metric
    assert cells[1] == f"{accuracy.mean():.3f} +- {accuracy.std():.3f}", line
    assert cells[2] == ", ".join(f"{a:.2g}" for a in part.sort_values("seed").ari), line
    assert cells[3] == ("unbounded" if nu == 0 else
                        f"{part.leakage_max.max():.1e}".replace("e+0", "e")), line
  lines = [l for l in _paired_by_seed(rows, GALLI_TABLE4_PAIRS, "test_metric", "accuracy")
           .splitlines() if l.startswith("| ")]
  assert len(lines) == 1 + len(GALLI_TABLE4_PAIRS)
  assert all(line in section for line in lines)


def inversion_table(rows) -> list:
  """RESULTS' DLG / iDLG table body from `benchmarks.attacks --parts=inversion` rows:
  per defense setting, each method's median PSNR [IQR] (linear quantiles), median
  SSIM, images with SSIM > 0.5, labels read, and the privacy the update spent."""
  order = {"none": 0, "laplace": 1, "dp_sgd": 2, "clip": 3}
  lines = []
  for (defense, parameter), part in sorted(rows.groupby(["defense", "parameter"]),
                                           key=lambda k: (order[k[0][0]], k[0][1])):
    clip = part.l2_norm_clip.iloc[0]
    cells = [{"none": "no defense", "laplace": f"Laplace nu = {parameter:g}",
              "dp_sgd": f"DP-SGD z = {parameter:g}",
              "clip": f"clip alone, C = {clip:g}"}[defense]]
    for method in ("idlg", "dlg"):
      one = part[part.method == method]
      low, median, high = one.psnr.quantile([0.25, 0.5, 0.75])
      cells += [f"{median:.1f} [{low:.1f}, {high:.1f}]", f"{one.ssim.median():.3f}",
                f"{(one.ssim > 0.5).sum()}/{len(one)}",
                f"{100 * one.label_correct.mean():.0f}%"]
    cells.append({"laplace": f"leakage {part.leakage.iloc[0]:.2e}",
                  "dp_sgd": f"eps {part.epsilon.iloc[0]:.3g}"}.get(defense, "-"))
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def test_the_inversion_table_is_the_committed_rows():
  """Galli et al. sec. 5.3's table: 15 defense settings, 20 images each, by both
  attacks, every cell recomputed from the committed rows."""
  import pandas as pd
  rows = pd.read_csv(_committed("attacks.csv.gz"))
  assert len(rows) == 15 * 2 * 20 and set(rows.method) == {"idlg", "dlg"}
  body = _table_rows(_section("DLG and iDLG against each defense"),
                     "| setting | iDLG PSNR")
  assert body == inversion_table(rows)


def _three_digits(value: float) -> str:
  """`value` to 3 significant digits, thousands with commas: 6,840, 25.2, 0.850."""
  return f"{float(f'{value:.3g}'):,.0f}" if value >= 1000 else f"{value:#.3g}"


def udp_scaling_table(rows) -> list:
  """The UDP-Alg scaling table's body from `benchmarks.hypernet` rows: by network
  size P, the unclipped run, the noiseless clipped ones, then by signal-to-noise
  bound q W / (z sqrt(P)) (falling) and users a round."""
  from benchmarks import tables
  rows = rows.assign(users=(rows.sampling_rate * rows.num_users).round().astype(int))
  bound = tables.signal_to_noise(rows)   # the binary's column, as its figure plots
  rows = rows.assign(bound=bound.map(lambda b: float(f"{b:.2g}")))   # as printed
  rows = rows.assign(order=rows.l2_norm_clip.notna().astype(int)
                     + (rows.noise_multiplier > 0))
  lines = []
  for r in rows.sort_values(["hypernet_parameters", "order", "bound", "users"],
                            ascending=[True, True, False, True]).itertuples():
    noised = r.noise_multiplier > 0
    clip = "none" if r.l2_norm_clip != r.l2_norm_clip else f"{r.l2_norm_clip:g}"
    cells = [f"{r.hypernet_parameters:,}", f"{r.users} ({r.mean_users_per_round:.1f})",
             clip, f"{r.noise_multiplier:g}",
             _three_digits(r.epsilon) if noised else "-",
             f"{r.bound:.2g}" if noised else "-", f"{r.mean_user_accuracy:.3f}",
             f"{r.wall_seconds:.0f} s", f"{r.peak_memory_mb / 1024:.1f} GB"]
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def test_the_udp_scaling_table_is_the_committed_rows():
  """UDP-Alg on 1,500 Fashion-MNIST users: 20 runs, each line recomputed from the
  committed rows (one seed), every noised run's W declared public."""
  import pandas as pd
  rows = pd.read_csv(_committed("udp_scaling.csv.gz"))
  assert len(rows) == 20 and (rows.num_users == 1500).all()
  assert (rows[rows.noise_multiplier > 0].public_user_count == 1500).all()
  body = _table_rows(_section("Where user-level DP starts to learn"),
                     "| P | users a round")
  assert body == udp_scaling_table(rows)


def _time(seconds: float) -> str:
  """3 significant digits, in ms below a second: 1.37 ms, 273 ms, 20.1 s."""
  value, unit = (seconds * 1e3, "ms") if seconds < 1 else (seconds, "s")
  return f"{_three_digits(value).rstrip('.')} {unit}"


def _ratio(ratio: float) -> str:
  """2 significant digits, whole from 10: 0.90x, 3.6x, 16x, 220x."""
  return f"{ratio:.2g}x" if ratio < 10 else f"{float(f'{ratio:.2g}'):.0f}x"


def h200_rounds_table(school, hypernet, cnn, cnn_cpu) -> list:
  """RESULTS' H200 table body: each method's median round on the H200 and on the
  same machine's 16 CPU cores (jaxlib 0.11.2, one invocation), from the imported
  rows of the School and hypernetwork bundles and the Fashion-MNIST cell (mask
  0.2) with the CPU's timing replay (`cnn_cpu`: its first call of each trial's
  block of calls; MR-MTL's program is local's, timed once)."""
  lines = []

  def line(workload, method, gpu, cpu, memory):
    cells = [workload, method, _time(gpu), cpu if isinstance(cpu, str) else _time(cpu),
             "-" if isinstance(cpu, str) else _ratio(cpu / gpu), memory]
    lines.append("| " + " | ".join(cells) + " |")

  for rows, workload in ((school, "School, DP (epsilon 1)"),
                         (hypernet, "digits users, UDP-Alg q 0.1, z 1 / FedAvg")):
    gpu, cpu = (rows[rows.device == d].set_index("algorithm")
                for d in ("xla_gpu", "xla_cpu"))
    for method in gpu.index:
      line(workload, method, gpu.seconds_per_round_median[method],
           cpu.seconds_per_round_median[method],
           f"{gpu.device_memory_mb[method]:.1f} MB")
  trials = cnn[(cnn.row_type == "trial") & (cnn.mask_probability == 0.2)].reset_index()
  calls = cnn_cpu["call_seconds"]
  block = len(calls) // len(trials)
  for i, trial in trials.iterrows():
    timed = [s for s in calls[i * block:(i + 1) * block] if s is not None]
    cpu = timed[0] if timed else "as local (one program)"
    line("Fashion-MNIST CNN, DP (epsilon 3)", trial.method,
         trial.wall_seconds / trial.rounds, cpu, "-")
  return lines


def h200_pandemic_table(rows) -> list:
  """RESULTS' table of the forecaster's training (20 rounds) on the H200 and its CPU."""
  gpu, cpu = (rows[rows.device == d].reset_index() for d in ("xla_gpu", "xla_cpu"))
  return [f"| {g.method} | {g.noise_multiplier:g} | {_time(g.train_seconds)} | "
          f"{_time(c.train_seconds)} | {c.train_seconds / g.train_seconds:.0f}x |"
          for (_, g), (_, c) in zip(gpu.iterrows(), cpu.iterrows())]


def fmnist_masks_table(rows) -> list:
  """RESULTS' 200-round Fig. 1.6 table: each method's test accuracy by mask."""
  rows = rows[rows.row_type == "selected"]
  accuracy = rows.pivot_table(index="method", columns="mask_probability",
                              values="test_metric")
  names = {"local": "local", "ifca_mrmtl": "IFCA-MR-MTL (lambda 1)",
           "mrmtl": "MR-MTL (lambda 1)", "ifca": "IFCA (G = 4)", "fedavg": "FedAvg"}
  lines, best = [], accuracy.max()
  for method in accuracy[0.2].sort_values(ascending=False).index:
    row = accuracy.loc[method]
    cells = [f"**{row[m]:.3f}**" if row[m] == best[m] else f"{row[m]:.3f}"
             for m in (0.0, 0.2, 0.4)]
    lines.append(f"| {names[method]} | " + " | ".join(cells)
                 + f" | {row[0.0] - row[0.4]:.3f} |")
  return lines


def test_the_h200_tables_are_the_committed_rows():
  """Issue 55 item 4: the rounds measured on an H200 and beside it on its CPU, and
  the 200-round Fig. 1.6 cells replayed there, every cell from the committed rows."""
  import gzip
  import json
  import pandas as pd
  school, hypernet, pandemic, cnn = (pd.read_csv(_committed(f"h200_{name}.csv.gz"))
                                     for name in ("school", "hypernet", "pandemic",
                                                  "fmnist_masks"))
  with gzip.open(_committed("h200_fmnist_cpu_timing.json.gz")) as f:
    cnn_cpu = json.load(f)
  assert cnn_cpu["platform"] == "cpu" and cnn_cpu["calls_per_program"] == 1
  assert set(cnn.device) == {"xla_gpu"} and len(cnn) == 30
  for rows in (school, hypernet, pandemic):
    assert sorted(set(rows.device)) == ["xla_cpu", "xla_gpu"]
  text = _section("The harness on an H200")
  assert _table_rows(text, "| workload | method | H200") == h200_rounds_table(
      school, hypernet, cnn, cnn_cpu)
  assert _table_rows(text, "| forecaster run") == h200_pandemic_table(pandemic)
  assert _table_rows(_section("Fig. 1.6 at 200 rounds on an H200"),
                     "| method | mask 0 |") == fmnist_masks_table(cnn)


def _minutes(seconds: float) -> str:
  """Whole seconds, in minutes and seconds from a minute: 3 s, 56 s, 10 min 41 s."""
  seconds = round(seconds)
  return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


def pandemic_scaling_table(rows, generation) -> list:
  """RESULTS' Fig. 2.10 table body: per profile, its persons and contacts, the
  generation's time and peak, and each method's load + train seconds and peak."""
  gb = lambda mb: f"{mb / 1024:.1f} GB"
  short = lambda s: f"{s:.1f}" if s < 10 else f"{s:.0f}"
  contacts = lambda c: f"{c / 1e3:.0f} k" if c < 1e6 else f"{c / 1e6:.1f} M"
  lines = []
  for _, made in generation.iterrows():
    runs = rows[rows.profile == made.profile].set_index("method")
    cells = [f"{runs.persons.iloc[0]:,}", contacts(runs.contacts.iloc[0]),
             f"{_minutes(made.generate_seconds)} ({gb(made.generate_peak_mb)})"]
    for method in ("centralized", "mrmtl"):
      run = runs.loc[method]
      cells.append(f"{short(run.load_seconds)} + {short(run.train_seconds)} "
                   f"({gb(run.peak_memory_mb)})")
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def test_the_pandemic_scaling_table_is_the_committed_rows():
  """Thesis Fig. 2.10: every cell of the time and memory table from the committed
  rows, one run per profile and method, and the profiles' generation."""
  import pandas as pd
  rows = pd.read_csv(_committed("pandemic_scaling.csv.gz"))
  generation = pd.read_csv(_committed("pandemic_generation.csv.gz"))
  assert len(rows) == 2 * len(generation) == 8
  assert all(sorted(methods) == ["centralized", "mrmtl"]
             for _, methods in rows.groupby("profile").method)
  text = _section("Pandemic forecasting on a synthetic population")
  assert _table_rows(text, "| persons | contacts | generate") == pandemic_scaling_table(
      rows, generation)
