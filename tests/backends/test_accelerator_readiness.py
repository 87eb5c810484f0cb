"""Accelerator readiness without an accelerator (issue 30 item 4).

Each algorithm's vectorized round is traced here on the CPU. Two properties are
checked on the traced programs:
- Every op in it has a GPU kernel registered for its dtypes. The pip build
  registers its GPU kernels on any machine.
  - A kernel for `DEFAULT` devices counts: TensorFlow registers its int32 shape
    arithmetic that way, kept in host memory on a GPU.
  - Function bodies that XLA compiles (`batched_random.philox`) are left to XLA.
  - Excepted (`HOST_OPS`): the debug checks (`Assert` and its string constants,
    which TensorFlow places on the host) and pfor's `Split` of an int32 shape
    vector (shape arithmetic on the host).
- No `tf.vectorized_map` in it falls back to a `while_loop`.

An op without such a kernel would force a host round trip inside the step loop on
a GPU, and a fallback serializes the loop.
"""

import collections
import contextlib
import logging

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import hypernet
from tff_silo import algorithms, data, models
from tff_silo.backends.vectorized import programs
from tff_silo.dprivate_simulation import run_dprivate_clustering
from tff_silo.pandemic import features, pipeline, synth
from tff_silo.privacy import PrivacyProtocol, UserDPSettings
from tff_silo.simulation import run_simulation
from tests.backends.test_vectorized import _small_digits

_KERNELS = {}
# (op, dtype) kept on the host by design; "*" any dtype.
HOST_OPS = {("Assert", "*"), ("Const", "string"), ("Split", "int32")}


def _device_kernels(op: str):
  if op not in _KERNELS:
    _KERNELS[op] = [k for k in kernels.get_registered_kernels_for_op(op).kernel
                    if k.device_type in ("GPU", "DEFAULT")]
  return _KERNELS[op]


def _fits(kernel, attrs) -> bool:
  for constraint in kernel.constraint:
    if constraint.name not in attrs:
      continue
    value = attrs[constraint.name]
    types = ([value.type] if value.WhichOneof("value") == "type"
             else list(value.list.type))
    if not set(types) <= set(constraint.allowed_values.list.type):
      return False
  return True


def ops_without_gpu_kernel(functions) -> collections.Counter:
  """(op, its dtypes) -> count, over the graphs of `functions` (tf.functions,
  every traced signature) and their function libraries."""
  missing = collections.Counter()
  for function in functions:
    for concrete in function._list_all_concrete_functions():   # pylint: disable=protected-access
      graph = concrete.graph.as_graph_def()
      called = {f.signature.name for f in graph.library.function}
      nodes = list(graph.node)
      for body in graph.library.function:
        if not body.attr["_XlaMustCompile"].b:
          nodes += list(body.node_def)
      for node in nodes:
        dtypes = tuple(sorted((name, tf.dtypes.as_dtype(value.type).name)
                              for name, value in node.attr.items()
                              if value.WhichOneof("value") == "type"))
        excepted = {(node.op, "*")} | {(node.op, dtype) for _, dtype in dtypes}
        if (node.op in called or excepted & HOST_OPS
            or any(_fits(k, node.attr) for k in _device_kernels(node.op))):
          continue
        missing[(node.op, dtypes)] += 1
  return missing


@contextlib.contextmanager
def pfor_fallbacks():
  """Collects the messages of `tf.vectorized_map` falling back to a loop (pfor
  logs them at debug or warning level on the "tensorflow" logger)."""
  found = []

  class Catch(logging.Handler):
    def emit(self, record):
      text = record.getMessage()
      if "while_loop" in text and ("converting" in text or "Fix that" in text):
        found.append(text)

  logger, handler = logging.getLogger("tensorflow"), Catch(logging.DEBUG)
  level = logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.DEBUG)
  try:
    yield found
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)


