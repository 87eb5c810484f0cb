"""Results are never lost: rows are appended atomically, an output the binary did not
write is refused in one line, and a multi-run `benchmarks.run` killed mid-way (SIGTERM
or SIGKILL) leaves a valid CSV of its finished rows that a rerun resumes from."""

import errno
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from benchmarks import common

from tests.binaries import ROOT  # the repository


def test_append_keeps_old_bytes_and_adds_columns_by_union(tmp_path):
  path = str(tmp_path / "rows.csv")
  common.append_row(path, dict(run_key="a", x=1))
  common.append_rows(path, [dict(run_key="b", x=2), dict(run_key="c", x=3)])
  first = open(path).read()
  assert first == "run_key,x\na,1\nb,2\nc,3\n"
  common.append_row(path, dict(run_key="d", x=4, y=0.5))
  table = pd.read_csv(path)
  assert list(table.run_key) == ["a", "b", "c", "d"] and table.y.isna().sum() == 3
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_rows_name_their_measured_columns_and_idealized_noise(tmp_path):
  """Times, memory and stacking follow private sizes: a row names them in
  `outside_guarantee_columns`; a row reporting an epsilon says its noise is the
  idealized real-valued one; a non-private row says neither."""
  path = str(tmp_path / "rows.csv")
  common.append_rows(path, [
      dict(run_key="a", epsilon=2.0, epsilon_spent=1.9, wall_seconds=3.0,
           runs_stacked=4),
      dict(run_key="b", epsilon=float("inf"), epsilon_spent=float("nan"),
           wall_seconds=3.0, runs_stacked=4)])
  table = pd.read_csv(path)
  assert list(table.outside_guarantee_columns) == ["wall_seconds runs_stacked"] * 2
  assert table.noise_mechanism[0] == common.NOISE_MECHANISM
  assert table.noise_mechanism.isna()[1]


def test_rows_of_integer_noise_say_so_and_where_it_is_not_certified():
  """A row of integer DP-SGD noise says so; above the sampler's ceiling (epsilon 32)
  it says the guarantee is outside what the sampler is certified for."""
  inside = common.labelled(dict(noise="integer", epsilon=8.0, epsilon_spent=7.9))
  outside = common.labelled(dict(noise="integer", epsilon=50.0, epsilon_spent=49.9))
  assert inside["noise_mechanism"].startswith("integer: the Gaussian releases")
  assert "outside what the sampler" in outside["noise_mechanism"]
  assert common.labelled(dict(noise="idealized", epsilon_spent=1.0))[
      "noise_mechanism"] == common.NOISE_MECHANISM


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
  path = str(tmp_path / "rows.csv")
  common.append_row(path, dict(run_key="a", x=1))
  os.chmod(path, 0o640)
  before = open(path, "rb").read()

  def killed(*args):
    raise KeyboardInterrupt   # as if the process were stopped mid-rename
  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    common.append_row(path, dict(run_key="b", x=2))
  assert open(path, "rb").read() == before
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
  monkeypatch.undo()
  common.append_row(path, dict(run_key="b", x=2))
  assert os.stat(path).st_mode & 0o777 == 0o640   # the file keeps its permissions


def _run(out, *extra):
  return subprocess.Popen(
      [sys.executable, "-m", "benchmarks.run", "--dataset=synthetic",
       "--methods=local,fedavg,mrmtl", "--lams=1", "--rounds=1200", f"--output={out}",
       *extra],
      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


@pytest.mark.cli
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
@pytest.mark.slow
def test_a_killed_sweep_keeps_its_finished_rows_and_resumes(tmp_path, sig):
  out = tmp_path / "rows.csv"
  proc = _run(out)
  deadline = time.monotonic() + 300
  while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
    time.sleep(0.05)
  time.sleep(0.5)   # into the second run
  proc.send_signal(sig)
  proc.communicate(timeout=120)
  assert proc.returncode != 0, "the sweep ended before the kill; make it longer"
  finished = pd.read_csv(out)
  assert 1 <= len(finished) < 3 and finished.run_key.is_unique
  again = _run(out)
  _, stderr = again.communicate(timeout=300)
  assert again.returncode == 0, stderr[-2000:]
  assert stderr.count("skipped") == len(finished)
  table = pd.read_csv(out)
  assert len(table) == 3 and table.run_key.is_unique
  pd.testing.assert_frame_equal(table.iloc[:len(finished)], finished)


_WRITER = r"""
import sys
from benchmarks import common
path, name, unique = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
for i in range(int(sys.argv[4])):
  common.append_rows(path, [dict(run_key=f"{name if not unique else 'k'}{i}", x=i)],
                     unique_key="run_key" if unique else None)
"""


@pytest.mark.cli
@pytest.mark.parametrize("unique", [False, True], ids=["distinct", "identical"])
def test_two_processes_appending_at_once_lose_no_row_and_write_a_run_once(tmp_path,
                                                                          unique):
  """Two writers, 150 appends each: distinct rows are all kept (without the lock
  184 of 400 were lost); the same run keys (two identical commands) once each."""
  path = str(tmp_path / "rows.csv")
  writers = [subprocess.Popen([sys.executable, "-c", _WRITER, path, name,
                               "1" if unique else "0", "150"], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for name in "ab"]
  for writer in writers:
    _, stderr = writer.communicate(timeout=300)
    assert writer.returncode == 0, stderr[-2000:]
  table = pd.read_csv(path)
  assert len(table) == (150 if unique else 300) and table.run_key.is_unique
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_write_that_fails_is_one_line_naming_the_file_and_keeps_it(tmp_path,
                                                                    monkeypatch):
  """An OSError while writing (a full disk: ENOSPC) is a UsageError naming the file;
  the file keeps its rows and no temporary is left."""
  path = str(tmp_path / "rows.csv")
  common.append_row(path, dict(run_key="a", x=1))
  before = open(path, "rb").read()

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(common.UsageError, match=r"cannot write .*rows.csv: No space left"):
    common.append_row(path, dict(run_key="b", x=2))
  assert open(path, "rb").read() == before
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_save_the_disk_refuses_is_one_line_and_keeps_the_row(capsys, tmp_path):
  """RELIABILITY_CASES D3: ENOSPC while saving a trained run's models lost its row
  behind a traceback; now the row is kept (saved_to empty) with one line."""
  def full_disk():
    raise OSError(errno.ENOSPC, "No space left on device")

  assert common.saved_or_reported(full_disk, "mrmtl lam=1 seed=0") is None
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: the models of mrmtl lam=1 seed=0 could not be saved (No space "
                 "left on device); its row is kept without them (saved_to empty): to "
                 "save them, make room, remove the row and run the command again"]
  assert common.saved_or_reported(lambda: str(tmp_path), "x") == str(tmp_path)
