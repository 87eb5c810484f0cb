"""The fidelity map at the top of `benchmarks/RESULTS.md` (issue 56 item 1): one row
per result of every seed, with its command, committed rows and figure, the scale
run against the paper's, and the verdict, written from `benchmarks/fidelity.toml`.

    uv run python -m benchmarks.fidelity           # rewrites the map in RESULTS.md
    uv run python -m benchmarks.fidelity --check   # exit 1 if it disagrees

The map sits between `<!-- map -->` and `<!-- end map -->`. `check` finds what
would make it lie: a missing file or section, a verdict outside VERDICTS, a verdict
other than reproduced without its reason; `unparsed` parses every command with its
binary's own flags (tests/benchmarks/test_fidelity.py runs both).
"""

import collections
import json
import os
import re
import shlex
import sys

try:
  import tomllib
except ModuleNotFoundError:   # Python < 3.11: the same reader, which pytest installs
  import tomli as tomllib

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAP = os.path.join(ROOT, "benchmarks", "fidelity.toml")
RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS.md")
VERDICTS = ("reproduced", "partly", "differs", "absent")
REQUIRED = ("seed", "result", "claim", "here", "scale", "paper_scale", "verdict")
OPTIONAL = ("also", "why", "section", "commands", "rows", "figure")
_BLOCK = re.compile(r"<!-- map -->\n.*?<!-- end map -->", re.S)


def entries(path: str = MAP) -> list:
  """The map's entries (dicts), in the file's order."""
  with open(path, "rb") as f:
    return tomllib.load(f)["result"]


def headings(text: str) -> list:
  """Every markdown heading of `text`: (start, level, title)."""
  return [(m.start(), len(m.group(1)), m.group(2))
          for m in re.finditer(r"^(#+) (.*)$", text, re.M)]


def sections(text: str, title: str) -> str:
  """The sections of markdown `text` whose heading starts with `title`, each up to
  the next heading of its level or above."""
  found = headings(text)
  out = []
  for i, (start, level, heading) in enumerate(found):
    if heading.startswith(title):
      end = next((s for s, l, _ in found[i + 1:] if l <= level), len(text))
      out.append(text[start:end])
  return "".join(out)


_COMMAND = re.compile(r"(?:uv run )?(python -m benchmarks\.\w+.*)")


def commands_in(markdown: str) -> list:
  """The `python -m benchmarks.<binary>` commands of `markdown`'s indented code
  blocks, continued lines joined and comments dropped; those with shell syntax
  (`$p`, a pipe, a redirection, a quoted assignment) or elisions (`...`) left out:
  they are not one command."""
  out, current = [], None
  for line in markdown.split("\n"):
    if current is None:
      found = _COMMAND.search(line) if line.startswith("    ") else None
      if not found or line[:found.start()].endswith(("=", "'", '"')):
        continue   # (a command inside a shell variable is not one to run as it is)
      current, text = "", found.group(1)
    else:
      text = line.strip()
    text = text.split(" #")[0].rstrip()
    current += " " + text.rstrip("\\").strip()
    if not text.endswith("\\"):
      out.append(current.strip())
      current = None
  return [c for c in out if not re.search(r"[$|<>;`]|\.\.\.", c)]


def anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as -."""
  return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def check(items: list, results: str) -> list:
  """What is wrong with the map's `items` against RESULTS.md's text `results`: one
  line per problem (none: the map holds)."""
  problems = []
  titles = [title for _, _, title in headings(results)]
  for item in items:
    name = f"{item.get('seed')}, {item.get('result')}"
    problems += [f"{name}: no {field}" for field in REQUIRED if not item.get(field)]
    problems += [f"{name}: unknown field {field}" for field in item
                 if field not in REQUIRED + OPTIONAL]
    if item.get("verdict") not in VERDICTS:
      problems.append(f"{name}: verdict must be one of {', '.join(VERDICTS)}")
    elif item["verdict"] != "reproduced" and not item.get("why"):
      problems.append(f"{name}: a verdict of {item.get('verdict')} needs its why")
    if item.get("verdict") != "absent" and not (item.get("section")
                                                and item.get("commands")):
      problems.append(f"{name}: a result that was run needs its section and commands")
    section = item.get("section")
    if section and not any(t.startswith(section) for t in titles):
      problems.append(f"{name}: RESULTS.md has no section {section!r}")
    for path in list(item.get("rows", [])) + [item.get("figure")] * ("figure" in item):
      if not os.path.isfile(os.path.join(ROOT, path)):
        problems.append(f"{name}: {path} does not exist")
  return problems


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _linked(item: dict, titles: list) -> str:
  label = item["result"] + (f" ({item['also']})" if item.get("also") else "")
  heading = next((t for t in titles if item.get("section")
                  and t.startswith(item["section"])), None)
  return f"[{label}](#{anchor(heading)})" if heading else label


def rendered(items: list, results: str) -> str:
  """The map's markdown block (markers included): the verdict table, then each
  result's commands, rows and figure."""
  titles = [title for _, _, title in headings(results)]
  counts = collections.Counter(item["verdict"] for item in items)
  committed = sum(bool(item.get("rows")) for item in items)
  lines = [
      "<!-- map -->",
      "Written by `python -m benchmarks.fidelity` from `benchmarks/fidelity.toml`; "
      f"{len(items)} results: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
      + f". {committed} of them have their rows committed (under `benchmarks/results/`,"
      " or beside their figure); the others' rows are what their commands write"
      " (under `benchmarks/out/`).",
      "",
      "| seed | result | the paper | here | scale here (paper) | verdict |",
      "|---|---|---|---|---|---|"]
  for item in items:
    verdict = f"**{item['verdict']}**" + (f": {item['why']}" if item.get("why") else "")
    lines.append("| " + " | ".join(_cell(c) for c in (
        item["seed"], _linked(item, titles), item["claim"], item["here"],
        f"{item['scale']} ({item['paper_scale']})", verdict)) + " |")
  lines += ["", "| result | commands | rows | figure |", "|---|---|---|---|"]
  for item in items:
    if item["verdict"] == "absent" and not item.get("commands"):
      continue
    commands = "<br>".join(f"`{c}`" for c in item.get("commands", []))
    rows = ", ".join(f"[{os.path.basename(p)}]({os.path.relpath(p, 'benchmarks')})"
                     for p in item.get("rows", [])) or "not committed"
    figure = item.get("figure")
    shown = (f"[{os.path.basename(figure)}]({os.path.relpath(figure, 'benchmarks')})"
             if figure else "-")
    lines.append(f"| {item['seed']}, {item['result']} | {_cell(commands)} | {rows} | "
                 f"{shown} |")
  lines.append("<!-- end map -->")
  return "\n".join(lines)


