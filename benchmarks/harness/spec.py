"""A binary's settings declared once: each field carries its flag (type, default,
help, allowed values, range), what it applies to, whether a row's `flags` record
names it and how it enters the run key. From one `Spec` come the absl flags, the
checks of what was given (one-line `UsageError`s), the `flags` record and the key.

    SPEC = spec.Spec(
        methods=spec.strings(["local"], "Algorithms.", choices=NAMES),
        finetune_fraction=spec.real(0.5, "Fraction of rounds FedAvg runs.",
                                    bounds="[0, 1]", applies_to=("finetune",),
                                    key="where_applies"))
    SPEC.define()                # at import, in the binary's module
    SPEC.check_choices()         # after parsing; then what was given for nothing:
    SPEC.check_applies(FLAGS.methods, FLAGS.dataset, private=...)
    values = SPEC.values()       # {name: value}, lists as tuples
    SPEC.check_ranges(values)    # with presets filled in, lists parsed
    SPEC.key(settings, method)   # the settings a run of `method` depends on

Groups of settings that several binaries share are dicts of `Param`s
(`benchmarks.common`'s `*_group`), which a `Spec` takes in (`options` changes them).
Imports no TensorFlow (absl only), nor any other module of `benchmarks`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from typing import Any, Callable, Optional

from absl import flags


class UsageError(ValueError):
  """A bad flag or input; reported as one line."""


KINDS = ("string", "integer", "float", "bool", "list")
KEYS = ("always", "where_applies", "only_where_applies")
# Every range a `Spec` declared in absl's flags, by flag: (its text, the module
# that declared it); and every output path whose default is a file under
# --output_dir, by flag: that file (`common.resolve_output_flags` fills them in).
RANGES = {}
OUTPUTS = {}


@dataclasses.dataclass(frozen=True)
class Param:
  """One setting and its flag.

  kind: one of KINDS; a list's items are `item`s (str, int or float), parsed,
    finite and (where `unique`: a grid would run a repeat twice) distinct. help may
    name `{choices}`.
  bounds: a range `>= 1`, `> 0`, `(0, 1]` ... of the value (each item of a list),
    added to the help and checked.
  applies_to: the methods it affects; given for none of --methods, an error.
  datasets: the datasets it affects; given for another --dataset, an error.
  private: a setting of DP runs; given without --epsilon, an error.
  when: a further condition (of the settings) for it to apply to a run.
  given: a row's `flags` record names it. key: how it enters the run key: always,
    where_applies (its value where it applies to the run, else None),
    only_where_applies (present where it applies), or None (not at all); under its
    own name, or `key_as` (a key's name from before a flag was renamed).
  output: a path whose default (unset) is this file or folder under --output_dir.
  """
  kind: str
  default: Any
  help: str
  item: type = str
  choices: Optional[tuple] = None
  bounds: Optional[str] = None
  applies_to: Optional[tuple] = None
  datasets: Optional[tuple] = None
  private: bool = False
  when: Optional[Callable] = None
  given: bool = True
  key: Optional[str] = None
  key_as: Optional[str] = None
  unique: bool = True
  output: Optional[str] = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}; got {self.kind!r}")
    if self.key is not None and self.key not in KEYS:
      raise ValueError(f"key must be one of {KEYS} or None; got {self.key!r}")
    if self.bounds is not None:
      interval(self.bounds)   # a malformed range fails at declaration

  def text(self) -> str:
    """The flag's help: with its choices and range."""
    text = self.help.format(choices=", ".join(self.choices or ()))
    if self.output is not None:
      where = "--output_dir" if self.output == "." else f"--output_dir/{self.output}"
      text += f" (default: {where})"
    return text + (f" Range: {self.bounds}." if self.bounds else "")


def string(default, help, **options) -> Param:
  return Param("string", default, help, **options)


def integer(default, help, **options) -> Param:
  return Param("integer", default, help, **options)


def real(default, help, **options) -> Param:
  return Param("float", default, help, **options)


def boolean(default, help, **options) -> Param:
  return Param("bool", default, help, **options)


def options(group: dict, **changes) -> dict:
  """The `Param`s of `group` with `changes` (`given=False`, `applies_to=...`)."""
  return {name: dataclasses.replace(param, **changes) for name, param in group.items()}


def strings(default, help, **options) -> Param:
  return Param("list", default, help, item=str, **options)


def numbers(default, help, item=float, **options) -> Param:
  return Param("list", default, help, item=item, **options)


def interval(text: str):
  """A test of one value for a range written `>= 1`, `> 0`, `(0, 1)`, `[0, 1)` ..."""
  one_sided = re.fullmatch(r"(>=|>)\s*(\S+)", text)
  if one_sided:
    bound = float(one_sided[2])
    return (lambda v: v >= bound) if one_sided[1] == ">=" else (lambda v: v > bound)
  two_sided = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", text)
  if not two_sided:
    raise ValueError(f"a range is written '>= a', '> a', '(a, b)', '[a, b]' ...; "
                     f"got {text!r}")
  lo_kind, lo, hi, hi_kind = two_sided.groups()
  lo, hi = float(lo), float(hi)
  return lambda v: ((v >= lo if lo_kind == "[" else v > lo)
                    and (v <= hi if hi_kind == "]" else v < hi))


def check_range(name: str, text: str, value) -> None:
  """UsageError unless `value` of --name (a number, or a list's parsed items; None
  passes) is within the range `text` (`interval`)."""
  if value is None:
    return
  items = list(value) if isinstance(value, (list, tuple)) else [value]
  if any(isinstance(v, str) for v in items):
    raise TypeError(f"check_range: give --{name}'s parsed values")
  inside = interval(text)
  if not all(inside(v) for v in items):
    shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in items)
    raise UsageError(f"--{name} must be {'in ' if text[0] in '[(' else ''}{text}; "
                     f"got {shown}")


