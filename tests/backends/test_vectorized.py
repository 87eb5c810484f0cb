"""The vectorized backend against TF's own random ops and against the TFF backend."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from hypernet.process import process_for as hypernet_process_for
from tff_silo import algorithms, batched_random, data, keys, models, simulation
from tff_silo.backends.tff import process_for
from tff_silo.backends.vectorized import programs
from tff_silo.backends.vectorized import training as vectorized_training
from tff_silo.dprivate_simulation import run_dprivate_clustering
from tff_silo.privacy import PrivacyProtocol, dp_sgd, silo_accounts
from tff_silo.simulation import Run, run_simulation, run_simulations
from tests.backends import grid_flips

RNG = np.random.default_rng(0)
KEYS = RNG.integers(-2 ** 31, 2 ** 31, size=(7, 2)).astype(np.int32)
KEYS[0], KEYS[1] = (0, 0), (-1, 5)   # zero and sign-extended seed words


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 4097, 10_001])   # 1 to 3 counter rows
def test_bits_and_uniform_rows_are_tfs_stateless_draws(n):
  """Raw words and float32 and float64 uniforms, bit for bit."""
  bits = batched_random.random_bits(KEYS, n).numpy()
  uniform = batched_random.uniform(KEYS, n).numpy()
  uniform64 = batched_random.uniform64(KEYS, n).numpy()
  for k, key in enumerate(KEYS):
    np.testing.assert_array_equal(bits[k], tf.random.stateless_uniform(
        [n], seed=key, minval=None, maxval=None, dtype=tf.uint32))
    np.testing.assert_array_equal(uniform[k], tf.random.stateless_uniform([n], seed=key))
    np.testing.assert_array_equal(
        uniform64[k], tf.random.stateless_uniform([n], seed=key, dtype=tf.float64))


def test_exponentials_are_float64s_exp1_draws_to_float32_precision():
  """-ln(1 - u) of the float64 uniforms without float64, eager and compiled, on
  210,000 draws and the grid's edges (u = 0, 2^-52, just below, at and above 1/2,
  the last point 1 - 2^-52, where the draw is 52 ln 2)."""
  n = 30_000
  reference = -np.log1p(-batched_random.uniform64(KEYS, n).numpy())
  compiled = tf.function(batched_random.exponentials, jit_compile=True)
  for draws in (batched_random.exponentials(KEYS, n), compiled(tf.constant(KEYS), n)):
    assert draws.dtype == tf.float32
    np.testing.assert_allclose(draws.numpy(), reference, rtol=2.0 ** -21, atol=0)
  edges = np.array([0, 1, 2, 2 ** 50, 2 ** 51 - 1, 2 ** 51, 2 ** 51 + 1, 3 * 2 ** 50,
                    2 ** 52 - 2 ** 30, 2 ** 52 - 2, 2 ** 52 - 1], np.int64)
  exact = -np.log1p(-edges / 2.0 ** 52)
  exact[-1] = 52 * np.log(2.0)       # 1 - u = 2^-52 exactly (float64 rounds 1 - u)
  np.testing.assert_allclose(batched_random.exponentials_of(edges).numpy(), exact,
                             rtol=2.0 ** -21, atol=0)


def test_fold_in_matches_the_key_tree():
  data_ = np.array([0, 1, -1, 2 ** 31 - 1, 7, 123456, -2 ** 31], np.int64)
  batched = batched_random.fold_in(KEYS, data_).numpy()
  for k, key in enumerate(KEYS):
    np.testing.assert_array_equal(batched[k], keys.fold_in(key, data_[k]))
  path = batched_random.derive(KEYS, keys.SAMPLING, 1).numpy()
  np.testing.assert_array_equal(path[3], keys.derive(KEYS[3], keys.SAMPLING, 1))


def test_a_long_draw_lowers_without_a_constant_of_its_length():
  """The Philox block counter is summed at run time: `tf.range(blocks)` was folded
  into every lowered program (11 MB of HLO for the default hypernetwork's noise)."""
  from tff_silo import pjrt
  draw = tf.function(lambda k: batched_random.random_bits(k, 400_000),
                     jit_compile=True, autograph=False)
  facts = pjrt.hlo_facts(pjrt.lower(draw, tf.constant(KEYS)))
  assert facts["constant_bytes"] <= 8 * batched_random._COUNTER_WIDTH, facts


def test_a_short_draw_is_a_prefix_of_a_long_one():
  np.testing.assert_array_equal(batched_random.uniform(KEYS, 5),
                                batched_random.uniform(KEYS, 37)[:, :5])


SIZES = (30, 40, 17, 25)   # uneven, so padding and per-silo step counts matter
_BASE = data.heterogeneous_linear_silos(num_silos=4, num_examples=40, dim=3, tau=1.0,
                                        seed=0)
SILOS = data.make_silos("uneven", "regression",
                        [x[:n] for x, n in zip(_BASE.x_train, SIZES)],
                        [y[:n] for y, n in zip(_BASE.y_train, SIZES)],
                        _BASE.x_test, _BASE.y_test)
MODEL = models.linear_regression(3)

# (process options, run options): DP under each protocol and sampling, and no DP.
PUBLIC = PrivacyProtocol(public_silo_sizes=True)
SETTINGS = {
    "poisson_public_sizes": (dict(l2_norm_clip=0.5),
                             dict(target_epsilon=5.0, target_delta=1e-3, protocol=PUBLIC)),
    "poisson_assumed_size": (dict(l2_norm_clip=0.5),
                             dict(target_epsilon=5.0, target_delta=1e-3,
                                  protocol=PrivacyProtocol(assumed_silo_size=24))),
    "replace_one": (dict(l2_norm_clip=0.5, sampling="without_replacement"),
                    dict(target_epsilon=5.0, target_delta=1e-3,
                         protocol=PrivacyProtocol("replace_one"))),
    "no_dp": ({}, {}),
}
ALGORITHMS = {
    "local": {}, "fedavg": {}, "mrmtl": dict(lam=0.5), "ditto": dict(lam=0.5),
    "finetune": dict(total_rounds=3, fedavg_fraction=0.4),
}


def _both(process, silos, **run):
  run = dict(dict(rounds=3, seed=1), **run)
  return (run_simulation(process, silos, backend="tff", **run),
          run_simulation(process, silos, backend="vectorized", **run))


def _assert_same(reference, vectorized, atol=1e-6, grid_atol=0.0):
  """`grid_atol`: what integer noise's grid flips may add (`grid_flips`), where the
  two compute per-example gradients with other roundings; the metrics are then
  checked only if the weights agree without it."""
  assert reference.rounds == vectorized.rounds
  assert len(reference.server_weights) == len(vectorized.server_weights) >= 1
  pairs = [(a, b) for ref, vec in zip(reference.silo_weights + reference.server_weights,
                                      vectorized.silo_weights + vectorized.server_weights)
           for a, b in zip(ref, vec)]
  flipped = not all(np.allclose(b, a, rtol=1e-5, atol=atol) for a, b in pairs)
  for a, b in pairs:
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=atol + grid_atol)
  if not flipped:
    np.testing.assert_allclose(vectorized.silo_test_metric, reference.silo_test_metric,
                               rtol=1e-5, atol=atol)
  if reference.privacy is not None:
    np.testing.assert_array_equal(vectorized.privacy.epsilon_spent,
                                  reference.privacy.epsilon_spent)
    np.testing.assert_array_equal(vectorized.privacy.noise_multipliers,
                                  reference.privacy.noise_multipliers)


