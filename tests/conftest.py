"""Shared test fixtures: the real data folder and TFF worker cleanup."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Saved runs' data-check key (tff_silo.runs) is a file of the tests' (and of the
# binaries they start), never the user's.
_KEY_DIR = tempfile.mkdtemp(prefix="tff_silo_key_")
atexit.register(shutil.rmtree, _KEY_DIR, True)
os.environ["TFF_SILO_DATA_KEY"] = os.path.join(_KEY_DIR, "data-check.key")

import pytest

SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                           "shared", "data"))


@pytest.fixture(scope="session")
def shared_data():
  if not os.path.isfile(os.path.join(SHARED_DATA, "school.mat")):
    pytest.skip(f"real data not found at {SHARED_DATA}")
  return SHARED_DATA


def _idx(array) -> bytes:
  """`array` (uint8 or int32) in LeCun's IDX format."""
  import numpy as np
  code = {np.uint8: 0x08, np.int32: 0x0C}[array.dtype.type]
  dtype = ">i4" if code == 0x0C else np.uint8
  return (bytes([0, 0, code, array.ndim]) + np.array(array.shape, ">i4").tobytes()
          + array.astype(dtype).tobytes())


def _write_fashion_mnist(folder, n_train=80, n_test=24, gz=True, seed=0):
  """Small Fashion-MNIST-shaped IDX files in `folder` (random images, labels
  cycling 0..9); the arrays by file name."""
  import gzip
  import numpy as np
  rng = np.random.default_rng(seed)
  arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), np.uint8),
            "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
            "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), np.uint8),
            "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8)}
  for name, array in arrays.items():
    raw = _idx(array)
    if gz:
      (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
    else:
      (folder / name).write_bytes(raw)
  return arrays


@pytest.fixture
def idx_files():
  """(write_fashion_mnist(folder, n_train, n_test, gz), to_idx(array))."""
  return _write_fashion_mnist, _idx


@pytest.fixture(scope="session", autouse=True)
def _stop_tff_workers_at_end():
  yield
  from tff_silo import runtime
  runtime.stop_tff_workers()


def pytest_collection_modifyitems(items):
  """Marks the tests of a Ray cluster `ray` (and `slow`) and those of the real data
  `real_data` (by the fixtures they use). The Ray cluster's tests first (a stable
  sort: the rest keep their order). Their cluster and its workers take ~6 GB; run
  first, on the worker whose share begins with them (worksteal takes from the end
  of a share), they are done before the test workers grow (TensorFlow keeps every
  XLA program it compiled: 5-7 GB a worker by the end of the suite), where together
  they exhausted a 24 GB machine and Ray's memory monitor killed the cluster's
  tasks."""
  for item in items:
    if "cluster" in item.fixturenames:   # a cluster's start and workers: slow
      item.add_marker(pytest.mark.ray)
      item.add_marker(pytest.mark.slow)
    if "shared_data" in item.fixturenames:
      item.add_marker(pytest.mark.real_data)
  items.sort(key=lambda item: item.get_closest_marker("ray") is None)


MARKERS = {
    "cli": "starts a Python subprocess (a binary)",
    "ray": "starts and uses a Ray cluster (the `cluster` fixture; `--extra ray`)",
    "real_data": "reads ../shared/data (the `shared_data` fixture)",
    "tff": "runs computations on TFF's runtime (its C++ worker process)",
    "slow": "takes 15 s or more alone on a 2-core machine; `pytest -m 'not slow'` is "
            "the quick loop",
}


def pytest_configure(config):
  for name, text in MARKERS.items():
    config.addinivalue_line("markers", f"{name}: {text}")


@pytest.fixture(autouse=True)
def _only_cli_tests_start_python(request, monkeypatch):
  """A test that starts a Python interpreter must be marked `cli`, so that the
  marker leaves out every slow start (TFF's worker, not Python, is exempt)."""
  if request.node.get_closest_marker("cli"):
    return
  import subprocess
  import sys

  class Refused(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
      first = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
      if os.path.realpath(first) == os.path.realpath(sys.executable):
        raise AssertionError("this test starts Python: mark it @pytest.mark.cli")
      super().__init__(args, *rest, **kwargs)

  monkeypatch.setattr(subprocess, "Popen", Refused)


@pytest.fixture(autouse=True)
def _only_tff_tests_run_tff(request):
  """A test that invokes a computation on TFF's runtime in its own process must be
  marked `tff`: a context that refuses every invocation sits on TFF's context stack
  (of the test's thread) through every other test. Where the collected tests
  imported TensorFlow (the whole suite), TFF is imported for it; a run of tests
  without TensorFlow pays no TFF import."""
  import sys
  if request.node.get_closest_marker("tff") or "tensorflow" not in sys.modules:
    yield
    return
  import tensorflow_federated as tff

  class NoRuntime(tff.framework.SyncContext):
    def invoke(self, comp, arg):
      raise AssertionError("this test runs a computation on TFF's runtime: mark it "
                           "@pytest.mark.tff")

  with tff.framework.get_context_stack().install(NoRuntime()):
    yield
