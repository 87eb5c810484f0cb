"""benchmarks/README.md's flag tables agree with the flag definitions; `--help` of
each binary lists every flag it accepts but the internal ones; no default output
path lies outside --output_dir's default."""

import glob
import os

import pytest

from benchmarks import common, flag_docs

pytestmark = pytest.mark.cli   # the tables are read from a subprocess per binary


@pytest.fixture(scope="module")
def found():
  return flag_docs.every_binary()


def test_the_readme_tables_agree_with_the_flags(found):
  with open(flag_docs.README) as f:
    text = f.read()
  assert flag_docs.marked(text) == list(flag_docs.BINARIES)
  tables = {name: flag_docs.table(flags["listed"]) for name, flags in found.items()}
  assert flag_docs.rendered(text, tables) == text, (
      "run `uv run python -m benchmarks.flag_docs`")


def test_a_changed_flag_makes_the_tables_disagree(found):
  listed = [dict(f) for f in found["run"]["listed"]]
  next(f for f in listed if f["name"] == "rounds")["help"] = "Something else."
  with open(flag_docs.README) as f:
    text = f.read()
  tables = {name: flag_docs.table(flags["listed"]) for name, flags in found.items()}
  assert flag_docs.rendered(text, dict(tables, run=flag_docs.table(listed))) != text


def test_help_lists_every_flag_but_the_internal_ones(found):
  for binary, flags in found.items():
    listed = {f["name"] for f in flags["listed"]}
    for module, names in flags["defined"].items():
      if "internal" in module:
        assert not listed & set(names), (binary, module)
      else:
        assert set(names) <= listed, (binary, module, set(names) - listed)


def test_no_default_path_lies_outside_the_output_folder(found):
  for binary, flags in found.items():
    for f in flags["listed"]:
      default = f["default"]
      if isinstance(default, str) and os.sep in default:
        assert default.startswith(common.OUTPUT_DIR), (binary, f["name"], default)


def _source(root, binary):
  """The file of binary `binary`: its module, or its package's `__init__.py`."""
  path = os.path.join(root, binary + ".py")
  return path if os.path.exists(path) else os.path.join(root, binary, "__init__.py")


def test_every_binary_has_a_table():
  root = os.path.dirname(flag_docs.README)
  binaries = set()
  for path in (glob.glob(os.path.join(root, "*.py"))
               + glob.glob(os.path.join(root, "*", "__main__.py"))):
    with open(path) as f:
      if "\n  common.run_main(" in f.read():
        name = os.path.basename(path)
        binaries.add(os.path.basename(os.path.dirname(path)) if name == "__main__.py"
                     else os.path.splitext(name)[0])
  assert binaries == set(flag_docs.BINARIES)


def test_help_examples_keep_their_line_breaks():
  """A `\\` ending a line of a non-raw docstring joins the lines: `--help` would
  print one long command with a run of spaces in it."""
  import ast
  import re
  root = os.path.dirname(flag_docs.README)
  for name in flag_docs.BINARIES:
    with open(_source(root, name)) as f:
      doc = ast.get_docstring(ast.parse(f.read()), clean=False)
    assert not re.search(r"\S {3,}--", doc), name
