"""`tff_silo.pjrt`: programs lowered by TensorFlow and run by PJRT's CPU client
(every algorithm's round against TensorFlow's XLA: tests/backends/test_xla.py)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import pjrt
from tff_silo.backends.vectorized import programs

TABLE = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))


def _lookup(ids, scale):
  """Captures TABLE: a parameter after the inputs."""
  return {"rows": tf.gather(TABLE, ids) * scale, "total": tf.reduce_sum(scale)}


def test_a_program_computes_what_tensorflow_computes_with_its_captures_last():
  ids, scale = tf.constant([3, 0]), tf.constant([[1.0], [2.0]])
  function = tf.function(_lookup, jit_compile=True, autograph=False)
  lowered = pjrt.lower(function, ids, scale)
  assert lowered.inputs == (((2,), np.int32), ((2, 1), np.float32), ((4, 3), np.float32))
  np.testing.assert_array_equal(lowered.captures[0], TABLE.numpy())
  got = pjrt.PjrtFunction(_lookup)(ids, scale)
  want = _lookup(ids, scale)
  assert sorted(got) == ["rows", "total"] and isinstance(got["rows"], tf.Tensor)
  for name in want:
    np.testing.assert_array_equal(got[name].numpy(), want[name].numpy())


def test_an_input_folded_into_the_module_is_refused_not_guessed():
  """A reshape's target shape must be a constant: TensorFlow folds `n` into the
  module, which then has one parameter for two inputs."""
  function = tf.function(lambda x, n: tf.reshape(x, [n, -1]), jit_compile=True,
                         autograph=False)
  with pytest.raises(ValueError, match="1 parameters are not the program's 2 flat"):
    pjrt.lower(function, tf.ones([4]), tf.constant(2))
  with pytest.raises(TypeError, match="takes tensors only, got.*int"):
    pjrt.PjrtFunction(lambda x, n: x * n)(tf.ones([2]), 3)


def test_an_input_passed_again_stays_on_the_device():
  program = pjrt.PjrtFunction(lambda x, y: x + y)
  x = tf.constant([1.0, 2.0])
  first = program(x, tf.constant([10.0, 20.0]))
  (executable,) = program._compiled.values()   # pylint: disable=protected-access
  x_buffer, y_buffer = (b for _, b in executable._last)   # pylint: disable=protected-access
  second = program(x, tf.constant([5.0, 6.0]))
  kept, replaced = (b for _, b in executable._last)   # pylint: disable=protected-access
  assert kept is x_buffer and replaced is not y_buffer
  np.testing.assert_array_equal(first.numpy(), [11.0, 22.0])
  np.testing.assert_array_equal(second.numpy(), [6.0, 8.0])
  third = program(tf.constant([0.0, 1.0]), tf.constant([5.0, 6.0]))
  np.testing.assert_array_equal(third.numpy(), [5.0, 7.0])
  array = np.array([1.0, 1.0], np.float32)   # numpy can change: sent at every call
  program(array, tf.constant([0.0, 0.0]))
  array[:] = 3.0
  np.testing.assert_array_equal(program(array, tf.constant([0.0, 0.0])).numpy(), [3.0, 3.0])


def test_a_result_passed_back_stays_on_the_device():
  """A round's state, fed to the next round, is not sent again; a copy of it is."""
  program = pjrt.PjrtFunction(lambda state, step: {"state": state["state"] + step})
  step = tf.constant([1.0, 1.0])
  state = program({"state": tf.constant([0.0, 0.0])}, step)
  (executable,) = program._compiled.values()   # pylint: disable=protected-access
  for _ in range(3):
    state = program(state, step)
  np.testing.assert_array_equal(state["state"].numpy(), [4.0, 4.0])
  state = program({"state": tf.identity(state["state"])}, step)
  assert executable.sent == [16, 0, 0, 0, 8]
  np.testing.assert_array_equal(state["state"].numpy(), [5.0, 5.0])


def _two_layers(x, w):
  return tf.matmul(tf.nn.relu(tf.matmul(x, w)), w), tf.reduce_sum(x)


