"""A run's silos split across shards (`tff_silo.sharding`) against the same run
unsharded on the vectorized backend."""

import functools

import numpy as np
import pytest

from tff_silo import algorithms, sharding
from tff_silo.simulation import run_simulation
from tests.backends.test_vectorized import IFCA_CASES, MODEL, SETTINGS, SILOS, _assert_same

FAMILY = {"mrmtl": dict(lam=0.5), "ditto": dict(lam=0.5), "fedavg": {}}


def _definition(name, private=True):
  if name.startswith("ifca"):
    options, _ = IFCA_CASES["fedavg_dp_selection" if name == "ifca" else "mrmtl_dp"]
    return algorithms.ifca_algorithm(
        MODEL, SILOS.feature_shape, client_learning_rate=0.1, batch_size=8,
        total_rounds=4, **dict(dict(num_clusters=2), **options))
  options = SETTINGS["poisson_assumed_size"][0] if private else {}
  return getattr(algorithms, f"{name}_algorithm")(
      MODEL, SILOS.feature_shape, client_learning_rate=0.1, batch_size=8,
      **FAMILY[name], **options)


def _run_options(name, private=True):
  if name.startswith("ifca"):
    return IFCA_CASES["fedavg_dp_selection" if name == "ifca" else "mrmtl_dp"][1]
  return SETTINGS["poisson_assumed_size"][1] if private else {}


def _make(name, private, lo, hi):
  """A shard's recipe: the definition and its silos, built where it runs."""
  return _definition(name, private), sharding.silo_data(SILOS, lo, hi)


def _sharded(name, num_shards, private=True, **run):
  shards = [sharding.InProcess(functools.partial(_make, name, private, lo, hi))
            for lo, hi in sharding.bounds(SILOS.num_silos, num_shards)]
  return sharding.run_sharded(_definition(name, private), shards, **run)


@pytest.mark.parametrize("num_shards", [1, 2, 3])
@pytest.mark.parametrize("name", ["mrmtl", "ditto", "ifca", "ifca_mrmtl"])
def test_a_sharded_run_computes_what_the_run_computes_unsharded(name, num_shards):
  """Weights, metrics, history, clusters (IFCA's private selections) and every
  silo's epsilon, with 1, 2 and 3 shards of the 4 silos."""
  run = dict(rounds=4, seed=3, eval_every=2, **_run_options(name))
  alone = run_simulation(_definition(name), SILOS, backend="vectorized", **run)
  sharded = _sharded(name, num_shards, **run)
  _assert_same(alone, sharded)
  np.testing.assert_allclose(np.array(sharded.history), np.array(alone.history),
                             rtol=1e-5)
  if name.startswith("ifca"):
    np.testing.assert_array_equal(sharded.clusters, alone.clusters)
    for mine, its in zip(sharded.server_weights, alone.server_weights):
      for a, b in zip(mine, its):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  if num_shards == 1:   # the same sums in the same order: the same numbers
    for a, b in zip(alone.silo_weights, sharded.silo_weights):
      for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_fedavg_without_dp_sharded_and_the_check_can_fail():
  """A run without DP shards too; a shard given other silos' keys trains otherwise
  (the keys are the global silo ids')."""
  run = dict(rounds=3, seed=1)
  alone = run_simulation(_definition("fedavg", False), SILOS, backend="vectorized", **run)
  _assert_same(alone, _sharded("fedavg", 2, private=False, **run))
  other = run_simulation(_definition("fedavg", False), SILOS, backend="vectorized",
                         rounds=3, seed=2)
  assert max(np.abs(a - b).max() for a, b in zip(alone.server_weights[0],
                                                  other.server_weights[0])) > 1e-4


def test_what_cannot_shard_is_a_one_line_error():
  with pytest.raises(ValueError, match="shards must be between 1 and the 4 silos, got 5"):
    sharding.bounds(4, 5)
  mocha = algorithms.mocha_algorithm(MODEL, SILOS.feature_shape, client_learning_rate=0.1,
                                     batch_size=8, num_silos=4)
  with pytest.raises(ValueError, match="mocha cannot run sharded"):
    sharding.shard_runner(mocha)
  shards = [sharding.InProcess(functools.partial(_make, "mrmtl", True, 0, 4))]
  with pytest.raises(ValueError, match="shard 0 trains"):
    sharding.run_sharded(_definition("ditto"), shards, rounds=1)
