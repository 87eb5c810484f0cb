"""The binaries' registries agree: a dataset is one entry of `datasets.DATASETS` (what
it is, what --data_dir holds, each binary's loader), `run`'s datasets each have a
preset (`configs.PRESETS`) and `compare`'s presets name registered datasets; the
binaries' choices come from the registries."""

import pytest

from benchmarks import configs, datasets


def test_every_dataset_of_run_has_a_preset():
  assert datasets.taking("run") == tuple(configs.PRESETS)


def test_every_compare_preset_names_a_dataset_compare_loads():
  assert {p.dataset for p in configs.COMPARE_PRESETS.values()} <= set(
      datasets.taking("compare"))


def test_what_each_binary_takes():
  assert datasets.taking("run") == ("school", "vehicle", "gleam", "digits", "synthetic",
                                    "two_cluster", "fmnist_rotated")
  assert datasets.taking("run", tabular=True) == ("school", "vehicle", "gleam")
  assert datasets.taking("run", task="regression") == ("school", "synthetic",
                                                       "two_cluster")
  assert datasets.taking("run", public_ranges=True) == ("school",)
  assert datasets.taking("hypernet") == ("digits", "fmnist", "cifar10", "femnist")
  assert datasets.taking("images") == ("digits", "cifar10")
  assert datasets.taking("compare", masked=True) == ("digits", "fmnist")


@pytest.mark.parametrize("name", sorted(datasets.DATASETS))
def test_every_entry_is_consistent(name):
  entry = datasets.DATASETS[name]
  assert entry.task in ("classification", "regression")
  assert (entry.num_classes is None) == (entry.task == "regression")
  assert not entry.public_ranges or entry.tabular
  assert not entry.tabular or entry.files   # the tabular datasets are read
  assert not entry.masked or entry.image
  assert not entry.files_optional or entry.files
  assert any(getattr(entry, binary) for binary in ("run", "compare", "hypernet",
                                                   "images"))


def test_femnist_has_emnist_s_classes():
  from tff_silo.data.images import EMNIST_CLASSES
  assert datasets.DATASETS["femnist"].num_classes == EMNIST_CLASSES[False]


def test_an_unknown_dataset_in_a_recipe_is_one_line():
  with pytest.raises(ValueError, match="unknown dataset 'mnist' in the recipe"):
    datasets.load(dict(dataset="mnist", seed=0))
  with pytest.raises(ValueError, match="unknown compare dataset 'cifar10'"):
    datasets.compare_preset_silos("cifar10", 0)
  with pytest.raises(ValueError, match="unknown hypernet dataset 'school'"):
    datasets.hypernet_users(dict(hypernet_dataset="school", seed=0))
