"""The flag tables of `benchmarks/README.md`, generated from the binaries' own flag
definitions: the flags `--help` lists (each binary's, the groups it shares with
others included); internal flags are left out, as `--help` leaves them.

    uv run python -m benchmarks.flag_docs           # rewrites the tables in place
    uv run python -m benchmarks.flag_docs --check   # exit 1 if they disagree

A table sits between `<!-- flags: BINARY -->` and `<!-- end flags -->`.
"""

import concurrent.futures
import json
import os
import re
import sys

from absl import app
from absl import flags

BINARIES = ("compare", "run", "hypernet", "attacks", "pandemic", "audit", "tuning_cost",
            "speed", "summarize")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "benchmarks", "README.md")
_TABLE = re.compile(r"(<!-- flags: (\w+) -->\n)(.*?)(<!-- end flags -->)", re.S)

# Run in a fresh interpreter per binary: each defines its flags on absl's global
# registry, where two binaries' flags of one name would collide.
_DUMP = r"""
import importlib, json, sys
from absl import flags
module = importlib.import_module("benchmarks." + sys.argv[1])
def described(f):
  default = ",".join(map(str, f.default)) if isinstance(f.default, list) else f.default
  return dict(name=f.name, default=default, help=f.help)
by_module = flags.FLAGS.flags_by_module_dict()
print(json.dumps(dict(
    listed=[described(f) for f in flags.FLAGS.get_key_flags_for_module(module.__name__)],
    defined={name: [f.name for f in fs] for name, fs in by_module.items()
             if name.startswith("benchmarks")})))
"""

flags.DEFINE_bool("check", False, "Only compare: exit 1 when a table disagrees.")
FLAGS = flags.FLAGS


def binary_flags(binary: str) -> dict:
  """{"listed": the flags `--help` of benchmarks.<binary> lists (name, default, help),
  "defined": every flag the project's modules defined in it, by module}."""
  from benchmarks import common
  done = common.binary_interpreter(_DUMP, binary)
  if done.returncode:
    raise RuntimeError(f"benchmarks.{binary}'s flags: {done.stderr.strip()[-500:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def every_binary() -> dict:
  """`binary_flags` of every binary, read side by side."""
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return dict(zip(BINARIES, pool.map(binary_flags, BINARIES)))


def _cell(text) -> str:
  return "" if text is None or text == "" else str(text).replace("|", "\\|")


def table(listed) -> str:
  """The markdown table of flags `listed` (`binary_flags`), by name."""
  lines = ["| flag | default | what it sets |", "|---|---|---|"]
  for f in sorted(listed, key=lambda f: f["name"]):
    default = f["default"]
    shown = "" if default is None else f"`{_cell(default)}`"
    lines.append(f"| `--{f['name']}` | {shown} | {_cell(f['help'])} |")
  return "\n".join(lines) + "\n"


def rendered(text: str, tables: dict) -> str:
  """`text` with every marked table replaced by the binary's from `tables`."""
  def replace(match):
    return match.group(1) + tables[match.group(2)] + match.group(4)
  return _TABLE.sub(replace, text)


def marked(text: str) -> list:
  """The binaries whose tables `text` marks, in order."""
  return [m.group(2) for m in _TABLE.finditer(text)]


def main(argv):
  del argv
  with open(README) as f:
    text = f.read()
  tables = {name: table(found["listed"]) for name, found in every_binary().items()}
  missing = sorted(set(BINARIES) - set(marked(text)))
  if missing:
    sys.exit(f"{README} has no table for {', '.join(missing)}")
  new = rendered(text, tables)
  if FLAGS.check:
    if new != text:
      sys.exit(f"{README}: the flag tables disagree with the flags; run "
               "`uv run python -m benchmarks.flag_docs`")
    print("the flag tables agree with the flags")
    return
  with open(README, "w") as f:
    f.write(new)
  print(f"{README}: {len(tables)} flag tables written")


if __name__ == "__main__":
  app.run(main)