def test_a_programs_device_memory_is_its_buffers_in_xlas_assignment():
  """`buffer_bytes`: the arguments exactly, the results, and the hidden layer the
  second matmul reads among the temporaries (it grows with the batch); the
  executables a thread calls inside `executables_called` are collected once each."""
  w = tf.ones([128, 128])
  program = pjrt.PjrtFunction(_two_layers)
  with pjrt.executables_called() as called:
    program(tf.ones([64, 128]), w)
    program(tf.ones([64, 128]), w)
  program(tf.ones([512, 128]), w)   # outside: not collected
  (executable,) = called
  small = executable.buffer_bytes()
  large = pjrt.buffer_bytes(tf.function(_two_layers, jit_compile=True),
                            tf.ones([512, 128]), w)
  for batch, sizes in ((64, small), (512, large)):
    assert sizes["argument_bytes"] == (batch + 128) * 128 * 4, sizes
    assert sizes["result_bytes"] >= (batch * 128 + 1) * 4, sizes
    assert sizes["temp_bytes"] >= batch * 128 * 4, sizes
  assert large["temp_bytes"] > small["temp_bytes"]


def test_a_platform_outside_the_list_or_missing_is_one_line():
  with pytest.raises(ValueError, match="platform must be one of"):
    with programs.pjrt_rounds("xpu"):
      pass
  with pytest.raises(RuntimeError, match="^no PJRT tpu device here"):
    pjrt.client("tpu")


def test_the_hlo_facts_see_float64_dynamic_shapes_and_host_calls():
  lower = lambda f, *args: pjrt.lower(tf.function(f, jit_compile=True, autograph=False),
                                      *args)
  plain = pjrt.hlo_facts(lower(lambda x: x * 2.0, tf.ones([3, 2])))
  assert plain == dict(f64=False, dynamic=False, host_calls=[], argument_bytes=24,
                       result_bytes=24, constant_bytes=4)
  table = np.arange(3000, dtype=np.int64)
  assert pjrt.hlo_facts(lower(lambda i: tf.gather(tf.constant(table), i),
                              tf.constant([2])))["constant_bytes"] == 24000
  assert pjrt.hlo_facts(lower(lambda x: tf.cast(x, tf.float64), tf.ones([3])))["f64"]
  assert pjrt.hlo_facts(lower(lambda x: tf.boolean_mask(x, x > 0),
                              tf.ones([3])))["dynamic"]
  from jaxlib import xla_client   # an outfeed: TensorFlow lowers none of its own
  builder = xla_client.XlaBuilder("outfeed")
  shape = xla_client.shape_from_pyval(np.ones(2, np.float32))
  x = xla_client.ops.Parameter(builder, 0, shape)
  xla_client.ops.OutfeedWithToken(x, xla_client.ops.CreateToken(builder),
                                  shape.with_major_to_minor_layout_if_absent(), "")
  hlo = builder.build(x).as_serialized_hlo_module_proto()
  facts = pjrt.hlo_facts(pjrt.Lowered(hlo, (((2,), np.float32),), (),
                                      (((2,), np.float32),), None))
  assert facts["host_calls"] == ["outfeed("]


def test_pjrt_rounds_are_released_like_traced_ones(monkeypatch):
  """Beyond MAX_PROGRAMS the least recently used goes, as for TensorFlow's rounds."""
  programs.release_programs()
  monkeypatch.setattr(programs, "MAX_PROGRAMS", 2)
  with programs.pjrt_rounds("cpu"):
    made = [programs.round_program(("test", k), lambda: lambda x: x) for k in range(3)]
  assert all(isinstance(m, pjrt.PjrtFunction) for m in made)
  assert [key[0] for key in programs._ROUND_FUNCTIONS] == [("test", 1), ("test", 2)]   # pylint: disable=protected-access
  programs.release_programs()


def test_silo_outputs_run_one_program_per_padded_block_size_on_pjrt():
  """`evaluation.silo_outputs` (the pandemic's scores): inside `pjrt_rounds` by
  PJRT, each silo's blocks zero-padded to a power of two rows, so 3 silos of 5, 3
  and 9 rows in blocks of 8 make programs of 8, 4 and 1 rows; each row's output is
  the one `apply_fn` computes on its own."""
  from tff_silo import evaluation, models
  model = models.logistic_regression(3)
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in (5, 3, 9)]
  weights = [tuple(rng.normal(size=s).astype(np.float32) for s in model.weight_shapes)
             for _ in xs]
  with programs.pjrt_rounds("cpu"), pjrt.executables_called() as called:
    outputs = evaluation.silo_outputs(model, weights, xs, chunk_rows=8)
  assert sorted(e.lowered.inputs[-1][0][0] for e in called) == [1, 4, 8]
  for got, w, x in zip(outputs, weights, xs):
    want = model.apply_fn([tf.constant(v) for v in w], tf.constant(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
