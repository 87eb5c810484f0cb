"""The fidelity map at the top of benchmarks/RESULTS.md (issue 56 item 1): it covers
every result of every seed, each command parses with today's flags, each file and
section it names exists, and RESULTS.md holds the map `benchmarks.fidelity` writes."""

import os
import re

import pytest

from benchmarks import fidelity

# The seeds' numbered results, by seed: the thesis' lists of figures and tables less
# its illustrations (Fig. 1.1, 2.1-2.7, B.1) and its design table (Table 2.1); Galli
# et al.'s figures and tables of results; UDP-Alg's result figures.
RESULTS_OF_SEEDS = {
    "thesis ch. 1": ["Fig. 1.2", "Fig. 1.3(a)", "Fig. 1.3(b)", "Fig. 1.3(c)",
                     "Fig. 1.3(d)", "Fig. 1.4", "Fig. 1.5", "Fig. 1.6", "Fig. 1.7",
                     "Theorem 1.6.3", *(f"Fig. G.{i}" for i in range(1, 8))],
    "thesis ch. 2": ["Table 2.2", "Table 2.3", "Table 2.4", "Table 2.5", "Table 2.6",
                     "Fig. 2.8", "Fig. 2.9", "Fig. 2.10"],
    "Galli et al.": ["Fig. 1", "Fig. 2", "Table 3", "Fig. 3", "Fig. 4", "Table 4",
                     "Fig. 5"],
    "HyperNetFL, UDP-Alg": ["Fig. 2", "Fig. 3"],
    "DLG / iDLG": ["Zhu et al.", "Zhao et al."],
}


def _results():
  with open(fidelity.RESULTS) as f:
    return f.read()


def test_the_map_covers_every_result_of_every_seed():
  items = fidelity.entries()
  assert {item["seed"] for item in items} == set(RESULTS_OF_SEEDS)
  for seed, labels in RESULTS_OF_SEEDS.items():
    named = [item["result"] for item in items if item["seed"] == seed]
    missing = [label for label in labels
               if not any(re.search(re.escape(label) + r"(?![\d.])", n) for n in named)]
    assert not missing, (seed, missing)


def test_every_file_and_section_the_map_names_exists_and_results_holds_the_map():
  results, items = _results(), fidelity.entries()
  assert fidelity.check(items, results) == []
  block = fidelity.rendered(items, results)
  assert block in results, "run python -m benchmarks.fidelity"
  assert results.index(block) < results.index("\n## ", results.index("## The map"))


def test_the_commands_of_code_blocks_are_read_whole_and_shell_is_left_out():
  text = ("Text python -m benchmarks.run --rounds=1\n\n"
          "    uv run python -m benchmarks.run --methods=mrmtl \\\n"
          "        --lams=1   # a comment\n"
          "    python -m benchmarks.compare --seeds=$s\n"
          "    R=\"python -m benchmarks.run --rounds=2\"\n"
          "    python -m benchmarks.summarize a.csv | head\n"
          "    python -m benchmarks.run ... --output=x.csv\n")
  assert fidelity.commands_in(text) == [
      "python -m benchmarks.run --methods=mrmtl --lams=1"]


def test_check_names_what_would_make_the_map_lie():
  good = dict(seed="s", result="Fig. 1", claim="c", here="h", scale="1 seed",
              paper_scale="5 seeds", verdict="reproduced", section="Theory",
              commands=["python -m benchmarks.tuning_cost"])
  results = "## Theory (tests)\n"
  assert fidelity.check([good], results) == []
  bad = [dict(good, verdict="close"), dict(good, verdict="partly"),
         dict(good, section="Nowhere"), dict(good, rows=["benchmarks/results/no.csv"]),
         dict(good, figure="benchmarks/figures/no.png"), dict(good, colour="red"),
         {k: v for k, v in good.items() if k != "claim"},
         {k: v for k, v in good.items() if k != "commands"}]
  problems = [fidelity.check([item], results) for item in bad]
  expected = ["verdict must be one of", "a verdict of partly needs its why",
              "no section 'Nowhere'", "no.csv does not exist", "no.png does not exist",
              "unknown field colour", "no claim", "needs its section and commands"]
  for found, text in zip(problems, expected):
    assert len(found) == 1 and text in found[0], (text, found)
  assert fidelity.anchor("School, the harness (thesis Fig. 1.3(b), G.3)") == \
      "school-the-harness-thesis-fig-13b-g3"


@pytest.mark.cli
def test_every_command_of_the_map_and_the_docs_parses_and_a_wrong_one_does_not():
  """The map's commands and those of RESULTS.md's and the READMEs' code blocks (a
  reader copies them) parse with today's flags."""
  commands = [c for item in fidelity.entries() for c in item.get("commands", [])]
  for name in ("README.md", "benchmarks/README.md", "benchmarks/RESULTS.md"):
    with open(os.path.join(fidelity.ROOT, name)) as f:
      commands += fidelity.commands_in(f.read())
  assert len(commands) > 100
  wrong = ["python -m benchmarks.run --algorithm=mrmtl",   # renamed
           "python -m benchmarks.compare --methods=sgd",   # no such method
           "python -m benchmarks.run --lams=a",            # not a number
           "python -m benchmarks.run --rounds=0",          # out of its range
           "python -m benchmarks.run extra",               # an argument
           "pytest tests/no_such_test.py", "ls"]
  bad = fidelity.unparsed(commands + wrong)
  assert len(bad) == len(wrong), bad
  for line, command in zip(sorted(bad), sorted(wrong)):
    assert line.startswith(command), (line, command)
