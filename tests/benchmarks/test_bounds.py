"""Flag ranges (a `Spec`'s `bounds`, `common.check_bounds`): one declaration with the
flag, named in its help, checked in one call with the one-line message."""

import pytest
from absl import flags
from absl.testing import flagsaver

from benchmarks import common
from benchmarks.harness import spec

FLAGS = flags.FLAGS
spec.Spec(
    bounds_test_count=spec.integer(3, "A count.", bounds=">= 1"),
    bounds_test_share=spec.real(0.5, "A share.", bounds="(0, 1]"),
    bounds_test_unset=spec.real(None, "Unset by default.", bounds="> 0"),
    bounds_test_values=spec.numbers(["1", "2"], "Values.", bounds="> -1"),
).define()


@pytest.fixture(autouse=True)
def _parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()


def _check(**values):
  common.check_bounds(**{"bounds_test_values": [1.0, 2.0], **values})


@pytest.mark.parametrize("text, inside, outside", [
    (">= 1", [1, 2, 1e9], [0, 0.999, -1]),
    ("> 0", [1e-12, 3], [0, -1e-12]),
    ("> -1", [-0.5, 0], [-1, -2]),
    ("(0, 1)", [1e-9, 0.5, 0.999], [0, 1, 2]),
    ("(0, 1]", [1, 0.5], [0, 1.0001]),
    ("[0, 1]", [0, 1], [-1e-9, 1.5]),
    ("(0, 0.5)", [0.25], [0.5, 0]),
])
def test_a_range_admits_exactly_its_values(text, inside, outside):
  test = spec.interval(text)
  assert all(test(v) for v in inside) and not any(test(v) for v in outside)


def test_the_range_is_named_in_the_flags_help():
  assert FLAGS["bounds_test_share"].help == "A share. Range: (0, 1]."


def test_values_in_range_pass_and_unset_flags_are_not_checked():
  _check()
  with flagsaver.flagsaver(bounds_test_count=1, bounds_test_share=1.0):
    _check()


@pytest.mark.parametrize("overrides, values, message", [
    (dict(bounds_test_count=0), {}, "--bounds_test_count must be >= 1; got 0"),
    (dict(bounds_test_share=0.0), {}, "--bounds_test_share must be in (0, 1]; got 0"),
    (dict(bounds_test_unset=-2.0), {}, "--bounds_test_unset must be > 0; got -2"),
    ({}, dict(bounds_test_values=[0.5, -1.0]), "--bounds_test_values must be > -1; "
     "got 0.5,-1"),
    # a setting resolved elsewhere (a preset) is checked instead of the flag
    ({}, dict(bounds_test_count=0), "--bounds_test_count must be >= 1; got 0"),
])
def test_a_value_out_of_range_is_a_one_line_usage_error(overrides, values, message):
  with flagsaver.flagsaver(**overrides):
    with pytest.raises(common.UsageError) as raised:
      _check(**values)
  assert str(raised.value) == message


def test_a_list_flag_must_be_given_parsed():
  with pytest.raises(TypeError, match="parsed values"):
    common.check_bounds()   # bounds_test_values still holds strings


def test_another_modules_ranges_are_left_to_it():
  # `check_bounds` from a module that defined no range checks nothing of ours
  namespace = {"__name__": "some_other_binary", "common": common}
  with flagsaver.flagsaver(bounds_test_count=0):
    exec("common.check_bounds()", namespace)
    with pytest.raises(common.UsageError):
      exec("common.check_bounds('bounds_test_count')", namespace)