def traced_rounds(run):
  """(ops without a GPU kernel, pfor fallbacks) of the rounds `run()` traces."""
  programs.release_programs()
  with pfor_fallbacks() as fallbacks:
    run()
  rounds = list(programs._ROUND_FUNCTIONS.values())   # pylint: disable=protected-access
  assert rounds and all(r._list_all_concrete_functions() for r in rounds)   # pylint: disable=protected-access
  return ops_without_gpu_kernel(rounds), fallbacks


_LINEAR = data.heterogeneous_linear_silos(num_silos=4, num_examples=30, dim=3, seed=0)
_PUBLIC = PrivacyProtocol(public_silo_sizes=True)
_DP = dict(target_epsilon=5.0, target_delta=1e-3, protocol=_PUBLIC)


def _family(name, model, silos, run, **options):
  definition = algorithms.silo_definition(name, model, silos.feature_shape,
                                          client_learning_rate=0.1, batch_size=4,
                                          rounds=2, **options)
  return lambda: run_simulation(definition, silos, rounds=2, seed=1,
                                backend="vectorized", **run)


def _cnn_family(name, run, **options):
  small, cnn = _small_digits()
  return _family(name, cnn, small, run, **options)()


def _ifca():
  definition = algorithms.ifca_algorithm(
      models.linear_regression(3), _LINEAR.feature_shape, client_learning_rate=0.1,
      batch_size=4, total_rounds=2, num_clusters=2, selection_fraction=0.5,
      after="mrmtl", lam=0.5, l2_norm_clip=0.5, selection_budget_share=0.2)
  return run_simulation(definition, _LINEAR, rounds=2, seed=1, backend="vectorized",
                        **_DP)


def _mocha():
  """Models of 3 parameters for 4 silos: Omega through the QR of the long W, which
  XLA needs chosen in shapes, not in a conditional."""
  definition = algorithms.mocha_algorithm(
      models.linear_regression(3, bias=False), _LINEAR.feature_shape,
      num_silos=_LINEAR.num_silos,
      client_learning_rate=0.1, batch_size=4, l2_norm_clip=0.5)
  return run_simulation(definition, _LINEAR, rounds=2, seed=1, backend="vectorized",
                        **_DP)


def _dprivate():
  users = data.two_cluster_linear_silos(num_users=8, seed=0)
  definition = algorithms.dprivate_clustering_algorithm(
      models.linear_regression(2, bias=False, objective="rmse"), users.feature_shape,
      client_learning_rate=0.1, batch_size=10, num_clusters=2, nu=5.0)
  return run_dprivate_clustering(definition, users, rounds=2, clients_per_round=4,
                                 seed=1, backend="vectorized")


def _hypernet():
  users = data.label_skewed_silos("digits", *data.digits_images(), num_classes=10,
                                  num_users=4, classes_per_user=2, seed=0)
  target = models.small_cnn(users.feature_shape, 10, channels=(2, 3), hidden=4)
  algorithm = hypernet.hypernet_algorithm(
      hypernet.Hypernetwork(target, users.num_silos, 2, hidden_width=4),
      users.feature_shape, users.train_sizes,
      UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=2.0),
      client_learning_rate=0.05, batch_size=4, local_steps=2,
      hypernet_learning_rate=0.1, embedding_learning_rate=0.1)
  return hypernet.run_hypernet(algorithm, users, rounds=2, target_delta=1e-5, seed=1,
                               backend="vectorized")


