"""The binaries' registries agree: a dataset of `benchmarks.run` is a loader
(`datasets.LOADERS`) and a preset (`configs.PRESETS`), and what it is (tabular, a
regression) is said once, in its preset."""

from benchmarks import configs, datasets


def test_every_dataset_of_run_has_a_loader_and_a_preset():
  assert list(datasets.LOADERS) == list(configs.PRESETS)


def test_what_a_dataset_is_comes_from_its_preset():
  assert configs.TABULAR == ("school", "vehicle", "gleam")
  assert configs.REGRESSION == ("school", "synthetic", "two_cluster")
  assert [name for name, p in configs.PRESETS.items() if p.public_ranges] == ["school"]
  assert all(configs.PRESETS[name].needs_data_dir for name in configs.TABULAR)
