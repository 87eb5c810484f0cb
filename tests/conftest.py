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
  """The Ray cluster's tests first (a stable sort: the rest keep their order). Their
  cluster and its workers take ~6 GB; run first, on the worker whose share begins
  with them (worksteal takes from the end of a share), they are done before the
  test workers grow (TensorFlow keeps every XLA program it compiled: 5-7 GB a
  worker by the end of the suite), where together they exhausted a 24 GB machine
  and Ray's memory monitor killed the cluster's tasks."""
  items.sort(key=lambda item: not item.nodeid.startswith("tests/benchmarks/test_ray.py"))


def pytest_configure(config):
  config.addinivalue_line("markers", "cli: starts a Python subprocess (a binary); "
                          "`pytest -m 'not cli'` leaves these out for a quick loop")


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