def parse_items(name: str, values, item: type, unique: bool = True) -> list:
  """A list flag's `values` as `item`s: finite and (where `unique`: a grid would
  run a repeat twice) distinct; UsageError naming --name otherwise."""
  try:
    parsed = [item(v) for v in values]
  except ValueError:
    raise UsageError(f"--{name} must be a comma-separated list of {item.__name__}s, "
                     f"got {','.join(values)}") from None
  if item is not str and any(not math.isfinite(v) for v in parsed):
    raise UsageError(f"--{name} must hold finite numbers; got {','.join(values)}")
  if unique:
    check_unique(name, parsed)
  return parsed


def check_unique(name: str, values) -> None:
  """UsageError if list flag --name names a value twice (it would run twice)."""
  seen = set()
  for value in values:
    if value in seen:
      raise UsageError(f"--{name} lists {value} twice")
    seen.add(value)


def calling_module(depth: int = 2) -> str:
  """The name absl files a flag under when the module `depth` frames up defines it
  (a `__main__`: by its file)."""
  name = sys._getframe(depth).f_globals["__name__"]
  return sys.argv[0] if name == "__main__" else name


_DEFINE = {"string": flags.DEFINE_string, "integer": flags.DEFINE_integer,
           "float": flags.DEFINE_float, "bool": flags.DEFINE_bool,
           "list": flags.DEFINE_list}


