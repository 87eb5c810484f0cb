"""XLA-compiled rounds (issue 30 item 3): each algorithm whose round compiles with
`jit_compile=True` (`programs.xla_rounds`) computes what its traced round computes,
from the same keys, batches and noise, to float32 rounding; and the same HLO run by
XLA's PJRT runtime (`programs.pjrt_rounds`, jaxlib's CPU client; issue 55) computes
what TensorFlow's XLA computes."""

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import algorithms, data, models, pjrt, xla
from tff_silo.backends.vectorized import programs
from tff_silo.backends.vectorized import training as vectorized_training
from tff_silo.dprivate_simulation import run_dprivate_clustering
from tests.backends import grid_flips
from tests.backends import test_accelerator_readiness as readiness

# Every round compiles. The hypernetwork's has a test of its own below (its users
# padded), as d-private clustering has one with users padded beside this one.
COMPILED = sorted(set(readiness.CASES) - {"hypernet_udp"})


MODES = {"traced": lambda: programs.xla_rounds(False), "xla": programs.xla_rounds,
         "pjrt": lambda: programs.pjrt_rounds("cpu")}


def _run(case, folder, mode):
  """The case's result; under PJRT its evaluation ran there too, not only its rounds."""
  programs.release_programs()
  with MODES[mode](), pjrt.executables_called() as called:
    result = readiness.CASES[case](folder)
  assert [key[1:3] for key in programs._ROUND_FUNCTIONS] == [   # pylint: disable=protected-access
      (mode != "traced", "cpu" if mode == "pjrt" else None)]
  functions = programs._ROUND_FUNCTIONS.values()   # pylint: disable=protected-access
  rounds = pjrt.executables(functions)
  evaluations = [e for e in called if not any(e is r for r in rounds)]
  assert bool(evaluations) == (mode == "pjrt"), (case, mode, len(evaluations))
  return result


# Cases whose DP-SGD gradients XLA computes with other roundings (an MLP's or a CNN's
# per-example gradients; the linear models' are compiled in both), so that integer
# noise's grid may flip (`grid_flips`): (lr, clip, B) of the case.
GRID_FLIPS = {"pandemic_mlp_node_dp": (0.1, 1.0, 16), "mrmtl_dp_cnn": (0.1, 1.0, 4)}


def _grid_tolerance(case, result) -> float:
  if case not in GRID_FLIPS:
    return 0.0
  return grid_flips.tolerance(result.privacy, *GRID_FLIPS[case])


def _assert_close(want, got, grid_atol=0.0):
  """Silo models, server models (the hypernetwork's phi and embeddings), test
  metrics; epsilons and clusters equal. `grid_atol`: what integer noise's grid
  flips may add (`GRID_FLIPS`)."""
  server = lambda r: tuple(getattr(r, "server_weights", ())) + (
      (tuple(r.phi) + (r.embeddings,),) if hasattr(r, "phi") else ())
  assert len(want.silo_weights) == len(got.silo_weights)
  assert len(server(want)) == len(server(got))
  for a, b in zip(want.silo_weights + server(want), got.silo_weights + server(got)):
    for x, y in zip(a, b):
      np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6 + grid_atol)
  if not grid_atol:   # (metrics of models within grid_atol: the models' check)
    np.testing.assert_allclose(got.silo_test_metric, want.silo_test_metric,
                               rtol=1e-5, atol=1e-6)
  for name in ("privacy", "clusters"):
    if getattr(want, name, None) is not None:
      values = lambda r: (r.privacy.epsilon_spent if name == "privacy" else r.clusters)
      np.testing.assert_array_equal(values(got), values(want))


@pytest.mark.parametrize("case", COMPILED)
@pytest.mark.slow
def test_an_xla_round_computes_what_the_traced_round_computes(case, tmp_path):
  """And PJRT's run of the round computes what TensorFlow's XLA computes."""
  want = _run(case, str(tmp_path / "a"), "traced")
  grid_atol = _grid_tolerance(case, want)
  compiled = _run(case, str(tmp_path / "b"), "xla")
  _assert_close(want, compiled, grid_atol)
  _assert_close(compiled, _run(case, str(tmp_path / "c"), "pjrt"))
  _assert_device_ready(case)


def _assert_device_ready(case):
  """The HLO PJRT just ran (issue 55 item 3): static shapes, no trip to the host
  inside, float64 exactly in the cases `readiness.F64` lists, and no table compiled
  in as a constant (integer noise's are inputs: `integer_gaussian.eager_table`).
  And the silos and the state stay on the device: after a program's first call, a
  call sends no more than a round's flags and keys (`SENT_AFTER_FIRST` bytes)."""
  functions = programs._ROUND_FUNCTIONS.values()   # pylint: disable=protected-access
  lowered = pjrt.lowered_programs(functions)
  assert lowered
  for facts in map(pjrt.hlo_facts, lowered):
    assert not facts["dynamic"] and not facts["host_calls"], (case, facts)
    assert facts["f64"] == (case in readiness.F64), (case, facts)
    assert facts["constant_bytes"] <= 1 << 16, (case, facts)
  for executable in pjrt.executables(functions):
    assert max(executable.sent[1:], default=0) <= SENT_AFTER_FIRST, (case, executable.sent)