LR, BATCH = 0.1, 8


def _process(name, **options):
  return process_for(getattr(algorithms, f"{name}_algorithm")(
              MODEL, SILOS.feature_shape, client_learning_rate=LR, batch_size=BATCH,
              **ALGORITHMS[name], **options))


# Every algorithm under DP with the default protocol, and MR-MTL in every setting.
CASES = sorted({(name, "poisson_assumed_size") for name in ALGORITHMS}
               | {("mrmtl", setting) for setting in SETTINGS} | {("ditto", "no_dp")})


@pytest.mark.parametrize("name, setting", CASES)
@pytest.mark.tff
def test_vectorized_backend_computes_what_the_tff_process_computes(name, setting):
  """To float32 rounding, and under DP to integer noise's grid flips: TFF's and the
  vectorized backend's per-example gradients are other programs."""
  options, run = SETTINGS[setting]
  reference, vectorized = _both(_process(name, **options), SILOS, **run)
  grid_atol = 0.0 if reference.privacy is None else grid_flips.tolerance(
      reference.privacy, LR, options["l2_norm_clip"], BATCH)
  _assert_same(reference, vectorized, grid_atol=grid_atol)


def test_the_parity_check_can_fail():
  """Another seed moves the weights by far more than the parity tolerance."""
  options, run = SETTINGS["poisson_assumed_size"]
  process = _process("mrmtl", **options)
  one, other = (run_simulation(process, SILOS, backend="vectorized", rounds=3, seed=s,
                               **run) for s in (1, 2))
  assert max(np.abs(a - b).max() for a, b in zip(one.silo_weights[1],
                                                  other.silo_weights[1])) > 1e-3


