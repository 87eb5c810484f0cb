"""Portable run bundles (issue 55): rounds recorded (`tff_silo.bundles.Recording`),
replayed in another process by the standalone runner (`python -m
tff_silo.xla_bundle`, numpy and jaxlib only) and fed back (`Replay`): what
TensorFlow computes, only for the command that exported them. The binaries'
export, replay and import: tests/benchmarks/test_benchmark_cli.py."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import binaries
from tff_silo import bundles, xla_bundle
from tff_silo.backends.vectorized import programs

TABLE = tf.constant([[1.0, -2.0], [0.5, 3.0]])


def _step(state, data):
  """A round: state and a count in, the next out (captures TABLE)."""
  weights, count = state
  return (tf.tanh(tf.matmul(data, TABLE) + weights), count + 1), tf.reduce_sum(weights)


def _drive(bundle, data, rounds=3, host=None):
  """A driver: each round's results handed to the next (or, with `host`, changed
  on the host first); the last round's results and the first round's sum."""
  with programs.bundled_rounds(bundle):
    step = programs.round_program(("test_bundles", id(bundle)), lambda: _step)
    state = (tf.zeros([2, 2]), tf.constant(0))
    sums = []
    for _ in range(rounds):
      state, total = step(state, data)
      sums.append(total)
      if host is not None:
        state = host(state)
  programs.release_programs()
  return state, sums


# The runner in a process where TensorFlow cannot be imported (as on a node without
# it): `python -m tff_silo.xla_bundle DIR`.
RUNNER = [sys.executable, "-c", "import runpy, sys; sys.modules['tensorflow'] = None; "
          "runpy.run_module('tff_silo.xla_bundle', run_name='__main__')"]


def _replay(directory):
  proc = subprocess.run(RUNNER + [str(directory)], cwd=binaries.ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc


@pytest.mark.cli
def test_a_recorded_bundle_replayed_elsewhere_feeds_back_what_tensorflow_computes(
    tmp_path):
  data = tf.constant([[0.1, 0.2], [0.3, -0.4]])
  recording = bundles.Recording()
  _drive(recording, data)
  manifest = recording.write(str(tmp_path), about={"test": True})
  # One program, three calls: the first on constants, the later on the results
  # before them (not re-sent); only what no call consumes comes back.
  assert len(manifest["programs"]) == 1 and len(manifest["calls"]) == 3
  assert manifest["calls"][1]["args"][:2] == [["r", 0, 0], ["r", 0, 1]]
  assert manifest["keep"] == [[0, 2], [1, 2], [2, 0], [2, 1], [2, 2]]
  assert "replayed 3 calls on cpu" in _replay(tmp_path).stdout
  report = json.loads((tmp_path / xla_bundle.REPLAY).read_text())
  assert len(report["call_seconds"]) == 3 and report["platform"] == "cpu"
  state, sums = _drive(bundles.Replay(str(tmp_path)), data)
  want_state, want_sums = _drive(None, data)
  np.testing.assert_allclose(state[0].numpy(), want_state[0].numpy(), rtol=1e-6)
  assert int(state[1]) == int(want_state[1]) == 3
  np.testing.assert_allclose([float(s) for s in sums], [float(s) for s in want_sums],
                             rtol=1e-6, atol=1e-7)


@pytest.mark.cli
def test_a_replay_refuses_another_command_and_a_bundle_not_replayed(tmp_path):
  data = tf.constant([[0.1, 0.2], [0.3, -0.4]])
  recording = bundles.Recording()
  _drive(recording, data, rounds=2)
  recording.write(str(tmp_path), about={})
  with pytest.raises(bundles.BundleError, match="not replayed yet: run python -m "
                     "tff_silo.xla_bundle"):
    bundles.Replay(str(tmp_path))
  _replay(tmp_path)
  with pytest.raises(bundles.BundleError, match="round call 0's argument 2 differs"):
    _drive(bundles.Replay(str(tmp_path)), data + 1.0)   # other data
  with pytest.raises(bundles.BundleError, match="more round calls than the 2"):
    _drive(bundles.Replay(str(tmp_path)), data, rounds=3)
  replay = bundles.Replay(str(tmp_path))
  _drive(replay, data, rounds=1)
  with pytest.raises(bundles.BundleError, match="made 1 of the 2 round calls"):
    replay.finish()


def _metric(weights, data):
  return tf.reduce_sum(tf.matmul(data, weights), axis=1)


def _drive_evaluated(bundle, data, evaluate):
  """`_drive`'s rounds, each round's weights evaluated (a round's results), and
  weights made here evaluated once more (as d-private clustering's chosen models)."""
  with programs.bundled_rounds(bundle):
    step = programs.round_program(("test_bundles_evaluated", id(bundle)), lambda: _step)
    state, metrics = (tf.zeros([2, 2]), tf.constant(0)), []
    for _ in range(2):
      state, _ = step(state, data)
      metrics.append(evaluate(state[0], data))
    here = evaluate(tf.ones([2, 2]), data)
  programs.release_programs()
  return state, metrics, here


@pytest.mark.cli
def test_an_evaluation_of_round_results_is_replayed_and_keeps_what_no_round_consumes(
    tmp_path):
  """`programs.evaluation_function` on a round's results is one of the bundle's
  calls (its metric comes from the replay); it does not consume what it reads, so
  the final weights, which only it reads, come back too, and the first round's,
  which the next round consumes, do not. On weights made here it runs here."""
  data = tf.constant([[0.1, 0.2], [0.3, -0.4]])
  evaluate = programs.evaluation_function(_metric)
  recording = bundles.Recording()
  _, _, here = _drive_evaluated(recording, data, evaluate)
  np.testing.assert_allclose(here.numpy(), [0.6, -0.2], rtol=1e-6)   # ran here
  manifest = recording.write(str(tmp_path), about={})
  assert [call.get("evaluation", False) for call in manifest["calls"]] == [
      False, True, False, True]
  assert manifest["calls"][1]["args"][0] == ["r", 0, 0]
  assert manifest["keep"] == [[0, 2], [1, 0], [2, 0], [2, 1], [2, 2], [3, 0]]
  _replay(tmp_path)
  replay = bundles.Replay(str(tmp_path))
  state, metrics, _ = _drive_evaluated(replay, data, evaluate)
  replay.finish()
  want_state, want_metrics, _ = _drive_evaluated(None, data, evaluate)
  for got, want in zip(metrics + [state[0]], want_metrics + [want_state[0]]):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
  assert len(replay.call_seconds(0, 4)) == 2   # (the rounds'; with evaluations: 4)
  assert len(replay.call_seconds(0, 4, evaluations=True)) == 4


def test_a_result_changed_on_the_host_is_refused_at_export():
  """Nothing runs while recording: a value computed on the host from a result
  (a NaN placeholder) cannot be replayed."""
  recording = bundles.Recording()
  with pytest.raises(bundles.BundleError, match="round call 1's argument 0 holds NaN"):
    _drive(recording, tf.ones([2, 2]), host=lambda s: (s[0] * 2.0, s[1]))


def test_a_program_is_known_by_its_hlo_whatever_tensorflow_named_it():
  x = tf.ones([3])
  lower = lambda f: tf.function(f, jit_compile=True, autograph=False
                                ).experimental_get_compiler_ir(x)(stage="hlo_serialized")
  loop = lambda x: tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2.0),
                                 (0, x))[1]
  first, second = lower(loop), lower(loop)
  assert first != second   # TensorFlow numbers its functions
  assert bundles.program_digest(first) == bundles.program_digest(second)
  assert bundles.program_digest(first) != bundles.program_digest(lower(lambda x: x * 3.0))


