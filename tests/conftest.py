"""Shared test fixtures: the real data folder and TFF worker cleanup."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Noise calibrations are cached on disk (tff_silo.privacy.calibration_cache): the tests
# (and the binaries they start) share a fresh folder, never the user's cache.
os.environ["TFF_SILO_CACHE_DIR"] = tempfile.mkdtemp(prefix="tff_silo_cache_")
atexit.register(shutil.rmtree, os.environ["TFF_SILO_CACHE_DIR"], True)

import pytest

SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                           "shared", "data"))


@pytest.fixture(scope="session")
def shared_data():
  if not os.path.isfile(os.path.join(SHARED_DATA, "school.mat")):
    pytest.skip(f"real data not found at {SHARED_DATA}")
  return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _stop_tff_workers_at_end():
  yield
  from tff_silo import runtime
  runtime.stop_tff_workers()
