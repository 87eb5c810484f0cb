"""Stopping TFF's C++ worker process.

TFF 0.87's local C++ execution context starts `worker_binary` as a child process and
only stops it from a `__del__` that does not run at interpreter exit, so the worker
outlives Python, holds memory and keeps the parent's stdout/stderr open (a pipe
reading them never closes). `stop_tff_workers` stops every `worker_binary` child of
this process; importing this module registers it with `atexit`, and the simulation
driver calls it when a run ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time

WORKER_NAME = "worker_binary"
_STOP_TIMEOUT_S = 5.0
_stopped_any = False   # whether this process ever had a worker to stop


def _children_named(name: str):
  """PIDs of this process's direct children whose command line contains `name`."""
  me, found = os.getpid(), []
  if not os.path.isdir("/proc"):
    return found
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, IndexError):
      continue
    if ppid == me and name in cmdline:
      found.append(int(entry))
  return found


def _exited(pid: int) -> bool:
  """True once `pid` has exited (a zombie awaiting its parent's wait, or gone)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except OSError:
    return True


def stop_tff_workers(reap: bool = False) -> int:
  """Stops (SIGINT, then SIGKILL after a timeout) the TFF workers this process
  started and installs a fresh default TFF execution context, so computations run
  afterwards start a new worker. Returns how many workers were stopped.

  The stopped workers are left for TFF's own handle to reap (its `__del__` signals and
  waits on them) unless `reap` (at interpreter exit, where that handle may never
  run: no zombie is left behind for an init that might not reap it).
  """
  global _stopped_any
  pids = _children_named(WORKER_NAME)
  if not pids:
    return 0
  _stopped_any = True
  for pid in pids:
    try:
      os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + _STOP_TIMEOUT_S
  pending = set(pids)
  while pending and time.monotonic() < deadline:
    pending = {pid for pid in pending if not _exited(pid)}
    if pending:
      time.sleep(0.05)
  for pid in pending:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  if reap:
    for pid in pids:
      try:
        os.waitpid(pid, 0)
      except ChildProcessError:   # already reaped
        pass
  tff = sys.modules.get("tensorflow_federated")
  if tff is not None and not reap:
    tff.backends.native.set_sync_local_cpp_execution_context()
  return len(pids)


_pending_signal = None   # a SIGTERM that arrived inside `termination_deferred`
_deferred = 0            # blocks inside it, of every thread
_deferring = threading.Lock()
_watchdog = []           # the thread that ends a process whose exit was lost
EXIT_GRACE_S = 10.0


def exit_cleanly_on_sigterm() -> None:
  """SIGTERM ends the process through `sys.exit` (the stack unwinds, `atexit` stops
  the workers; Python's default action skips `atexit`), and it cannot be lost: a
  SystemExit raised in a gc callback (JAX's) or a `__del__` is printed as ignored
  and the run went on (../shared/RELIABILITY_CASES.md, B06), and an exit can wait
  on threads, so a watchdog thread ends the process EXIT_GRACE_S seconds after the
  signal if it is still there (the `atexit` work, then `os._exit(143)`). Inside
  `termination_deferred` (an atomic file write) the exit waits for the block's
  end."""
  signal.signal(signal.SIGTERM, _on_signal)


def _on_signal(signum, frame):
  global _pending_signal
  _pending_signal = signum
  if not _deferred:
    _leave(signum)


def _leave(signum: int) -> None:
  """In the main thread: the watchdog, a line, then SystemExit."""
  if not _watchdog:
    _watchdog.append(threading.Thread(target=_end_after_grace, args=(signum,),
                                      name="sigterm-watchdog", daemon=True))
    _watchdog[0].start()
    print(f"{signal.Signals(signum).name}: stopping; what was written is kept",
          file=sys.stderr, flush=True)
  raise SystemExit(128 + signum)


def _end_after_grace(signum: int) -> None:
  time.sleep(EXIT_GRACE_S)
  print(f"still running {EXIT_GRACE_S:g} s after {signal.Signals(signum).name} (its "
        "exit was lost or waits): ending now", file=sys.stderr, flush=True)
  try:
    atexit._run_exitfuncs()
  finally:
    os._exit(128 + signum)


@contextlib.contextmanager
def termination_deferred():
  """A block a SIGTERM does not interrupt (`exit_cleanly_on_sigterm`): one that
  arrives inside it ends the process at the end of the last such block (of any
  thread: the signal is delivered again, to the main thread's handler)."""
  global _deferred
  with _deferring:
    _deferred += 1
  try:
    yield
  finally:
    with _deferring:
      _deferred -= 1
      last = not _deferred
    if last and _pending_signal is not None:
      if threading.current_thread() is threading.main_thread():
        _leave(_pending_signal)
      else:
        os.kill(os.getpid(), _pending_signal)


_EXIT_LOOKS = 20
_EXIT_LOOK_GAP_S = 0.25


def _stop_at_exit() -> None:
  """At exit, where a worker was ever stopped: stop workers until two looks
  `_EXIT_LOOK_GAP_S` apart find none (at most `_EXIT_LOOKS` looks). One look was
  not enough: in a CI run of test_sigterm_stops_the_worker (2026-11-30) a worker
  outlived its SIGTERMed parent, holding the pipes (suspected: a computation still
  in flight in TFF's event-loop thread restarting the worker the driver stopped).
  """
  quiet = 0
  for _ in range(_EXIT_LOOKS):
    found = stop_tff_workers(reap=True)
    quiet = 0 if found else quiet + 1
    if quiet == 2 or not _stopped_any:   # a worker found was stopped: it is set
      return
    time.sleep(_EXIT_LOOK_GAP_S)


atexit.register(_stop_at_exit)