@pytest.mark.parametrize("name", ["mrmtl", "ditto", "finetune"])
@pytest.mark.slow
def test_stacked_runs_compute_what_each_run_computes_alone(name):
  """A grid's runs (epsilons, seeds, another dataset, learning rates, lambdas, a run
  without DP) as the silos of one program: each run's weights, metrics, epsilon and
  history are its own run's; runs of different programs run apart."""
  options, run = SETTINGS["poisson_assumed_size"]
  def definition(lr=0.1, **changed):
    return getattr(algorithms, f"{name}_algorithm")(
        MODEL, SILOS.feature_shape, client_learning_rate=lr, batch_size=8,
        **dict(ALGORITHMS[name], **changed), **options)
  other_silos = data.heterogeneous_linear_silos(num_silos=3, num_examples=20, dim=3,
                                                seed=5)
  other_lam = dict(lam=2.0) if "lam" in ALGORITHMS[name] else {}
  runs = [Run(definition(), SILOS, seed=1, **run),
          Run(definition(lr=0.03), SILOS, seed=2, **dict(run, target_epsilon=2.0)),
          Run(definition(**other_lam), other_silos, seed=3, **run),
          Run(_process(name), SILOS, seed=1)]   # no DP: another stack key
  stacked = run_simulations(runs, rounds=3, eval_every=2, backend="vectorized")
  assert [r.runs_stacked for r in stacked] == [3, 3, 3, 1]
  for spec, result in zip(runs, stacked):
    programs.release_programs()   # each alone traced from its own definition
    alone = run_simulation(spec.process, spec.data, rounds=3, eval_every=2,
                           backend="vectorized", seed=spec.seed,
                           target_epsilon=spec.target_epsilon,
                           target_delta=spec.target_delta, protocol=spec.protocol)
    _assert_same(alone, result)
    np.testing.assert_allclose(np.array(result.history), np.array(alone.history),
                               rtol=1e-5)
    assert result.test_metric == pytest.approx(alone.test_metric, rel=1e-5)


def test_stacks_are_cut_to_the_memory_budget(monkeypatch):
  """Runs that would stack beyond MAX_STACKED_FLOATS run in several stacks: here
  two runs' data per stack, so 2 + 1, each run's numbers its own."""
  per_run = SILOS.num_silos * max(len(y) for y in SILOS.y_train) * int(
      np.prod(SILOS.feature_shape))
  monkeypatch.setattr(simulation, "MAX_STACKED_FLOATS", 2 * per_run + 1)
  assert simulation.runs_per_stack([SILOS]) == 2
  runs = [Run(_process("mrmtl"), SILOS, seed=s) for s in (1, 2, 3)]
  cut = run_simulations(runs, rounds=2, backend="vectorized")
  assert [r.runs_stacked for r in cut] == [2, 2, 1]
  monkeypatch.setattr(simulation, "MAX_STACKED_FLOATS", 3 * per_run)
  whole = run_simulations(runs, rounds=2, backend="vectorized")
  assert [r.runs_stacked for r in whole] == [3, 3, 3]
  for a, b in zip(cut, whole):
    _assert_same(a, b)


def test_private_runs_with_one_seed_are_refused():
  """Two private runs with one seed would draw the same batches and noise (the
  difference of their updates reveals the clipped gradients): refused, on either
  backend; runs without DP may share a seed."""
  options, run = SETTINGS["poisson_assumed_size"]
  definition = algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape,
                                          client_learning_rate=0.1, batch_size=8,
                                          lam=0.5, **options)
  for backend in ("vectorized", "tff"):
    with pytest.raises(ValueError, match="share seed 1"):
      run_simulations([Run(definition, SILOS, seed=1, **run),
                       Run(definition, SILOS, seed=1, **dict(run, target_epsilon=2.0))],
                      rounds=1, backend=backend)
  plain = _process("mrmtl")
  assert len(run_simulations([Run(plain, SILOS, seed=1), Run(plain, SILOS, seed=1)],
                             rounds=1, backend="vectorized")) == 2


def test_a_stacked_run_over_its_budget_stops_alone(monkeypatch):
  """A run whose ledgers would pass the budget stops there; the others go on."""
  options, run = SETTINGS["poisson_assumed_size"]
  definition = algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape,
                                          client_learning_rate=0.1, batch_size=8,
                                          lam=0.5, **options)
  real = silo_accounts.calibrate_silos

  def too_little_noise(*args, target_epsilon, **kwargs):   # run 2 spends too much
    privacy = real(*args, target_epsilon=target_epsilon, **kwargs)
    if target_epsilon == 2.0:
      privacy = dataclasses.replace(privacy,
                                    noise_multipliers=privacy.noise_multipliers * 0.85)
    return privacy

  monkeypatch.setattr(silo_accounts, "calibrate_silos", too_little_noise)
  results = run_simulations(
      [Run(definition, SILOS, seed=1, **run),
       Run(definition, SILOS, seed=2, **dict(run, target_epsilon=2.0))],
      rounds=3, backend="vectorized")
  assert [r.rounds for r in results] == [3, 1]
  assert [r.privacy.stopped_because for r in results] == ["rounds", "budget"]
  assert np.all(results[1].privacy.epsilon_spent <= 2.0)
  alone = run_simulation(definition, SILOS, rounds=3, backend="vectorized", seed=1,
                         **run)
  _assert_same(alone, results[0])


