"""benchmarks.harness.spec: a binary's settings declared once. Pure Python: each test
defines a spec's flags in a FlagValues of its own and parses a command line."""

import json
import types

import pytest
from absl import flags

from benchmarks.harness import spec
from benchmarks.harness.spec import UsageError

METHODS = ("local", "fedavg", "finetune")


def _spec():
  return spec.Spec(
      methods=spec.strings(["local"], "Methods, of {choices}.", choices=METHODS),
      dataset=spec.string("digits", "One of {choices}.", choices=("digits", "school"),
                          key="always"),
      rounds=spec.integer(None, "Rounds.", bounds=">= 1", key="always"),
      lams=spec.numbers(None, "Lambdas.", bounds=">= 0"),
      clip=spec.real(None, "Clip.", bounds="> 0", private=True, key="always"),
      fraction=spec.real(0.5, "Fraction.", bounds="[0, 1]", applies_to=("finetune",),
                         key="where_applies"),
      patches=spec.real(0.1, "Patches.", datasets=("digits",), key="where_applies"),
      clusters=spec.integer(3, "Clusters.", applies_to=("fedavg",),
                            key="only_where_applies", when=lambda s: s.rounds > 1),
      output=spec.string("out.csv", "Where rows go.", given=False),
  )


def _parsed(argv, s=None):
  s = s or _spec()
  values = flags.FlagValues()
  s.define(values, module_name="binary")
  values(["binary", *argv])
  return s, values


def test_flags_come_with_their_help_choices_and_range():
  s, values = _parsed([])
  assert values["dataset"].help == "One of digits, school."
  assert values["fraction"].help == "Fraction. Range: [0, 1]."
  assert values["rounds"].value is None and values["fraction"].value == 0.5
  assert [f.name for f in values.get_key_flags_for_module("binary")] == list(s.params)


@pytest.mark.parametrize("argv, message", [
    (["--dataset=mnist"], "--dataset must be one of digits, school; got 'mnist'"),
    (["--methods=local,ditto"], "--methods must be among local, fedavg, finetune; got "
                                "local,ditto"),
    (["--methods=local,local"], "--methods lists local twice"),
])
def test_a_value_outside_the_choices_is_one_line(argv, message):
  s, values = _parsed(argv)
  with pytest.raises(UsageError, match=f"^{message}$"):
    s.check_choices(values)


@pytest.mark.parametrize("argv, resolved, message", [
    (["--rounds=0"], {}, "--rounds must be >= 1; got 0"),
    (["--fraction=1.5"], {}, "--fraction must be in [0, 1]; got 1.5"),
    (["--lams=1,-2"], {}, "--lams must be >= 0; got 1,-2"),
    ([], {"rounds": 0}, "--rounds must be >= 1; got 0"),   # a preset's value
])
def test_a_value_out_of_its_range_is_one_line(argv, resolved, message):
  s, values = _parsed(argv)
  with pytest.raises(UsageError) as raised:
    s.check_ranges(resolved, values)
  assert str(raised.value) == message


def test_values_in_range_and_unset_values_pass():
  s, values = _parsed(["--rounds=2", "--lams=0,1.5", "--fraction=1"])
  s.check_ranges({}, values)
  assert s.parsed("lams", values) == (0.0, 1.5)
  assert s.parsed("lams", _parsed([])[1]) is None


@pytest.mark.parametrize("argv, methods, dataset, private, message", [
    (["--fraction=0.2"], ["local", "fedavg"], "digits", False,
     "--fraction applies to --methods=finetune only; not to --methods=local,fedavg"),
    (["--patches=0.2"], ["local"], "school", False,
     "--patches applies to --dataset=digits only; not to --dataset=school"),
    (["--clip=1"], ["local"], "digits", False,
     "--clip applies to private runs only: give --epsilon, or drop --clip"),
])
def test_a_setting_given_for_nothing_it_affects_is_one_line(argv, methods, dataset,
                                                            private, message):
  s, values = _parsed(argv)
  with pytest.raises(UsageError) as raised:
    s.check_applies(methods, dataset, private, values)
  assert str(raised.value) == message


