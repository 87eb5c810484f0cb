"""The key tree (`tff_silo.keys`): 64-bit keys, no two equal in a School-sized run."""

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import keys
from tff_silo.privacy import batching
from tff_silo.privacy import dp_sgd, selection

SCHOOL_SILOS, SCHOOL_ROUNDS, SCHOOL_BATCH = 139, 200, 32


@tf.function
def _children(parents, data):
  """fold_in(parents[i], data[i]) for every i."""
  return tf.map_fn(lambda pd: keys.fold_in(pd[0], pd[1]), (parents, data),
                   fn_output_signature=tf.TensorSpec([2], tf.int32),
                   parallel_iterations=256)


def _fold(parents, data):
  return _children(tf.constant(parents, tf.int32), tf.constant(data, tf.int32)).numpy()


def _expand(parents, counts):
  """Children 0 .. counts[i] - 1 of every parent, stacked."""
  counts = np.asarray(counts)
  return _fold(np.repeat(parents, counts, axis=0),
               np.concatenate([np.arange(c) for c in counts]))


def test_fold_in_is_deterministic_and_uses_64_bits():
  a = keys.fold_in([1, 2], 3).numpy()
  np.testing.assert_array_equal(a, keys.fold_in(tf.constant([1, 2]), 3).numpy())
  assert not np.array_equal(a, keys.fold_in([1, 2], 4).numpy())
  assert not np.array_equal(a, keys.fold_in([1, 3], 3).numpy())
  # Both words vary: 1,000 children have ~1,000 distinct values in each word.
  kids = _fold(np.tile([[5, 6]], (1000, 1)), np.arange(1000))
  assert len(np.unique(kids[:, 0])) > 990 and len(np.unique(kids[:, 1])) > 990


def test_root_key_holds_the_seed_and_draws_entropy_without_one():
  np.testing.assert_array_equal(keys.root_key(0), [0, 0])
  assert keys.root_key(2 ** 40 + 7).view(np.uint32).tolist() == [7, 2 ** 8]
  assert not np.array_equal(keys.root_key(None), keys.root_key(None))
  with pytest.raises(ValueError, match="seed"):
    keys.root_key(-1)


@pytest.mark.slow
def test_school_sized_run_has_no_two_equal_keys():
  """Every key of a School-sized run: 139 silos x 200 rounds, Ditto's two passes of
  Poisson sampling and noise keys per step, shuffle keys per epoch, one IFCA
  selection per round, the per-layer d-privacy keys, each silo's standardization key,
  and the server's noise keys."""
  sizes = np.random.default_rng(0).integers(18, 200, SCHOOL_SILOS)
  root = keys.root_key(0)
  units = np.stack(keys.unit_keys(0, SCHOOL_SILOS))
  rounds = _expand(units, [SCHOOL_ROUNDS] * SCHOOL_SILOS)
  steps = np.repeat(batching.batch_plan(np, "poisson", SCHOOL_BATCH, sizes, sizes)[2],
                    SCHOOL_ROUNDS)
  everything = [root[None], units, rounds]
  for purpose, passes in ((keys.SAMPLING, 2), (keys.DP_NOISE, 2), (keys.SHUFFLE, 2),
                          (keys.SELECTION, 1), (keys.D_PRIVACY, 1)):
    by_purpose = _fold(rounds, np.full(len(rounds), purpose))
    for pass_ in range(passes):
      stream = _fold(by_purpose, np.full(len(rounds), pass_))
      everything += [by_purpose, stream]
      if purpose in (keys.SAMPLING, keys.DP_NOISE):
        everything.append(_expand(stream, steps))
      elif purpose == keys.D_PRIVACY:   # one key per layer, two per noise draw
        layers = _expand(stream, [2] * len(stream))
        everything += [layers, _expand(layers, [2] * len(layers))]
      else:
        everything.append(_expand(stream, [1] * len(stream)))
  before = _fold(units, np.full(len(units), -1))   # DP standardization, round -1
  by_purpose = _fold(before, np.full(len(units), keys.STANDARDIZE))
  everything += [before, by_purpose, _fold(by_purpose, np.zeros(len(units)))]
  server = _fold(root[None], [keys.AGGREGATOR_NOISE])
  everything += [server, _expand(server, [SCHOOL_ROUNDS])]
  sampling = _fold(root[None], [keys.USER_SAMPLING])
  everything += [sampling, _expand(sampling, [SCHOOL_ROUNDS])]
  # by_purpose keys appear twice above (once per pass); count each once.
  all_keys = np.unique(np.concatenate(everything).view(np.int64), axis=0)
  expected = sum(len(k) for k in everything) - 3 * len(rounds)
  assert len(all_keys) == expected > 500_000


def test_mechanisms_without_a_key_draw_fresh_noise():
  grads = [tf.zeros([3, 50])]
  a = dp_sgd.privatize(grads, l2_norm_clip=1.0, noise_multiplier=1.0, normalizer=1.0)
  b = dp_sgd.privatize(grads, l2_norm_clip=1.0, noise_multiplier=1.0, normalizer=1.0)
  assert not np.allclose(a[0].numpy(), b[0].numpy())

  @tf.function
  def noisy():
    return dp_sgd.gaussian_noise_like([tf.zeros([50])], 1.0)[0]
  assert not np.allclose(noisy().numpy(), noisy().numpy())   # a fresh key per call
  picks = {int(selection.report_noisy_min(tf.zeros([1000]), 1.0, 1.0)) for _ in range(5)}
  assert len(picks) > 1


def test_unit_keys_are_computed_as_each_units_key():
  root = keys.root_key(5)
  np.testing.assert_array_equal(np.stack(keys.unit_keys(5, 7)),
                                np.stack([keys.unit_key(root, k) for k in range(7)]))
  assert keys.unit_keys(5, 0) == []


def test_child_seeds_are_distinct_64_bit_and_reproducible():
  seeds = [keys.child_seed(0, keys.TUNING, 3, 2000, j) for j in range(200)]
  assert len(set(seeds)) == 200 and all(0 <= s < 2 ** 64 for s in seeds)
  assert max(seeds) >= 2 ** 32   # all 64 bits are used
  assert keys.child_seed(0, keys.TUNING, 3, 2000, 5) == seeds[5]
  assert keys.child_seed(1, keys.TUNING, 3, 2000, 5) != seeds[5]


def test_run_seeds_differ_by_configuration_and_repeat_for_the_same_one():
  base = dict(method="mrmtl", lam=1.0, epsilon=2.0)
  variants = [base, dict(base, lam=0.1), dict(base, epsilon=8.0),
              dict(base, method="ditto"), dict(base, rounds=3)]
  seeds = [keys.run_seed(0, c) for c in variants]
  assert len(set(seeds)) == len(variants)
  assert keys.run_seed(0, dict(reversed(list(base.items())))) == seeds[0]
  assert keys.run_seed(1, base) != seeds[0]
  assert all(0 <= s < 2 ** 64 for s in seeds)


def test_a_binarys_run_seed_ignores_where_the_data_was_read():
  import json
  from benchmarks import common
  key = dict(algorithm="mrmtl", lam=1.0, seed=0, data_dir="../shared/data")
  seed = common.run_seed(0, json.dumps(key))
  assert seed == common.run_seed(0, json.dumps(dict(key, data_dir="/elsewhere")))
  assert seed != common.run_seed(0, json.dumps(dict(key, lam=0.1)))
