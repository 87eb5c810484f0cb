"""The silos of a `benchmarks.run` run from a recipe (a JSON-able dict), without
flags: the binary loads its data through it, and a saved run (`tff_silo.runs`)
stores the recipe instead of a copy of the data, so an attack can rebuild the very
same split (checked against the saved fingerprint) and tell members from
non-members.

Recipe keys: dataset (school, vehicle, gleam, digits, synthetic, two_cluster,
fmnist_rotated), seed,
data_dir, standardize (tabular: none, public, dp, silo), for `dp` standardize_clip,
standardize_noise_multiplier and neighbouring, mask_probability and test_fraction
(digits), corrupt_silos and corruption (misbehaving silos). A `benchmarks.compare` recipe has
preset_dataset (quick, digits, school, vehicle, fmnist, fmnist_hetero), seed,
data_dir, validation_fraction and optionally mask_probability (digits, fmnist): the
silos its trials train on (`compare_silos`).
A `benchmarks.hypernet` recipe has hypernet_dataset (digits, fmnist, cifar10, femnist),
seed, num_users, classes_per_user, data_dir and cache_dir: its users
(`hypernet_users`).

A loader's result is kept per process (`cached`): a binary loads its data once, and
a Ray worker (`benchmarks.executors`) loads it from the recipe on its first task,
checked against the digest the driver computed of its own copy (`expect`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math


_CACHE, _EXPECTED = {}, {}


class DataMismatch(ValueError):
  """A worker's data is not the driver's (a file differs between machines)."""


def _cache_key(loader, recipe: dict) -> tuple:
  return loader.__name__, json.dumps(recipe, sort_keys=True, default=str)


def cached(loader, recipe: dict):
  """`loader(recipe)` (a loader of this module), made once per process; checked
  against the digest `expect` registered for it (DataMismatch: the driver's data
  is not this machine's)."""
  key = _cache_key(loader, recipe)
  if key not in _CACHE:
    value = loader(recipe)
    expected = _EXPECTED.get(key)
    if expected is not None and digest(value) != expected:
      import socket   # pylint: disable=g-import-not-at-top
      raise DataMismatch(
          f"the data of {recipe} loaded on {socket.gethostname()} differs from the "
          "driver's: give every machine the same data files")
    _CACHE[key] = value
  return _CACHE[key]


def expect(loader, recipe: dict, expected: str) -> None:
  """Registers the digest `cached(loader, recipe)` must have in this process."""
  _EXPECTED[_cache_key(loader, recipe)] = expected


def travelling(loader, recipe: dict) -> tuple:
  """(loader name, recipe, digest of this process's `cached(loader, recipe)`): what
  a Ray task carries instead of the data (`benchmarks.executors.Work.data`)."""
  return loader.__name__, recipe, digest(cached(loader, recipe))


def digest(value) -> str:
  """SHA-256 of every array, number and string in `value` (nested tuples, lists,
  dicts and dataclasses such as `SiloData`), with their dtypes and shapes."""
  import numpy as np   # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()

  def walk(v):
    if isinstance(v, np.ndarray):
      a = np.ascontiguousarray(v)
      h.update(str((a.dtype.str, a.shape)).encode())
      h.update(a.tobytes())
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
      h.update(type(v).__name__.encode())
      for f in dataclasses.fields(v):
        walk(getattr(v, f.name))
    elif isinstance(v, (list, tuple)):
      h.update(f"[{len(v)}".encode())
      for item in v:
        walk(item)
    elif isinstance(v, dict):
      for k in sorted(v, key=str):
        h.update(str(k).encode())
        walk(v[k])
    else:   # numbers, strings, None; other objects by their type
      h.update(repr(v if isinstance(v, (int, float, str, bool, type(None), np.generic))
                    else type(v).__name__).encode())
  walk(value)
  return h.hexdigest()


def load(recipe: dict):
  """(silos, per-silo preprocessing DpEvents or None) of `recipe`; the first
  `corrupt_silos` silos misbehave. Raises DataError / ValueError in one line."""
  from tff_silo import data
  if "preset_dataset" in recipe:   # benchmarks.compare's: no preprocessing events
    return compare_silos(recipe), None
  if "hypernet_dataset" in recipe:
    return hypernet_users(recipe), None
  silos, events = _clean(recipe)
  corrupt = recipe.get("corrupt_silos") or 0
  if not corrupt:
    return silos, events
  if corrupt >= silos.num_silos:
    raise ValueError(f"--corrupt_silos={corrupt} leaves no honest silo (the data has "
                     f"{silos.num_silos})")
  return data.corrupt_labels(silos, corrupt, recipe["corruption"]), events


def compare_preset_silos(dataset: str, seed: int, data_dir=None,
                         mask_probability=None):
  """The silos of a `benchmarks.compare` preset's dataset, before validation
  (`mask_probability`: digits and fmnist, None for the dataset's own)."""
  from benchmarks import configs
  from tff_silo import data
  masks = {} if mask_probability is None else dict(mask_probability=mask_probability)
  if dataset == "quick":
    return data.heterogeneous_linear_silos(**configs.QUICK_DATA, seed=seed)
  if dataset == "digits":
    return data.load_rotated_masked_digits(seed=seed, **masks)
  if dataset == "school":
    return data.load_school(data_dir, seed=seed, standardize="public")
  if dataset == "vehicle":
    return data.load_vehicle(data_dir, seed=seed, standardize="none")
  if dataset == "fmnist":
    return data.rotated_masked_fmnist_silos(data_dir, seed=seed, **masks)
  if dataset == "fmnist_hetero":
    return data.label_skewed_fmnist_silos(data_dir, seed=seed)
  raise ValueError(f"unknown compare dataset {dataset!r}")


def compare_split(recipe: dict):
  """(the silos a compare trial trains on, with their test split; validation
  features and labels per silo): `data.validation_split` of the preset's silos."""
  from tff_silo import data
  silos = compare_preset_silos(recipe["preset_dataset"], recipe["seed"],
                               recipe.get("data_dir"), recipe.get("mask_probability"))
  return data.validation_split(silos, recipe["validation_fraction"],
                               [recipe["seed"], 1])


def compare_silos(recipe: dict):
  """The silos a compare trial trained on (members: their training examples)."""
  return compare_split(recipe)[0]


HYPERNET_NUM_CLASSES = {"digits": 10, "fmnist": 10, "cifar10": 10}


def hypernet_users(recipe: dict):
  """The users of a `benchmarks.hypernet` run: label-skewed partitions of digits,
  Fashion-MNIST or CIFAR-10, or FEMNIST's writers."""
  from tff_silo import data
  name, seed = recipe["hypernet_dataset"], recipe["seed"]
  if name == "fmnist":
    return data.label_skewed_fmnist_silos(recipe["data_dir"],
                                          num_silos=recipe["num_users"],
                                          classes_per_silo=recipe["classes_per_user"],
                                          seed=seed)
  if name == "femnist":
    return data.load_emnist_users(recipe.get("cache_dir"), num_users=recipe["num_users"],
                                  seed=seed)
  if name == "cifar10":
    import numpy as np   # pylint: disable=g-import-not-at-top
    x_train, y_train, x_test, y_test = data.load_cifar10(recipe.get("data_dir"))
    x, y = np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test])
  elif name == "digits":
    x, y = data.digits_images()
  else:
    raise ValueError(f"unknown hypernet dataset {name!r} in the recipe")
  return data.label_skewed_silos(name, x, y, num_classes=HYPERNET_NUM_CLASSES[name],
                                 num_users=recipe["num_users"],
                                 classes_per_user=recipe["classes_per_user"], seed=seed)


