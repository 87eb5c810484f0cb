"""Runs a benchmark binary for a test and returns what `subprocess.run` would (code,
stdout, stderr), without paying a TensorFlow import per run: each binary gets one
driver process per test worker, which imports it once and runs every invocation
in turn with the flags reset in between (as a fresh process would see them).

Runs that need a process of their own still get one (`fresh=True`): anything on
TFF's runtime (its worker would outlive the driver), `benchmarks.speed` (it times
fresh processes), and tests of signals, imports or start-up output."""

import atexit
import json
import os
import selectors
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MARK = "@@binaries-result@@ "
_DRIVER = r"""
import contextlib, importlib, io, json, os, sys, threading, time, traceback
binary = sys.argv[1]
def _orphaned(parent=os.getppid()):   # the test worker died mid-run: stop too
  while os.getppid() == parent:
    time.sleep(2)
  os._exit(1)
threading.Thread(target=_orphaned, daemon=True).start()
import tensorflow  # noqa: F401  (first, outside app.run: attacks' Keras needs it)
from absl import flags
from benchmarks import common
module = importlib.import_module("benchmarks." + binary)
channel = sys.stdout
for line in sys.stdin:
  flags.FLAGS.unparse_flags()
  sys.argv = [binary, *json.loads(line)]
  out, err, code = io.StringIO(), io.StringIO(), 0
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      common.run_main(module.main)
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
      traceback.print_exc()
      code = 1
  channel.write(%r + json.dumps([code, out.getvalue(), err.getvalue()]) + "\n")
  channel.flush()
""" % _MARK

_drivers = {}
# What a binary's runs compile stays in its driver (they reached 2 GB each, up to
# six a test worker): a driver past DRIVER_MEMORY_LIMIT is replaced after its run,
# and a test worker keeps its MAX_DRIVERS most recently used drivers.
DRIVER_MEMORY_LIMIT = 1536 << 20
MAX_DRIVERS = 3


def _resident_bytes(pid) -> int:
  try:
    with open(f"/proc/{pid}/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):   # not Linux, or the driver is gone
    return 0


def _needs_own_process(binary, args) -> bool:
  return binary == "speed" or any(
      a == "--backend=tff" or (a.startswith("--aggregator=")
                               and a not in ("--aggregator=mean",
                                             "--aggregator=unweighted_mean"))
      for a in args)


def _fresh(binary, args, timeout):
  return subprocess.run([sys.executable, "-m", f"benchmarks.{binary}", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _driver(binary):
  driver = _drivers.pop(binary, None)   # (re-inserted last: the most recent)
  if driver is None or driver.poll() is not None:
    while len(_drivers) >= MAX_DRIVERS:
      _stop(next(iter(_drivers)))
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, binary], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  _drivers[binary] = driver
  return driver


def _stop(binary):
  driver = _drivers.pop(binary, None)
  if driver is not None and driver.poll() is None:
    driver.kill()
    driver.wait(timeout=30)


@atexit.register
def _stop_all():
  for binary in list(_drivers):
    _stop(binary)


def run(binary, *args, timeout=600, fresh=False):
  """`benchmarks.<binary> args` as a `subprocess.CompletedProcess` (text)."""
  args = [str(a) for a in args]
  if fresh or _needs_own_process(binary, args):
    return _fresh(binary, args, timeout)
  driver = _driver(binary)
  driver.stdin.write((json.dumps(args) + "\n").encode())
  driver.stdin.flush()
  deadline, pending = time.monotonic() + timeout, b""
  mark = _MARK.encode()
  with selectors.DefaultSelector() as selector:
    selector.register(driver.stdout, selectors.EVENT_READ)
    while True:
      *lines, pending = pending.split(b"\n")
      for line in lines:   # anything else the driver's libraries print is dropped
        if line.startswith(mark):
          code, out, err = json.loads(line[len(mark):])
          if _resident_bytes(driver.pid) > DRIVER_MEMORY_LIMIT:
            _stop(binary)
          return subprocess.CompletedProcess([binary, *args], code, out, err)
      if not selector.select(max(0.0, deadline - time.monotonic())):
        _stop(binary)
        raise subprocess.TimeoutExpired([binary, *args], timeout)
      chunk = os.read(driver.stdout.fileno(), 1 << 16)
      if not chunk:   # the driver died: report it as a failed process
        _stop(binary)
        return subprocess.CompletedProcess([binary, *args], 1, "",
                                           f"the driver of benchmarks.{binary} exited")
      pending += chunk


def through_bundle(binary, *args, bundle, rows, timeout=600):
  """`benchmarks.<binary> args` through a bundle: exported into the folder `bundle`,
  replayed by the standalone runner (`tff_silo.xla_bundle`) in a process of its own,
  and imported. (the export's process, the import's); the export must succeed
  without writing the `rows` file (it trains nothing), and the replay too."""
  exported = run(binary, *args, f"--export_xla={bundle}", timeout=timeout)
  assert exported.returncode == 0, exported.stderr[-2000:]
  assert not os.path.exists(rows), f"the export wrote {rows}"
  replay = subprocess.run([sys.executable, "-m", "tff_silo.xla_bundle", str(bundle)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  assert replay.returncode == 0, replay.stderr[-2000:]
  return exported, run(binary, *args, f"--import_xla={bundle}", timeout=timeout)