def _pandemic(folder):
  """The forecasting MLP under node-level DP, narrow: 2 sampled neighbours and 16
  units (177 inputs). With 10 and the binary's 64 units, the first layer is 841 x 64,
  whose per-example gradients XLA's round materializes (test_xla's case: 46 s against
  15 s); the program is the same otherwise."""
  synth.generate(folder, "tiny", seed=0, final_week_rate=0.01, scenarios=("scenario01",))
  scenario = pipeline.load_scenario(folder, "scenario01", sample_size=2, mode="honest")
  silos = scenario.silos
  model = features.forecaster(scenario.tables, architecture="mlp", hidden=16)
  definition = algorithms.silo_definition(
      "mrmtl", model, silos.feature_shape, client_learning_rate=0.1, batch_size=16,
      rounds=1, lam=0.01, l2_norm_clip=1.0, sampling="without_replacement")
  return run_simulation(definition, silos, rounds=1, seed=1, backend="vectorized",
                        target_epsilon=50.0, target_delta=1 / silos.train_sizes,
                        protocol=PrivacyProtocol("replace_one", node_examples=21))


CASES = {
    "mrmtl_dp_poisson": lambda _: _family("mrmtl", models.linear_regression(3),
                                          _LINEAR, _DP, lam=0.5, l2_norm_clip=0.5)(),
    "ditto_replace_one": lambda _: _family(
        "ditto", models.linear_regression(3), _LINEAR,
        dict(_DP, protocol=PrivacyProtocol("replace_one")), lam=0.5, l2_norm_clip=0.5,
        sampling="without_replacement")(),
    "finetune_no_dp": lambda _: _family("finetune", models.linear_regression(3),
                                        _LINEAR, {})(),
    "mrmtl_dp_cnn": lambda _: _cnn_family("mrmtl", _DP, lam=0.3, l2_norm_clip=1.0),
    "fedavg_cnn_no_dp": lambda _: _cnn_family("fedavg", {}),
    "ifca_mrmtl_dp": lambda _: _ifca(),
    "mocha_dp": lambda _: _mocha(),
    "dprivate_clustering": lambda _: _dprivate(),
    "hypernet_udp": lambda _: _hypernet(),
    "pandemic_mlp_node_dp": lambda folder: _pandemic(folder),
}


# The cases whose round has float64 in its HLO, and where it comes from. TPUs have no
# float64, so these rounds do not run on one yet (issue 55 item 3). test_xla checks
# the HLO that PJRT runs against this list.
F64 = {
    # Kept on purpose (`privacy.selection`): in float32 the noisy scores' rounding
    # would decide near-ties often enough to matter next to the deltas used.
    "ifca_mrmtl_dp": "private selection's Gumbel noise from float64 uniforms",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_op_of_the_round_has_a_gpu_kernel_and_no_pfor_falls_back(case, tmp_path):
  missing, fallbacks = traced_rounds(lambda: CASES[case](str(tmp_path)))
  assert not missing, f"ops without a GPU kernel for their dtypes: {dict(missing)}"
  assert not fallbacks, fallbacks


def test_the_checks_see_a_missing_kernel_and_a_fallback():
  """What the round used to hold: int64 Bincount and a ragged batch's to_tensor (no
  GPU kernels); per-example conv filter gradients under vectorized_map (a loop)."""
  @tf.function
  def ragged(values, rows):
    counts = tf.math.bincount(tf.cast(rows, tf.int32), dtype=tf.int64)
    return tf.RaggedTensor.from_value_rowids(values, rows).to_tensor(), counts

  ragged(tf.constant([1.0, 2.0, 3.0]), tf.constant([0, 0, 2], tf.int64))
  missing = {op for op, _ in ops_without_gpu_kernel([ragged])}
  assert {"RaggedTensorToTensor", "Bincount"} <= missing

  kernel = tf.random.normal([3, 3, 1, 2])

  @tf.function
  def per_example(x):
    def one(xi):
      with tf.GradientTape() as tape:
        tape.watch(kernel)
        loss = tf.reduce_sum(tf.nn.conv2d(xi[None], kernel, 1, "VALID"))
      return tape.gradient(loss, kernel)
    return tf.vectorized_map(one, x)

  with pfor_fallbacks() as fallbacks:
    per_example(tf.constant(np.ones([2, 5, 5, 1], np.float32)))
  assert fallbacks