@pytest.mark.cli
def test_the_runner_says_in_one_line_what_is_not_a_bundle(tmp_path):
  proc = subprocess.run(RUNNER + [str(tmp_path)], cwd=binaries.ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      f"xla_bundle: {tmp_path}: no manifest.json (not a bundle written by --export_xla)"]


@pytest.mark.cli
def test_a_timing_replay_makes_each_programs_first_calls_and_writes_no_results(
    tmp_path):
  """`--calls_per_program=N` (a bundle too large to replay whole on a slow device):
  the first N calls of each program, the seconds of the others null, timing.json
  only, so the bundle is still not replayed for --import_xla."""
  data = tf.constant([[0.1, 0.2], [0.3, -0.4]])
  recording = bundles.Recording()
  _drive(recording, data, rounds=3)
  recording.write(str(tmp_path), about={})
  proc = subprocess.run(RUNNER + [str(tmp_path), "--calls_per_program=2"],
                        cwd=binaries.ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "timing only: 2 of 3 calls" in proc.stdout
  report = json.loads((tmp_path / xla_bundle.TIMING).read_text())
  assert report["calls_per_program"] == 2 and report["call_seconds"][2] is None
  assert all(s > 0 for s in report["call_seconds"][:2])
  assert not (tmp_path / xla_bundle.RESULTS).exists()
  assert not (tmp_path / xla_bundle.REPLAY).exists()
  with pytest.raises(bundles.BundleError, match="not replayed yet"):
    bundles.Replay(str(tmp_path))
  with pytest.raises(xla_bundle.BundleError, match="calls_per_program must be at least 1"):
    xla_bundle.replay(str(tmp_path), calls_per_program=0)


def test_a_replays_device_memory_is_its_largest_program_among_the_calls():
  """What a row's device_memory_mb reads with --import_xla (`Replay.memory_bytes`):
  arguments, results and temporaries as the replay's jaxlib reported them, the
  largest program of the calls asked about; 0 where the jaxlib reported none."""
  replay = bundles.Replay.__new__(bundles.Replay)
  replay.manifest = {"calls": [{"program": 0}, {"program": 1}, {"program": 0}]}
  replay.report = {"memory": [dict(argument=10, output=5, temp=1, generated_code=99),
                              dict(argument=100, output=0, temp=20)]}
  assert replay.memory_bytes(range(0, 1)) == 16
  assert replay.memory_bytes(range(2, 3)) == 16
  assert replay.memory_bytes(range(0, 3)) == 120
  replay.report = {"memory": [{}, {}]}
  assert replay.memory_bytes(range(0, 3)) == 0


def test_a_constant_of_few_values_is_stored_as_codes_and_read_back_exactly(tmp_path):
  """Images of 8-bit pixels (at most 256 floats) take a byte a value in
  constants.npz, and the same silos stacked for 3 runs are stored once; anything
  else, or a small array, is stored as it is."""
  rng = np.random.default_rng(0)
  images = (rng.integers(0, 256, size=(4, 300, 28, 28)) / 255).astype(np.float32)
  stacked = np.concatenate([images] * 3)
  weights = rng.normal(size=(600, 600)).astype(np.float32)   # 360,000 values
  keys = np.tile(rng.integers(0, 2**62, size=(2, 100_000)), (2, 1))   # int64, tiled
  small = images[0, :2]
  cases = (("c0", images), ("c1", weights), ("c2", small), ("c3", stacked),
           ("c4", keys))
  arrays = {}
  for name, value in cases:
    arrays.update(xla_bundle.packed(name, value))
  assert arrays["c0"].dtype == np.uint8 and sorted(arrays) == [
      "c0", "c0.values", "c1", "c2", "c3", "c3.tiles", "c3.values", "c4", "c4.tiles"]
  assert arrays["c3"].shape == images.shape and int(arrays["c4.tiles"]) == 2
  np.savez_compressed(tmp_path / "c.npz", **arrays)
  with np.load(tmp_path / "c.npz") as stored:
    for name, value in cases:
      back = xla_bundle.unpacked(stored, name)
      assert back.dtype == value.dtype and np.array_equal(back, value)