def _clean(recipe):
  """(silos, per-silo preprocessing DpEvents or None) of a `benchmarks.run` dataset,
  by its loader."""
  loader = LOADERS.get(recipe["dataset"])
  if loader is None:
    raise ValueError(f"unknown dataset {recipe['dataset']!r} in the recipe")
  return loader(recipe)


def _tabular(function: str):
  """The loader of a tabular dataset read by `tff_silo.data.<function>`, its features
  standardized as the recipe says (dp: by each silo's DP estimate)."""
  def load(recipe):
    from tff_silo import data
    mode = recipe["standardize"]
    silos = getattr(data, function)(recipe["data_dir"], seed=recipe["seed"],
                                    standardize="none" if mode == "dp" else mode)
    return (silos, None) if mode != "dp" else _dp_standardized(silos, recipe)
  return load


def _generated(function: str, data_dir: bool = False):
  """The loader of a dataset `tff_silo.data.<function>` makes from the seed (and
  from the files in the recipe's data_dir)."""
  def load(recipe):
    from tff_silo import data
    files = (recipe["data_dir"],) if data_dir else ()
    return getattr(data, function)(*files, seed=recipe["seed"]), None
  return load


def _digits(recipe):
  from tff_silo import data
  held_out = ({"test_fraction": recipe["test_fraction"]} if "test_fraction" in recipe
              else {})
  return data.load_rotated_masked_digits(mask_probability=recipe["mask_probability"],
                                         seed=recipe["seed"], **held_out), None


# `benchmarks.run`'s datasets: a loader of the recipe each (their settings and
# kind: `configs.PRESETS`).
LOADERS = {
    "school": _tabular("load_school"),
    "vehicle": _tabular("load_vehicle"),
    "gleam": _tabular("load_gleam"),
    "digits": _digits,
    "synthetic": _generated("heterogeneous_linear_silos"),
    "two_cluster": _generated("two_cluster_linear_silos"),
    "fmnist_rotated": _generated("rotated_fmnist_users", data_dir=True),
}


def _dp_standardized(silos, recipe):
  """Each silo's DP estimate of its feature statistics (seeded by the run's seed),
  and the Gaussian event it charges to the silo's ledger."""
  from tff_silo.data import preprocessing
  z = recipe["standardize_noise_multiplier"]
  standardized = preprocessing.standardize_silos(
      silos, "dp", clip=recipe["standardize_clip"], noise_multipliers=[z] * silos.num_silos,
      seed=recipe["seed"])
  features = int(math.prod(silos.feature_shape))
  event = preprocessing.dp_event(z, features, recipe["neighbouring"])
  return standardized, [event] * silos.num_silos
