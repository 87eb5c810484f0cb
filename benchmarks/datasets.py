"""The datasets the binaries read, by name (`DATASETS`: what each holds and how
each binary loads it), and the silos of a run from its recipe (a JSON-able dict),
without flags: a binary loads its data through it, and a saved run
(`tff_silo.runs`) stores the recipe instead of a copy of the data, so an attack can
rebuild the very same split (checked against the saved fingerprint) and tell
members from non-members.

Recipe keys: dataset (`taking("run")`), seed, data_dir, standardize (tabular: none,
public, dp, silo), for `dp` standardize_clip, standardize_noise_multiplier and
neighbouring, mask_probability (digits), test_fraction (digits and tabular),
corrupt_silos and corruption (misbehaving silos). A `benchmarks.compare` recipe has
preset_dataset (`taking("compare")`), seed, data_dir, validation_fraction and
optionally mask_probability (the masked datasets): the silos its trials train on
(`compare_silos`). A `benchmarks.hypernet` recipe has hypernet_dataset
(`taking("hypernet")`), seed, num_users, classes_per_user, data_dir and cache_dir:
its users (`hypernet_users`).

A loader's result is kept per process (`cached`): a binary loads its data once, and
a Ray worker (`benchmarks.executors`) loads it from the recipe on its first task,
checked against the digest the driver computed of its own copy (`expect`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Callable, Optional


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
  (`mask_probability`: the masked datasets', None for the dataset's own)."""
  entry = DATASETS.get(dataset)
  if entry is None or entry.compare is None:
    raise ValueError(f"unknown compare dataset {dataset!r}")
  masks = {} if mask_probability is None else dict(mask_probability=mask_probability)
  return entry.compare(data_dir, seed, **masks)


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


def hypernet_users(recipe: dict):
  """The users of a `benchmarks.hypernet` run (its dataset's `hypernet` loader)."""
  entry = DATASETS.get(recipe["hypernet_dataset"])
  if entry is None or entry.hypernet is None:
    raise ValueError(f"unknown hypernet dataset {recipe['hypernet_dataset']!r} in the "
                     "recipe")
  return entry.hypernet(recipe)


def _clean(recipe):
  """(silos, per-silo preprocessing DpEvents or None) of a `benchmarks.run` dataset,
  by its loader."""
  entry = DATASETS.get(recipe["dataset"])
  if entry is None or entry.run is None:
    raise ValueError(f"unknown dataset {recipe['dataset']!r} in the recipe")
  return entry.run(recipe)


# --- loaders: what each binary calls, by dataset -------------------------------------

def _tabular(function: str):
  """run's loader of a tabular dataset read by `tff_silo.data.<function>`, its
  features standardized as the recipe says (dp: by each silo's DP estimate)."""
  def load(recipe):
    from tff_silo import data
    mode = recipe["standardize"]
    split = ({"test_fraction": recipe["test_fraction"]} if "test_fraction" in recipe
             else {})
    silos = getattr(data, function)(recipe["data_dir"], seed=recipe["seed"],
                                    standardize="none" if mode == "dp" else mode,
                                    **split)
    return (silos, None) if mode != "dp" else _dp_standardized(silos, recipe)
  return load


