"""The method registry: importable without TensorFlow, every entry buildable, and a
new member of the MR-MTL family one entry."""

import ast
import importlib
import pathlib
import sys

import pytest

from tff_silo import algorithms, models
from tff_silo.algorithms import methods

COMMON = dict(client_learning_rate=0.1, batch_size=4)


def test_the_registry_imports_the_standard_library_only():
  tree = ast.parse(pathlib.Path(methods.__file__).read_text())
  imported = {alias.name.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.Import) for alias in node.names}
  imported |= {node.module.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.level == 0}
  assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


@pytest.mark.parametrize("name", sorted(methods.REGISTRY))
def test_every_entry_is_consistent(name):
  method = methods.REGISTRY[name]
  assert method.name == name and method.kind in methods.KINDS
  assert method.privacy_unit in ("example", "user")
  assert (method.after is not None) == (method.kind == "ifca")
  if method.after is not None:
    assert methods.REGISTRY[method.after].kind == "silo"
  if method.module is not None:   # its builder is where `algorithms` looks for it
    module = importlib.import_module(f"tff_silo.algorithms.{method.module}")
    assert callable(getattr(module, f"{method.module}_algorithm"))
    assert getattr(algorithms, f"{method.module}_algorithm") is getattr(
        module, f"{method.module}_algorithm")


def test_names_selects_by_field_and_refuses_an_unknown_one():
  assert methods.names(kind="ifca", lam=True) == ("ifca_mrmtl",)
  assert "mocha" not in methods.names(aggregated=True)
  with pytest.raises(ValueError, match="no Method field colour"):
    methods.names(colour="red")


def test_a_new_family_member_is_one_registry_entry(monkeypatch):
  """An entry naming an MR-MTL-family module is built by `silo_definition` with the
  lambda it is given (here a second name for MR-MTL's module)."""
  model = models.linear_regression(3)
  monkeypatch.setitem(methods.REGISTRY, "mrmtl_again",
                      methods.Method("mrmtl_again", "silo", "mrmtl", lam=True))
  built = algorithms.silo_definition("mrmtl_again", model, (3,), rounds=4, lam=0.3,
                                     **COMMON)
  assert built == algorithms.silo_definition("mrmtl", model, (3,), rounds=4, lam=0.3,
                                             **COMMON)
  assert built != algorithms.silo_definition("mrmtl", model, (3,), rounds=4, lam=0.6,
                                             **COMMON)


def test_a_method_built_elsewhere_is_not_a_silo_definition():
  with pytest.raises(ValueError, match="unknown method 'hypernet'; one of local"):
    algorithms.silo_definition("hypernet", models.linear_regression(3), (3,),
                               rounds=1, **COMMON)