# One interpreter per binary (each defines its flags on absl's global registry):
# parses every command of it as the binary would before its main runs.
_PARSE = r"""
import importlib, json, sys
from absl import flags
from benchmarks import common
from benchmarks.harness import spec as specs
module = importlib.import_module("benchmarks." + sys.argv[1])
spec = getattr(module, "SPEC", None)
bad = []
for argv in json.loads(sys.stdin.read()):
  try:
    flags.FLAGS.unparse_flags()
    rest = flags.FLAGS(["binary"] + argv)
    common.check_renamed_flags()
    common.check_finite_floats()
    common.check_given_lists()
    if spec is not None:
      spec.check_choices()
      for name, param in spec.params.items():
        if not flags.FLAGS[name].present:
          continue
        value = (spec.parsed(name) if param.kind == "list"
                 else flags.FLAGS[name].value)
        values = value if isinstance(value, tuple) else [value]
        if param.bounds and not any(isinstance(v, str) for v in values):
          specs.check_range(name, param.bounds, value)
    if len(rest) > 1 and sys.argv[1] != "summarize":
      raise ValueError(f"unexpected arguments {rest[1:]}")
  except Exception as e:
    bad.append(f"{' '.join(argv)}: {str(e).splitlines()[0] if str(e) else e!r}")
print(json.dumps(bad))
"""


def unparsed(commands: list) -> list:
  """The commands (`python -m benchmarks.<binary> ...` or `pytest <test file>`)
  that do not parse: one line each, naming the command and why."""
  by_binary, bad = collections.defaultdict(list), []
  for command in commands:
    words = shlex.split(command) + [""] * 3
    if words[:2] == ["python", "-m"] and words[2].startswith("benchmarks."):
      by_binary[words[2].split(".", 1)[1]].append(shlex.split(command)[3:])
    elif words[0] == "pytest" and len(shlex.split(command)) == 2:
      if not os.path.isfile(os.path.join(ROOT, words[1])):
        bad.append(f"{command}: no file {words[1]}")
    else:
      bad.append(f"{command}: neither a benchmarks binary nor pytest of one file")
  from benchmarks import common
  for binary, argvs in by_binary.items():
    done = common.binary_interpreter(_PARSE, binary, json.dumps(argvs))
    if done.returncode:
      bad.append(f"benchmarks.{binary}: {done.stderr.strip()[-300:]}")
    else:
      bad += [f"python -m benchmarks.{binary} {b}"
              for b in json.loads(done.stdout.strip().splitlines()[-1])]
  return bad


def main(argv):
  del argv
  items = entries()
  with open(RESULTS) as f:
    results = f.read()
  problems = check(items, results)
  if not _BLOCK.search(results):
    problems.append("RESULTS.md has no <!-- map --> ... <!-- end map --> block")
  if problems:
    sys.exit("\n".join(problems))
  block = rendered(items, results)
  updated = _BLOCK.sub(lambda _: block, results)
  if flags.FLAGS.check:
    if updated != results:
      sys.exit("the map in RESULTS.md disagrees with benchmarks/fidelity.toml: run "
               "python -m benchmarks.fidelity")
    return
  if updated != results:
    with open(RESULTS, "w") as f:
      f.write(updated)
    print(f"rewrote the map in {RESULTS}")


if __name__ == "__main__":   # (defined here: tests import the module beside flag_docs)
  flags.DEFINE_bool("check", False, "Only compare: exit 1 when the map in RESULTS.md "
                    "disagrees with benchmarks/fidelity.toml or the file is "
                    "inconsistent.")
  app.run(main)