def _small_digits():
  """4 digits silos of 12 / 6 images and a tiny CNN for them."""
  images = data.load_rotated_masked_digits(num_silos=4, seed=0)
  small = data.make_silos("digits", images.task, [x[:12] for x in images.x_train],
                          [y[:12] for y in images.y_train],
                          [x[:6] for x in images.x_test], [y[:6] for y in images.y_test],
                          num_classes=images.num_classes)
  return small, models.small_cnn(small.feature_shape, small.num_classes, channels=(2, 3))


@pytest.mark.parametrize("stacked", ["gradients", "apply", "neither"])
@pytest.mark.tff
def test_unweighted_mean_and_a_cnn_without_closed_form_gradients(stacked):
  """The CNN's stacked per-example gradients; without them, each example's own
  copy of its silo's weights through `stacked_apply_fn`; without either,
  `tf.vectorized_map` of the per-silo step."""
  small, cnn = _small_digits()
  if stacked != "gradients":
    cnn = dataclasses.replace(cnn, stacked_per_example_gradients_fn=None)
  if stacked == "neither":
    cnn = dataclasses.replace(cnn, stacked_apply_fn=None)
  process = process_for(algorithms.mrmtl_algorithm(
              cnn, small.feature_shape, client_learning_rate=0.1, batch_size=4, lam=0.3,
              l2_norm_clip=1.0, aggregator=tff.aggregators.UnweightedMeanFactory()))
  _assert_same(*_both(process, small, rounds=2, target_epsilon=8.0, target_delta=1e-3,
                      protocol=PUBLIC), atol=1e-5)


@pytest.mark.parametrize("path", ["stacked", "own_copies"])
@pytest.mark.tff
def test_dp_cnn_examples_in_memory_chunks_compute_the_same(monkeypatch, path):
  """A budget of 3 examples' working sets: each step's ~16 examples of 4 silos go
  through in chunks of at most 3 (the last padded, a silo's split across chunks),
  with the TFF backend's result, through the stacked per-example gradients or each
  example's own copy of the weights."""
  small, cnn = _small_digits()
  factor = vectorized_training.WORKING_SET_STACKED
  if path == "own_copies":
    cnn = dataclasses.replace(cnn, stacked_per_example_gradients_fn=None)
    factor = vectorized_training.WORKING_SET_PER_COPY
  definition = algorithms.mrmtl_algorithm(
      cnn, small.feature_shape, client_learning_rate=0.1, batch_size=4, lam=0.3,
      l2_norm_clip=1.0)
  monkeypatch.setattr(vectorized_training, "MEMORY_BUDGET_FLOATS",
                      3 * factor * cnn.num_parameters + 1)
  assert vectorized_training.chunk_examples(cnn) == 3
  _assert_same(*_both(definition, small, rounds=2, target_epsilon=8.0,
                      target_delta=1e-3, protocol=PUBLIC), atol=1e-5)


def test_dp_cnn_factored_clipping_equals_clipping_autodiff_gradients():
  """A CNN whose first convolution's per-example gradients are formed and whose
  second's norms come from the positions' Gram matrices (never formed): its DP
  MR-MTL rounds equal those through each example's own copy of its silo's weights
  (each per-example gradient by autodiff, formed and clipped), with the same keys,
  batches and noise; and XLA-compiled (float64 Gram matrices included)."""
  small, _ = _small_digits()
  cnn = models.small_cnn(small.feature_shape, small.num_classes, channels=(8, 32))
  weights = [tf.constant(np.stack([w] * 2)) for w in cnn.initial_weights(0)]
  x = tf.constant(np.stack([small.x_train[0][:3]] * 2))
  factored = cnn.stacked_per_example_gradients_fn(weights, x, tf.zeros([2, 3]))
  assert [dp_sgd.forms_cheaper(g) for g in factored[0:3:2]] == [True, False]
  run = dict(rounds=2, seed=1, target_epsilon=8.0, target_delta=1e-3, protocol=PUBLIC,
             backend="vectorized")
  results = [run_simulation(algorithms.mrmtl_algorithm(
      model, small.feature_shape, client_learning_rate=0.1, batch_size=4, lam=0.3,
      l2_norm_clip=0.5), small, **run)
             for model in (cnn, dataclasses.replace(
                 cnn, stacked_per_example_gradients_fn=None))]
  _assert_same(*results, atol=1e-5)
  with programs.xla_rounds():
    compiled = run_simulation(algorithms.mrmtl_algorithm(
        cnn, small.feature_shape, client_learning_rate=0.1, batch_size=4, lam=0.3,
        l2_norm_clip=0.5), small, **run)
  programs.release_programs()
  _assert_same(results[0], compiled, atol=1e-5)