SENT_AFTER_FIRST = 64


@pytest.mark.slow
def test_xla_hypernetwork_rounds_pad_the_users_they_sample(tmp_path, monkeypatch):
  """Seed 227 samples 3, 0, 1 and 2 of the 4 users in rounds 1-4: the compiled
  rounds run 4 (one padding), 1 (all padding), 1 and 2 users, and compute what the
  uncompiled ones compute for the users sampled."""
  import hypernet
  from hypernet.simulation import sample_users
  assert [len(sample_users(4, 0.5, 227, r)) for r in range(4)] == [3, 0, 1, 2]
  real_run = hypernet.run_hypernet
  monkeypatch.setattr(hypernet, "run_hypernet", lambda algorithm, users, **run: real_run(
      algorithm, users, **dict(run, rounds=4, seed=227)))
  compiled = _run("hypernet_udp", str(tmp_path / "b"), "xla")
  _assert_close(_run("hypernet_udp", str(tmp_path / "a"), "traced"), compiled)
  _assert_close(compiled, _run("hypernet_udp", str(tmp_path / "c"), "pjrt"))
  _assert_device_ready("hypernet_udp")


@pytest.mark.slow
def test_xla_dprivate_rounds_pad_the_users_they_sample():
  """3 of 10 users a round, padded to 4; in later rounds users decline at their
  leakage cap (3 participations each, 36 asked for), so fewer take part. The
  compiled rounds compute what the uncompiled ones compute."""
  users = data.two_cluster_linear_silos(num_users=10, seed=0)
  definition = algorithms.dprivate_clustering_algorithm(
      models.linear_regression(2, bias=False, objective="rmse"), users.feature_shape,
      client_learning_rate=0.1, batch_size=10, num_clusters=2, nu=5.0)
  results = []
  for jit in (False, True):
    programs.release_programs()
    with programs.xla_rounds(jit):
      results.append(run_dprivate_clustering(definition, users, rounds=12,
                                             clients_per_round=3, seed=1,
                                             leakage_cap=1.2, backend="vectorized"))
      assert [key[1] for key in programs._ROUND_FUNCTIONS] == [jit]   # pylint: disable=protected-access
  want, got = results
  assert want.declined > 0
  for a, b in zip(want.hypotheses, got.hypotheses):
    np.testing.assert_allclose(b[0], a[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got.assignments, want.assignments)
  np.testing.assert_array_equal(got.leakage, want.leakage)


@pytest.mark.parametrize("case", ["mrmtl_dp_poisson", "mrmtl_dp_cnn"])
@pytest.mark.slow
def test_an_xla_dp_step_in_static_chunks_computes_the_same(case, tmp_path, monkeypatch):
  """Chunks of 3 examples: a step's ~8-16 examples go through the XLA path's loop
  over static chunks several times, the last chunk padded."""
  want = _run(case, str(tmp_path / "a"), "traced")
  monkeypatch.setattr(vectorized_training, "STATIC_CHUNK_EXAMPLES", 3)
  _assert_close(want, _run(case, str(tmp_path / "b"), "xla"), _grid_tolerance(case, want))


@pytest.mark.parametrize("n", [0, 1, 127, 128, 129, 28_000, 40_000])
def test_the_blocked_prefix_sum_is_the_prefix_sum(n):
  """`xla.cumsum` (blocks of blocks under XLA, `tf.cumsum` otherwise), int32 and
  integer-valued floats over two rows, compiled and not."""
  values = np.random.default_rng(n).integers(0, 3, (2, n))
  for dtype in (tf.int32, tf.float32):
    x = tf.constant(values, dtype)
    for jit in (False, True):
      got = tf.function(xla.cumsum, jit_compile=jit)(x)
      np.testing.assert_array_equal(got, np.cumsum(values, axis=-1))


def test_a_dp_steps_example_pairs_lower_without_a_constant_of_their_count():
  """The (silo, row) pairs of a Poisson step are built at run time: `tf.repeat` of
  the silo ids was folded into a constant of K x rows values in every DP round
  (School's: 139 x 201, twice), now one of at most the Philox counter's 8 KB; and
  the compiled pairs are the uncompiled ones."""
  import types
  from tff_silo import batched_random
  from tff_silo.algorithms.poisson_sampling import PoissonSampler
  silos, rows = 64, 600
  rng = np.random.default_rng(0)
  sizes = rng.integers(1, rows + 1, silos).astype(np.int32)
  sampler = PoissonSampler(np.full(silos, 2 ** 30), sizes)
  config = types.SimpleNamespace(batches="poisson")
  keys = tf.constant(rng.integers(0, 2 ** 31, (silos, 2)), tf.int32)
  active = tf.constant(rng.random(silos) < 0.9)
  pairs = lambda keys, active: vectorized_training._static_examples(
      config, None, sizes, rows, keys, None, 3, sampler, active)
  compiled = tf.function(pairs, jit_compile=True, autograph=False)
  facts = pjrt.hlo_facts(pjrt.lower(compiled, keys, active))
  assert facts["constant_bytes"] <= 8 * batched_random._COUNTER_WIDTH, facts
  for got, want in zip(compiled(keys, active), pairs(keys, active)):
    np.testing.assert_array_equal(got, want)
