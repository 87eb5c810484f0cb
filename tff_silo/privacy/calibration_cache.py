"""An on-disk cache of noise calibrations, shared by runs and processes.

Calibrating a noise multiplier (`accounting.calibrate_noise_multiplier`) bisects over
many accountant evaluations, seconds per distinct (epsilon, delta, q, steps,
selections, ...) setting; a sweep or a rerun asks for the same settings again. Results
are kept in one JSON file per accountant configuration (the RDP orders, the tolerance,
the search's version and dp_accounting's version are in its name), in
`$TFF_SILO_CACHE_DIR` (default `~/.cache/tff_silo`; `off` disables the cache).

A cached value is never trusted: the caller recomputes its epsilon with
dp_accounting (two evaluations) and uses it only if it meets the target and a
relative tolerance less noise would not, so a stale or edited file can cost time,
never privacy or utility. Writes go to a temporary file renamed over
the old one, so concurrent runs may drop each other's new entries but never leave a
broken file; an unreadable file counts as empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Optional

_ENV = "TFF_SILO_CACHE_DIR"


def directory() -> Optional[str]:
  """The cache folder, or None when disabled."""
  value = os.environ.get(_ENV, os.path.join(os.path.expanduser("~"), ".cache", "tff_silo"))
  return None if value.strip().lower() in ("", "off") else value


class CalibrationCache:
  """`get(key)` / `put(key, value)` of floats under string keys, for one accountant
  configuration (`fingerprint`, any JSON-able description of it)."""

  def __init__(self, fingerprint):
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    self._name = f"calibration-{digest[:16]}.json"
    self._entries = None   # loaded on first use

  def _path(self) -> Optional[str]:
    folder = directory()
    return None if folder is None else os.path.join(folder, self._name)

  def _read(self) -> dict:
    path = self._path()
    if path is None or not os.path.isfile(path):
      return {}
    try:
      with open(path) as f:
        entries = json.load(f)
    except (OSError, ValueError):
      return {}
    if not isinstance(entries, dict):
      return {}
    return {k: v for k, v in entries.items() if isinstance(v, (int, float))}

  def get(self, key: str) -> Optional[float]:
    if self._entries is None:
      self._entries = self._read()
    value = self._entries.get(key)
    return None if value is None else float(value)

  def put(self, key: str, value: float) -> None:
    """Adds an entry; a folder that cannot be written only means no caching."""
    if self._entries is None:
      self._entries = self._read()
    self._entries[key] = float(value)
    path = self._path()
    if path is None:
      return
    merged = {**self._read(), **self._entries}
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    except OSError:
      return
    try:
      with os.fdopen(fd, "w") as f:
        json.dump(merged, f)
      os.replace(tmp, path)
    except OSError:
      if os.path.exists(tmp):
        os.remove(tmp)