@pytest.mark.tff
def test_dp_linear_examples_in_compiled_padded_chunks_compute_the_same(monkeypatch):
  """The linear form's compiled chunks: a budget of 3 examples' working sets, each
  step's examples in chunks of 3 (a silo's split across chunks, the last chunk
  padded), with the TFF backend's result; and of 38, cut to 36 (`_bucket_below`),
  each step's ~30 examples in one chunk rounded up to a multiple of 2 or 4
  (`_bucket`)."""
  options, run = SETTINGS["poisson_public_sizes"]
  process = _process("mrmtl", **options)
  per_example = vectorized_training.WORKING_SET_PER_COPY * MODEL.num_parameters
  for most in (3, 38):
    monkeypatch.setattr(vectorized_training, "MEMORY_BUDGET_FLOATS",
                        most * per_example + 1)
    assert vectorized_training.chunk_examples(MODEL) == most
    programs.release_programs()
    _assert_same(*_both(process, SILOS, **run))
  programs.release_programs()


def test_chunk_sizes_round_up_to_eight_sizes_an_octave():
  sizes = np.arange(1, 70000, dtype=np.int32)
  rounded = vectorized_training._bucket(tf.constant(sizes)).numpy()
  below = np.array([vectorized_training._bucket_below(int(m)) for m in sizes])
  assert (below <= sizes).all() and (rounded[below - 1] == below).all()
  assert (np.maximum.accumulate(np.where(rounded <= sizes, rounded, 0)) == below).all()
  assert (rounded >= sizes).all() and (rounded <= np.maximum(sizes, 1.125 * sizes)).all()
  np.testing.assert_array_equal(rounded[:16], sizes[:16])
  for low in (16, 256, 2048, 32768):
    assert len(set(rounded[(sizes >= low) & (sizes < 2 * low)]) - {2 * low}) == 8

