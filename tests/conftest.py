"""Shared test fixtures: the real data folder and TFF worker cleanup."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