def _generated(function: str, data_dir: bool = False):
  """run's loader of a dataset `tff_silo.data.<function>` makes from the seed (and
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


def _silos(function: str, reads_files: bool = True, **options):
  """compare's silos: `tff_silo.data.<function>([data_dir,] seed=..., **options,
  **masks)`."""
  def load(data_dir, seed, **masks):
    from tff_silo import data
    files = (data_dir,) if reads_files else ()
    return getattr(data, function)(*files, seed=seed, **options, **masks)
  return load


def _quick(data_dir, seed):
  from benchmarks import configs
  from tff_silo import data
  del data_dir   # generated
  return data.heterogeneous_linear_silos(**configs.QUICK_DATA, seed=seed)


def _label_skewed(images):
  """hypernet's users: a label-skewed partition of the (x, y) `images(data_dir)`
  returns."""
  def load(recipe):
    from tff_silo import data
    x, y = images(recipe.get("data_dir"))
    name = recipe["hypernet_dataset"]
    return data.label_skewed_silos(name, x, y, num_classes=DATASETS[name].num_classes,
                                   num_users=recipe["num_users"],
                                   classes_per_user=recipe["classes_per_user"],
                                   seed=recipe["seed"])
  return load


def _hypernet_fmnist(recipe):
  from tff_silo import data
  return data.label_skewed_fmnist_silos(recipe["data_dir"],
                                        num_silos=recipe["num_users"],
                                        classes_per_silo=recipe["classes_per_user"],
                                        seed=recipe["seed"])


def _femnist(recipe):
  from tff_silo import data
  return data.load_emnist_users(recipe.get("cache_dir"), num_users=recipe["num_users"],
                                seed=recipe["seed"])


def _digit_images(data_dir):
  from tff_silo import data
  del data_dir   # shipped with scikit-learn
  return data.digits_images()


def _cifar10_training_images(data_dir):
  from tff_silo import data
  x, y, _, _ = data.load_cifar10(data_dir)
  return x, y


def _cifar10_images(data_dir):
  """CIFAR-10's training and test images together."""
  import numpy as np
  from tff_silo import data
  x_train, y_train, x_test, y_test = data.load_cifar10(data_dir)
  return np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test])


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A dataset by name, and how each binary that takes it loads it (None: that
  binary does not). `files`: what --data_dir holds (None: the data is made from the
  seed or ships with the dependencies; `files_optional`: without --data_dir it is
  fetched); `run`: `benchmarks.run`'s loader of a recipe (its settings:
  `configs.PRESETS[name]`); `compare`: `benchmarks.compare`'s silos of (data_dir,
  seed, mask options) before validation; `hypernet`: `benchmarks.hypernet`'s users
  of a recipe; `images`: (x, y) of data_dir, what `benchmarks.attacks` inverts (its
  training images).
  What it is: a regression (`run --corrupt_silos` scales its targets) or a
  classification (of `num_classes` labels); `tabular` (feature standardization
  applies) with documented feature ranges (`public_ranges`: --standardize=public);
  image silos, rotated and masked or not (`mask_probability`: the probability of
  each white patch the loader draws by default, which --mask_probability replaces;
  None: not masked)."""
  files: Optional[str] = None
  files_optional: bool = False
  run: Optional[Callable] = None
  compare: Optional[Callable] = None
  hypernet: Optional[Callable] = None
  images: Optional[Callable] = None
  task: str = "classification"
  num_classes: Optional[int] = None
  tabular: bool = False
  public_ranges: bool = False
  image: bool = False
  mask_probability: Optional[float] = None

  @property
  def masked(self) -> bool:
    return self.mask_probability is not None

  @property
  def chance(self) -> Optional[float]:
    """The accuracy of a uniform guess (None for a regression)."""
    return None if self.task == "regression" else 1 / self.num_classes


FASHION_MNIST = "Fashion-MNIST's IDX files"
DATASETS = {
    "school": Dataset(files="school.mat", run=_tabular("load_school"),
                      compare=_silos("load_school", standardize="public"),
                      task="regression", tabular=True, public_ranges=True),
    "vehicle": Dataset(files="vehicle.mat or the Vehicle JSON",
                       run=_tabular("load_vehicle"),
                       compare=_silos("load_vehicle", standardize="none"),
                       num_classes=2, tabular=True),
    "gleam": Dataset(files="gleam.mat", run=_tabular("load_gleam"), num_classes=2,
                     tabular=True),
    "digits": Dataset(run=_digits, compare=_silos("load_rotated_masked_digits", False),
                      hypernet=_label_skewed(_digit_images), images=_digit_images,
                      num_classes=10, image=True, mask_probability=0.1),
    "synthetic": Dataset(run=_generated("heterogeneous_linear_silos"),
                         task="regression"),
    "two_cluster": Dataset(run=_generated("two_cluster_linear_silos"),
                           task="regression"),
    "fmnist_rotated": Dataset(files=FASHION_MNIST,
                              run=_generated("rotated_fmnist_users", data_dir=True),
                              num_classes=10, image=True),
    "quick": Dataset(compare=_quick, task="regression"),
    "fmnist": Dataset(files=FASHION_MNIST,
                      compare=_silos("rotated_masked_fmnist_silos"),
                      hypernet=_hypernet_fmnist, num_classes=10, image=True,
                      mask_probability=0.1),
    "fmnist_hetero": Dataset(files=FASHION_MNIST,
                             compare=_silos("label_skewed_fmnist_silos"),
                             num_classes=10, image=True),
    "cifar10": Dataset(files="cifar-10-batches-py", files_optional=True,
                       hypernet=_label_skewed(_cifar10_images),
                       images=_cifar10_training_images,
                       num_classes=10, image=True),
    "femnist": Dataset(hypernet=_femnist, num_classes=62, image=True),
}


def taking(binary: str, **where) -> tuple:
  """The names of the datasets `binary` (run, compare, hypernet, images) loads, in
  the registry's order, whose fields equal `where`'s values."""
  return tuple(name for name, entry in DATASETS.items()
               if getattr(entry, binary) is not None
               and all(getattr(entry, field) == value for field, value in where.items()))


def reading(binary: str) -> tuple:
  """The datasets `binary` loads that read files from --data_dir."""
  return tuple(name for name in taking(binary) if DATASETS[name].files)


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
