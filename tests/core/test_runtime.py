"""SIGTERM ends a binary whatever Python runs when it lands (`runtime`): through
`sys.exit` and `atexit`, and where a gc callback or a `__del__` swallowed that
exit, by the watchdog within EXIT_GRACE_S seconds (the `atexit` work first);
inside `termination_deferred` (an atomic file write) it waits for the block's
end."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tff_silo import runtime

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
  was printed as ignored and the run went on to the end, 30 s here)."""
  code, seconds, marker, stderr = _terminated(tmp_path, "loop")
  assert code == 128 + signal.SIGTERM, (code, stderr[-2000:])
  assert seconds < runtime.EXIT_GRACE_S + 10, (seconds, stderr[-2000:])
  assert marker.startswith("atexit\n") and "ran to the end" not in marker
  assert "SIGTERM: stopping" in stderr


@pytest.mark.cli
def test_a_deferred_block_finishes_before_sigterm_ends_the_process(tmp_path):
  code, seconds, marker, stderr = _terminated(tmp_path, "deferred")
  assert code == 128 + signal.SIGTERM and seconds < runtime.EXIT_GRACE_S, stderr[-2000:]
  assert marker == "block done\natexit\n"
