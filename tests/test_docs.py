"""The numbers the README quotes come from what the commands print now (issue 54,
item 4: docs that cannot go stale)."""

import os
import re

import pytest

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


def _sections(text: str, title: str) -> str:
  """The sections of markdown `text` whose heading starts with `title`, each up to
  the next heading of its level or above."""
  headings = [(m.start(), len(m.group(1)), m.group(2))
              for m in re.finditer(r"^(#+) (.*)$", text, re.M)]
  out = []
  for i, (start, level, heading) in enumerate(headings):
    if heading.startswith(title):
      end = next((s for s, l, _ in headings[i + 1:] if l <= level), len(text))
      out.append(text[start:end])
  return "".join(out)


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
    text = "".join(_sections(results, title) for title in cited)
    for title in cited:
      assert _sections(results, title), f"RESULTS.md has no section {title!r}"
    missing = [n for n in _DECIMAL.findall(numbers) if not _recorded(n, text)]
    assert not missing, (cited, missing)


def test_the_private_tuning_numbers_are_the_recorded_runs():
  """The README's numbers for `--tuning=private` (each run draws new plans, so no
  command reprints them) are those RESULTS.md records for the quick preset."""
  readme = _readme()
  with open(RESULTS) as f:
    harness = _sections(f.read(), "The comparison harness")
  quoted = readme[readme.index("Paying for it"):readme.index("sec. 1.7")]
  numbers = _DECIMAL.findall(quoted)
  assert len(numbers) >= 4
  assert all(_recorded(n, harness) for n in numbers), numbers


@pytest.mark.cli
def test_the_school_attribution_intervals_come_from_the_committed_rows():
  """Each paired interval RESULTS.md gives for School's gap is what `summarize`
  computes from the rows committed under benchmarks/results/."""
  done = binaries.run(
      "summarize", os.path.join(binaries.ROOT, "benchmarks", "results",
                                "school_attribution.csv.gz"),
      "--paired=mrmtl lam=1 lr=0.01:fedavg lr=0.01,mrmtl lam=3 lr=0.03:fedavg lr=0.1")
  assert done.returncode == 0, done.stderr
  with open(RESULTS) as f:
    section = _sections(f.read(), "School: what closes FedAvg's gap")
  quoted = re.findall(r"^\| (per silo|public ranges) \| [^|]+ \| (-\d\.\d+) \| "
                      r"(\[[^]]+\]) \| (\d) of 5 \|$", section, re.M)
  assert len(quoted) == 3
  features = {"per silo": "silo", "public ranges": "public"}
  for name, mean, interval, better in quoted:
    assert re.search(rf"\| 6 \| {features[name]} \| 5 \| {mean} \| {re.escape(interval)}"
                     rf" \| {better} of 5 \|", done.stdout), (name, mean, interval)