class Spec:
  """Named `Param`s, in the order a row's `flags` record lists them."""

  def __init__(self, *groups: dict, **params: Param):
    self.params = {}
    for group in (*groups, params):
      for name, param in group.items():
        if name in self.params:
          raise ValueError(f"setting {name!r} is declared twice")
        self.params[name] = param

  def define(self, flag_values=flags.FLAGS, module_name: Optional[str] = None) -> None:
    """Defines every setting's flag in `flag_values`, as the calling module's (the
    binary's: its --help lists them)."""
    module_name = module_name or calling_module()
    for name, param in self.params.items():
      if flag_values is flags.FLAGS:   # (a test's own FlagValues: not the binary's)
        if param.bounds is not None:
          RANGES[name] = (param.bounds, module_name)
        if param.output is not None:
          OUTPUTS[name] = param.output
      _DEFINE[param.kind](name, param.default, param.text(), flag_values=flag_values,
                          module_name=module_name)

  def values(self, flag_values=flags.FLAGS) -> dict:
    """The settings as given or defaulted; a list's raw items as a tuple."""
    return {name: tuple(flag_values[name].value)
            if isinstance(flag_values[name].value, list) else flag_values[name].value
            for name in self.params}

  def given(self, flag_values=flags.FLAGS) -> str:
    """A row's `flags` record: the settings it names, as given or defaulted (JSON)."""
    return json.dumps({name: value for name, value in self.values(flag_values).items()
                       if self.params[name].given})

  def parsed(self, name: str, flag_values=flags.FLAGS):
    """List setting `name`'s items parsed (`parse_items`), None when unset."""
    param, raw = self.params[name], flag_values[name].value
    return None if raw is None else tuple(parse_items(name, raw, param.item,
                                                      param.unique))

  def check_choices(self, flag_values=flags.FLAGS) -> None:
    """UsageError for a value outside its setting's choices."""
    for name, param in self.params.items():
      value = flag_values[name].value
      if param.choices is None or value is None:
        continue
      if param.kind == "list":   # (given empty: `common.check_given_lists`)
        if any(v not in param.choices for v in value):
          raise UsageError(f"--{name} must be among {', '.join(param.choices)}; got "
                           f"{','.join(value)}")
        parse_items(name, value, str)
      elif value not in param.choices:
        raise UsageError(f"--{name} must be one of {', '.join(param.choices)}; got "
                         f"{value!r}")

  def check_ranges(self, resolved: dict, flag_values=flags.FLAGS) -> None:
    """UsageError for the first setting out of its range: its value in `resolved`
    (a number, or a list's items; a preset filled in) or else the flag's."""
    for name, param in self.params.items():
      if param.bounds is None:
        continue
      value = resolved[name] if name in resolved else flag_values[name].value
      if param.kind == "list" and value and isinstance(value[0], str):
        value = self.parsed(name, flag_values)   # as given: parsed here
      check_range(name, param.bounds, value)

  def check_applies(self, methods, dataset, private: bool = True,
                    flag_values=flags.FLAGS) -> None:
    """UsageError for a setting given that affects none of the runs asked for: none
    of `methods`, not `dataset`, or a DP setting without DP (not `private`)."""
    for name, param in self.params.items():
      if not flag_values[name].present:
        continue
      if param.applies_to is not None and not set(param.applies_to) & set(methods):
        raise UsageError(f"--{name} applies to --methods={','.join(param.applies_to)} "
                         f"only; not to --methods={','.join(map(str, methods))}")
      if param.datasets is not None and dataset not in param.datasets:
        raise UsageError(f"--{name} applies to --dataset={','.join(param.datasets)} "
                         f"only; not to --dataset={dataset}")
      if param.private and not private:
        raise UsageError(f"--{name} applies to private runs only: give --epsilon, or "
                         f"drop --{name}")

  def applies(self, name: str, settings, method: str) -> bool:
    """Whether setting `name` affects a run of `method` under `settings` (an object
    with the settings as attributes)."""
    param = self.params[name]
    return ((param.applies_to is None or method in param.applies_to)
            and (param.datasets is None or settings.dataset in param.datasets)
            and (param.when is None or param.when(settings)))

  def key(self, settings, method: str) -> dict:
    """The settings a run of `method` depends on, by their `key`: part of its run
    key (which the binary completes with what is not a setting)."""
    key = {}
    for name, param in self.params.items():
      if param.key is None:
        continue
      applies = param.key == "always" or self.applies(name, settings, method)
      if applies:
        key[param.key_as or name] = getattr(settings, name)
      elif param.key == "where_applies":
        key[param.key_as or name] = None
    return key

  def settings_class(self, name: str, *extra: tuple, module: str):
    """A frozen dataclass with a field per setting (then the `extra` fields,
    `(name, type[, field])`): a binary's settings after its checks."""
    fields = [(n, Any) for n in self.params] + list(extra)
    return dataclasses.make_dataclass(name, fields, frozen=True,
                                      namespace={"__module__": module})
