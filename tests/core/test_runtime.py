"""SIGTERM ends a binary whatever Python runs when it lands (`runtime`): its handler
raises nothing that a gc callback or a `__del__` could swallow, runs the `atexit`
work and ends the process with the signal's default action; inside
`termination_deferred` (an atomic file write) it waits for the block's end."""

import os
import signal
import subprocess
import sys
import time

import pytest

_CHILD = r"""
import atexit, gc, sys, time
from tff_silo import runtime
runtime.exit_cleanly_on_sigterm()
marker = sys.argv[1]
atexit.register(lambda: open(marker, "a").write("atexit\n"))

def busy(phase, info):   # as JAX's _xla_gc_callback: Python work in every collection
  sum(range(2000))

gc.callbacks.append(busy)
mode = sys.argv[2]
print("ready", flush=True)
deadline = time.monotonic() + 30
if mode == "deferred":
  with runtime.termination_deferred():
    time.sleep(2)
    open(marker, "a").write("block done\n")
while time.monotonic() < deadline:   # garbage: collections (and callbacks) all along
  junk = [[i] for i in range(1000)]
  for a, b in zip(junk, junk[1:]):
    a.append(b); b.append(a)
open(marker, "a").write("ran to the end\n")
"""


def _terminated(tmp_path, mode):
  marker = tmp_path / "marker"
  proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(marker), mode],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "ready"
  time.sleep(0.5)
  sent = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=60)
  return proc.returncode, time.monotonic() - sent, marker.read_text(), stderr


@pytest.mark.cli
def test_sigterm_during_gc_callbacks_ends_the_process_after_its_atexit_work(tmp_path):
  """A loop whose collections run a callback (where the old handler's SystemExit
  was printed as ignored and the run went on to the end)."""
  code, seconds, marker, stderr = _terminated(tmp_path, "loop")
  assert code == -signal.SIGTERM and seconds < 20, (code, seconds, stderr[-2000:])
  assert marker == "atexit\n"
  assert "terminated by SIGTERM" in stderr and "Exception ignored" not in stderr


@pytest.mark.cli
def test_a_deferred_block_finishes_before_sigterm_ends_the_process(tmp_path):
  code, _, marker, stderr = _terminated(tmp_path, "deferred")
  assert code == -signal.SIGTERM, stderr[-2000:]
  assert marker == "block done\natexit\n"
