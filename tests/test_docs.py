"""The numbers the README quotes come from what the commands print now (issue 54,
item 4: docs that cannot go stale)."""

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
  table = readme[readme.index("| finding | numbers | where |"):]
  rows = table[:table.index("\n\n")].splitlines()[2:]
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


def pandemic_tables_paired() -> str:
  """The paired table of PANDEMIC_TABLE_PAIRS from the committed rows (AP x 10^-2)."""
  import pandas as pd
  from benchmarks import paired
  rows = pd.read_csv(_committed("pandemic_tables.csv.gz"))
  rows = rows.assign(feature_set=rows.feature_set.fillna(_FULL),
                     average_precision=100 * rows.average_precision)
  loss = rows.loss.where(rows.loss == "bce", "focal " + rows.alpha.map("{:g}".format))
  rows = rows.assign(label=loss + " " + rows.architecture + " " + rows.feature_set
                     + " S1=" + rows.sample_size.astype(str))
  table = paired.differences(rows, PANDEMIC_TABLE_PAIRS, label="label", cell=["seed"],
                             value="average_precision", metric="average_precision")
  return paired.to_markdown(table, "average_precision")


def test_the_pandemic_tables_at_three_seeds_are_the_committed_rows():
  section = _section("Tables 2.2, 2.4 and 2.5 at 3 seeds")
  lines = [l for l in pandemic_tables_paired().splitlines() if l.startswith("| ")][1:]
  assert len(lines) == len(PANDEMIC_TABLE_PAIRS)
  assert all(l in section for l in lines)


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


def test_the_clip_8_table_is_the_committed_rows():
  """Fig. 1.3(d)'s stand-in at clip 8: each private accuracy RESULTS.md gives is the
  committed selected row's, rounded half up to 3 decimals."""
  import decimal
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
      shown = decimal.Decimal(repr(value)).quantize(decimal.Decimal("0.001"),
                                                    decimal.ROUND_HALF_UP)
      assert cell.replace("*", "").split()[0] == str(shown), (method, epsilon, cell)


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
def test_the_vehicle_finetuning_intervals_come_from_the_committed_rows():
  pairs = ",".join([f"finetune finetune_fraction={f}:{b}" for b in ("fedavg", "local")
                    for f in ("0.25", "0.5", "0.75")] + ["fedavg:local"])
  printed, section = _paired_by_summarize("vehicle_finetune.csv.gz", pairs,
                                          "Vehicle: finetuning from 25, 50 and 75%")
  quoted = re.findall(r"^\| [\w .=]+ \| \w+ \| all \|.*$", section, re.M)
  assert len(quoted) == 7 and all(line in printed for line in quoted)