def test_a_default_is_never_refused_and_a_given_setting_that_applies_passes():
  s, values = _parsed(["--fraction=0.2", "--clip=1"])
  s.check_applies(["finetune"], "school", True, values)
  s, values = _parsed([])
  s.check_applies(["local"], "school", False, values)


def test_the_flags_record_names_the_given_settings_in_declaration_order():
  s, values = _parsed(["--methods=fedavg,local", "--rounds=4"])
  record = json.loads(s.given(values))
  assert list(record) == ["methods", "dataset", "rounds", "lams", "clip", "fraction",
                          "patches", "clusters"]   # not output
  assert record["methods"] == ["fedavg", "local"] and record["rounds"] == 4


def _settings(**changes):
  base = dict(methods=("local",), dataset="digits", rounds=2, lams=None, clip=1.0,
              fraction=0.5, patches=0.1, clusters=3, output="out.csv")
  return types.SimpleNamespace(**{**base, **changes})


def test_the_run_key_holds_each_setting_as_its_key_says():
  s = _spec()
  assert s.key(_settings(), "local") == dict(
      dataset="digits", rounds=2, clip=1.0, fraction=None, patches=0.1)
  assert s.key(_settings(dataset="school"), "finetune") == dict(
      dataset="school", rounds=2, clip=1.0, fraction=0.5, patches=None)
  assert s.key(_settings(), "fedavg")["clusters"] == 3   # only where it applies
  assert "clusters" not in s.key(_settings(rounds=1), "fedavg")   # `when` fails
  renamed = spec.Spec(lr=spec.real(0.1, "Step size.", key="always", key_as="client_lr"))
  assert renamed.key(types.SimpleNamespace(lr=0.5), "local") == {"client_lr": 0.5}


def test_the_settings_class_is_frozen_with_a_field_per_setting_and_the_extras():
  settings = _spec().settings_class("Settings", ("given", str), module=__name__)
  made = settings(**vars(_settings()), given="{}")
  with pytest.raises(AttributeError):
    made.rounds = 3
  assert made.given == "{}" and made.fraction == 0.5


def test_a_group_is_taken_in_with_options_and_its_paths_default_under_output_dir():
  group = dict(out=spec.string(None, "Rows.", output="rows.csv"),
               level=spec.real(0.5, "A share.", bounds="(0, 1)"))
  s = spec.Spec(_spec().params, **spec.options(group, given=False,
                                               applies_to=("fedavg",)))
  assert not s.params["out"].given and s.params["level"].applies_to == ("fedavg",)
  assert s.params["out"].text() == "Rows. (default: --output_dir/rows.csv)"
  _, values = _parsed(["--level=0.7"], s)
  with pytest.raises(UsageError, match="--level applies to --methods=fedavg only"):
    s.check_applies(["local"], "digits", False, values)
  assert "level" not in spec.RANGES   # a test's FlagValues registers nothing


def test_a_mistake_in_a_declaration_fails_at_import():
  with pytest.raises(ValueError, match="declared twice"):
    spec.Spec({"rounds": spec.integer(1, "R.")}, rounds=spec.integer(2, "R."))
  with pytest.raises(ValueError, match="a range is written"):
    spec.integer(1, "R.", bounds="at least 1")
  with pytest.raises(ValueError, match="key must be one of"):
    spec.integer(1, "R.", key="sometimes")


def test_the_harness_imports_absl_and_the_standard_library_only():
  """No TensorFlow, nothing of the project: flag checks cost no start-up."""
  import ast
  import pathlib
  import sys
  imported = set()
  for path in pathlib.Path(spec.__file__).parent.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        imported |= {alias.name.split(".")[0] for alias in node.names}
      elif isinstance(node, ast.ImportFrom):
        imported.add("." if node.level else node.module.split(".")[0])
  assert imported - set(sys.stdlib_module_names) == {"absl"}