@pytest.mark.parametrize("hidden, shape", [(None, (8, 8, 1)), (12, (28, 28, 3))])
def test_stacked_cnn_applies_each_models_own_weights(hidden, shape):
  cnn = models.small_cnn(shape, 5, channels=(3, 4), hidden=hidden)
  stacked = [np.stack([w + 0.1 * k for k in range(3)])
             for w in cnn.initial_weights(0)]
  x = RNG.normal(size=(3, 4, *shape)).astype(np.float32)
  outputs = cnn.stacked_apply_fn([tf.constant(w) for w in stacked], x).numpy()
  for k in range(3):
    np.testing.assert_allclose(outputs[k], cnn.apply_fn([w[k] for w in stacked], x[k]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hidden, shape", [(None, (8, 8, 1)), (12, (28, 28, 3))])
def test_stacked_cnn_gradients_equal_each_models_own_convolutions(hidden, shape):
  """The gradients of three stacked models' summed loss (their convolutions as
  patches times filters, the patches' own gradient) equal each model's through
  `tf.nn.conv2d` alone (SAME and VALID padding)."""
  cnn = models.small_cnn(shape, 5, channels=(3, 4), hidden=hidden)
  stacked = [tf.constant(np.stack([w + 0.1 * k for k in range(3)]))
             for w in cnn.initial_weights(0)]
  x = tf.constant(RNG.normal(size=(3, 4, *shape)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 5, (3, 4)).astype(np.float32))
  with tf.GradientTape() as tape:
    tape.watch(stacked)
    loss = tf.reduce_sum(cnn.loss_fn(cnn.stacked_apply_fn(stacked, x), y))
  got = tape.gradient(loss, stacked)
  for k in range(3):
    own = [w[k] for w in stacked]
    with tf.GradientTape() as tape:
      tape.watch(own)
      loss = tf.reduce_sum(cnn.per_example_loss(own, x[k], y[k]))
    for g, want in zip(got, tape.gradient(loss, own)):
      np.testing.assert_allclose(g[k].numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


_CNN_ROUNDS = """
import numpy as np
from tff_silo import algorithms, data, models
from tff_silo.privacy import PrivacyProtocol
from tff_silo.simulation import run_simulation
images = data.load_rotated_masked_digits(num_silos=4, seed=0)
silos = data.make_silos("digits", images.task, [x[:24] for x in images.x_train],
                        [y[:24] for y in images.y_train], [x[:6] for x in images.x_test],
                        [y[:6] for y in images.y_test], num_classes=images.num_classes)
cnn = models.small_cnn(silos.feature_shape, silos.num_classes, channels=(4, 8))
for privacy in ({}, dict(target_epsilon=4.0, target_delta=1e-3,
                        protocol=PrivacyProtocol(public_silo_sizes=True))):
  definition = algorithms.mrmtl_algorithm(cnn, silos.feature_shape, lam=0.3,
                                          client_learning_rate=0.1, batch_size=8,
                                          l2_norm_clip=1.0 if privacy else None)
  result = run_simulation(definition, silos, rounds=2, backend="vectorized", **privacy)
  assert all(np.isfinite(w).all() for s in result.silo_weights for w in s)
print("ok")
"""


@pytest.mark.cli
def test_cnn_rounds_run_without_onednn():
  """The digits CNN's rounds with and without DP on the vectorized backend, in a
  process with TensorFlow's oneDNN kernels off, as on CPUs without AVX-512 (a
  grouped convolution's gradient exists only in those kernels: this crashed)."""
  done = subprocess.run([sys.executable, "-c", _CNN_ROUNDS], capture_output=True,
                        text=True, timeout=300,
                        env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0",
                             "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().endswith("ok")


# IFCA: (algorithm options, run options). Selection in every round with a share
# large enough that the private choices vary between silos and seeds; and the
# preconditioned methods after half the rounds.
IFCA_CASES = {
    "fedavg_dp_selection": (
        dict(after="fedavg", num_clusters=3, selection_fraction=1.0, l2_norm_clip=0.5,
             selection_budget_share=0.15),
        dict(target_epsilon=4.0, target_delta=1e-3, protocol=PUBLIC)),
    "mrmtl_dp": (dict(after="mrmtl", lam=0.5, selection_fraction=0.5, l2_norm_clip=0.5),
                 SETTINGS["poisson_assumed_size"][1]),
    "finetune_no_dp": (dict(after="finetune", selection_fraction=0.3), {}),
}


@pytest.mark.parametrize("case", sorted(IFCA_CASES))
@pytest.mark.tff
def test_vectorized_ifca_computes_what_the_tff_process_computes(case):
  options, run = IFCA_CASES[case]
  definition = algorithms.ifca_algorithm(
      MODEL, SILOS.feature_shape, client_learning_rate=0.1, batch_size=8,
      total_rounds=4, **dict(dict(num_clusters=2), **options))
  reference, vectorized = _both(definition, SILOS, rounds=4, **run)
  np.testing.assert_array_equal(vectorized.clusters, reference.clusters)
  _assert_same(reference, vectorized)


@pytest.mark.parametrize("after", ["fedavg", "mrmtl"])
@pytest.mark.slow
def test_stacked_ifca_runs_compute_what_each_run_computes_alone(after):
  """IFCA's runs of seeds, epsilons, learning rates, lambdas and another dataset as
  one program, each with its own G clusters: each run's clusters, weights, metrics
  and epsilon are its own run's."""
  options, run = IFCA_CASES["fedavg_dp_selection" if after == "fedavg" else "mrmtl_dp"]
  def definition(lr=0.1, **changed):
    return algorithms.ifca_algorithm(
        MODEL, SILOS.feature_shape, client_learning_rate=lr, batch_size=8,
        total_rounds=4, **dict(dict(dict(num_clusters=2), **options), **changed))
  other_silos = data.heterogeneous_linear_silos(num_silos=3, num_examples=20, dim=3,
                                                seed=5)
  other_lam = dict(lam=2.0) if after == "mrmtl" else {}
  runs = [Run(definition(), SILOS, seed=1, **run),
          Run(definition(lr=0.03), SILOS, seed=2, **dict(run, target_epsilon=2.0)),
          Run(definition(**other_lam), other_silos, seed=3, **run)]
  stacked = run_simulations(runs, rounds=4, backend="vectorized")
  assert [r.runs_stacked for r in stacked] == [3, 3, 3]
  for spec, result in zip(runs, stacked):
    programs.release_programs()   # each alone traced from its own definition
    alone, = run_simulations([spec], rounds=4, backend="vectorized")
    np.testing.assert_array_equal(result.clusters, alone.clusters)
    _assert_same(alone, result)
    for mine, its in zip(result.server_weights, alone.server_weights):
      for a, b in zip(mine, its):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ifca_scores_silos_in_chunks_with_the_same_run(monkeypatch):
  """With a memory budget of one silo per call the cluster scores go through a
  map over chunks (taken: recorded), and the run is the one scored in one call."""
  from tff_silo.backends.vectorized import clustered, training
  options, run = IFCA_CASES["fedavg_dp_selection"]
  definition = algorithms.ifca_algorithm(
      MODEL, SILOS.feature_shape, client_learning_rate=0.1, batch_size=8,
      total_rounds=3, **dict(dict(num_clusters=2), **options))
  whole = run_simulation(definition, SILOS, rounds=3, seed=4, backend="vectorized", **run)
  calls = []
  chunked_map = training.map_in_chunks

  def recorded(fn, elems, items_per_call, signature):
    calls.append((items_per_call, tf.nest.flatten(elems)[0].shape[0]))
    return chunked_map(fn, elems, items_per_call, signature)

  monkeypatch.setattr(training, "MEMORY_BUDGET_FLOATS", 1)
  monkeypatch.setattr(training, "map_in_chunks", recorded)
  programs.release_programs()
  chunked = run_simulation(definition, SILOS, rounds=3, seed=4, backend="vectorized",
                           **run)
  assert calls and all(n == 1 and k == SILOS.num_silos for n, k in calls)
  np.testing.assert_array_equal(chunked.clusters, whole.clusters)
  _assert_same(whole, chunked)
  assert clustered.selection_silos_per_call(MODEL, 2, None) == np.iinfo(np.int32).max


def test_map_in_chunks_is_vectorized_map():
  from tff_silo.backends.vectorized import training
  elems = (tf.reshape(tf.range(21.0), [7, 3]), tf.range(7))
  fn = lambda e: (tf.reduce_sum(e[0]) * tf.cast(e[1], tf.float32), e[0] * 2.0)
  want = tf.vectorized_map(fn, elems)
  spec = (tf.TensorSpec([], tf.float32), tf.TensorSpec([3], tf.float32))
  for per_call in (1, 3, 7, 100):
    got = tf.function(lambda: training.map_in_chunks(fn, elems, per_call, spec))()
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow
@pytest.mark.tff
def test_vectorized_private_selection_draws_the_tff_noise():
  """Over seeds, the private choices vary and both backends make the same ones."""
  options, run = IFCA_CASES["fedavg_dp_selection"]
  definition = algorithms.ifca_algorithm(
      MODEL, SILOS.feature_shape, client_learning_rate=0.1, batch_size=8,
      total_rounds=1, **options)
  choices = {backend: np.array([run_simulation(definition, SILOS, rounds=1, seed=seed,
                                               backend=backend, **run).clusters
                                for seed in range(3)])
             for backend in ("tff", "vectorized")}
  np.testing.assert_array_equal(choices["vectorized"], choices["tff"])
  assert len(np.unique(choices["tff"])) == 3


@pytest.mark.tff
def test_vectorized_ifca_on_a_cnn():
  small, cnn = _small_digits()
  definition = algorithms.ifca_algorithm(
      cnn, small.feature_shape, client_learning_rate=0.1, batch_size=4, total_rounds=2,
      num_clusters=2, selection_fraction=0.5, after="mrmtl", lam=0.3, l2_norm_clip=1.0,
      selection_budget_share=0.3)
  reference, vectorized = _both(definition, small, rounds=2, target_epsilon=8.0,
                                target_delta=1e-3, protocol=PUBLIC)
  np.testing.assert_array_equal(vectorized.clusters, reference.clusters)
  _assert_same(reference, vectorized, atol=1e-5)


@pytest.mark.parametrize("nu, cap", [(5.0, 1.2), (None, None)])
@pytest.mark.tff
def test_vectorized_dprivate_clustering_computes_what_the_tff_process_computes(nu, cap):
  """Sanitized (35 participations against a cap of 3 for each of 10 users: some
  decline) and plain."""
  users = data.two_cluster_linear_silos(num_users=10, seed=0)
  definition = algorithms.dprivate_clustering_algorithm(
      models.linear_regression(2, bias=False, objective="rmse"), users.feature_shape,
      client_learning_rate=0.1, batch_size=10, num_clusters=2, nu=nu)
  reference, vectorized = (
      run_dprivate_clustering(definition, users, rounds=5, clients_per_round=7, seed=1,
                              leakage_cap=cap, backend=backend)
      for backend in ("tff", "vectorized"))
  for ref, vec in zip(reference.hypotheses, vectorized.hypotheses):
    np.testing.assert_allclose(vec[0], ref[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(vectorized.assignments, reference.assignments)
  np.testing.assert_array_equal(vectorized.leakage, reference.leakage)
  assert vectorized.declined == reference.declined
  assert (cap is None) == (reference.declined == 0)
  np.testing.assert_allclose(vectorized.silo_test_metric, reference.silo_test_metric,
                             rtol=1e-5)


def _hypernet_process():
  import hypernet  # pylint: disable=g-import-not-at-top
  from tff_silo.privacy import UserDPSettings  # pylint: disable=g-import-not-at-top
  target = models.small_cnn((8, 8, 1), 10, channels=(2, 3), hidden=4)
  return hypernet_process_for(
      hypernet.hypernet_algorithm(
hypernet.Hypernetwork(target, 4, 2, hidden_width=4), (8, 8, 1), [10] * 4,
UserDPSettings(sampling_rate=1.0), client_learning_rate=0.1, batch_size=4,
local_steps=1, hypernet_learning_rate=0.1, embedding_learning_rate=0.1))


@pytest.mark.parametrize("make, message", [
    (_hypernet_process, "HypernetProcess runs with its own driver .*hypernet.run_hypernet"),
    (lambda: process_for(algorithms.mrmtl_algorithm(
                MODEL, SILOS.feature_shape, client_learning_rate=0.1, batch_size=8,
                aggregator=tff.aggregators.robust.clipping_factory(
                    1.0, tff.aggregators.MeanFactory()))),
     "other tff.aggregators factories run on backend=tff"),
])
def test_what_the_vectorized_backend_cannot_run_is_a_one_line_error(make, message):
  with pytest.raises(ValueError, match=message):
    run_simulation(make(), SILOS, rounds=1, backend="vectorized")
  with pytest.raises(ValueError, match="backend must be one of"):
    run_simulation(make(), SILOS, rounds=1, backend="gpu")


_WITHOUT_TFF = """
import sys
class NoTff:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] == "tensorflow_federated":
      raise ImportError("tensorflow_federated imported by a vectorized run")
sys.meta_path.insert(0, NoTff())
from benchmarks import common
binary = sys.argv[1]
sys.argv = ["binary", *sys.argv[2:]]
common.run_main(__import__("benchmarks." + binary, fromlist=["main"]).main)
"""


@pytest.mark.cli
@pytest.mark.parametrize("binary, args", [
    ("run", ["--dataset=synthetic", "--methods=mrmtl,ditto,ifca_mrmtl", "--rounds=1",
             "--epsilon=2"]),
    ("hypernet", ["--num_users=6", "--rounds=1", "--sampling_rates=0.5",
                  "--clips=0.1", "--noise_multipliers=1", "--channels=4,8",
                  "--dense=8", "--hidden_width=8", "--local_steps=1"]),
])
def test_a_vectorized_run_never_imports_tff(tmp_path, binary, args):
  from tests.binaries import ROOT as root
  out = tmp_path / "rows.csv"
  done = subprocess.run([sys.executable, "-c", _WITHOUT_TFF, binary, *args,
                         "--backend=vectorized", f"--output={out}"],
                        cwd=root, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.returncode == 0, done.stderr[-2000:]
  assert out.exists()


@pytest.mark.tff
def test_an_algorithm_definition_runs_on_both_backends():
  definition = algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=0.5,
                                          client_learning_rate=0.1, batch_size=8)
  process = process_for(
      algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=0.5,
                                 client_learning_rate=0.1, batch_size=8))
  assert process.algorithm == definition
  _assert_same(run_simulation(process, SILOS, rounds=2, seed=3),
               run_simulation(definition, SILOS, rounds=2, seed=3, backend="vectorized"))
  with pytest.raises(ValueError, match="aggregator must be one of"):
    algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, client_learning_rate=0.1,
                               batch_size=8, aggregator="median")


def test_the_evaluator_splits_large_silos_into_row_blocks():
  """A silo larger than chunk_rows is evaluated in row blocks: the same metrics as
  in one piece (memory stays bounded for silos of 100,000s of examples)."""
  from tff_silo.evaluation import SiloEvaluator
  weights = [MODEL.initial_weights(k) for k in range(SILOS.num_silos)]
  whole = SiloEvaluator(MODEL, chunk_rows=1 << 20)(weights, SILOS.x_train, SILOS.y_train)
  blocks = SiloEvaluator(MODEL, chunk_rows=7)(weights, SILOS.x_train, SILOS.y_train)
  assert min(len(y) for y in SILOS.y_train) > 7
  assert blocks[0] == pytest.approx(whole[0], rel=1e-6)
  np.testing.assert_allclose(blocks[1], whole[1], rtol=1e-6)
