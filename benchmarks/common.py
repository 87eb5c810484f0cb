"""Helpers shared by the benchmark binaries: one-line usage errors, list flags, and
the tidy CSV every binary appends to (one row per run, resumable by `run_key`)."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

from absl import app


class UsageError(ValueError):
  """A bad flag or input; reported as one line."""


def parse_numbers(values, kind, name):
  """`values` (a list flag) as `kind`s; a UsageError naming `--name` otherwise."""
  try:
    return [kind(v) for v in values]
  except ValueError:
    raise UsageError(f"--{name} must be a comma-separated list of {kind.__name__}s, "
                     f"got {','.join(values)}") from None


def check_one_of(name, value, allowed) -> None:
  """UsageError unless flag `--name` is one of `allowed`."""
  if value not in allowed:
    raise UsageError(f"--{name} must be one of {', '.join(allowed)}; got {value!r}")


def check_among(name, values, allowed) -> None:
  """UsageError unless list flag `--name` is non-empty and within `allowed`."""
  if not values or any(v not in allowed for v in values):
    raise UsageError(f"--{name} must be among {', '.join(allowed)}; got "
                     f"{','.join(values) or 'nothing'}")


BACKENDS = ("auto", "tff", "vectorized")
DEVICES = ("auto", "cpu", "gpu")
def check_backend(backend: str, device: str) -> None:
  """UsageError for an unknown --backend / --device, or a combination that cannot
  run: a GPU for TFF's runtime (CPU only), or a GPU TensorFlow does not see."""
  check_one_of("backend", backend, BACKENDS)
  check_one_of("device", device, DEVICES)
  if backend == "tff" and device == "gpu":
    raise UsageError("--device=gpu needs the vectorized backend: TFF's runtime (the "
                     "PyPI worker_binary) runs on the CPU only")
  if device == "gpu" and not _gpus():
    raise UsageError("--device=gpu: TensorFlow sees no GPU (on a CUDA machine install "
                     "with `uv sync --extra gpu`)")


def _gpus() -> list:
  import tensorflow as tf
  return tf.config.list_physical_devices("GPU")


def backend_for(backend: str) -> str:
  """The backend a run uses: `auto` is the vectorized one (the same numbers, much
  faster; it runs every algorithm of benchmarks.run and benchmarks.hypernet)."""
  return "vectorized" if backend == "auto" else backend


def device_scope(device: str, backend: str):
  """(context manager placing TensorFlow's ops, label for the row) for --device.
  TFF's runtime runs in its CPU-only worker whatever the scope says."""
  import tensorflow as tf
  if backend == "tff":
    return contextlib.nullcontext(), "cpu (tff worker)"
  if device == "cpu" or not _gpus():
    return tf.device("/CPU:0"), "cpu"
  return tf.device("/GPU:0"), "gpu"


def peak_memory_mb() -> float:
  """Peak resident memory of this process or of any child it waited for (TFF's
  worker is one), in MB (Linux reports ru_maxrss in KB)."""
  import resource
  return max(resource.getrusage(who).ru_maxrss
             for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024.0


def round_progress(tag: str, rounds: int):
  """A `progress(rounds_done, total, seconds)` callback for the simulation drivers:
  prints `tag` and the round to stderr about every tenth round and at the end."""
  step = max(1, rounds // 10)

  def progress(rounds_done, total, seconds):
    if rounds_done % step == 0 or rounds_done == total:
      print(f"{tag}: round {rounds_done}/{total} ({seconds:.1f} s)", file=sys.stderr,
            flush=True)

  return progress


def done_rows(path: str, resume: bool) -> dict:
  """Rows already in `path`, keyed by their `run_key` (empty unless `resume`)."""
  import pandas as pd
  if not (resume and os.path.isfile(path)):
    return {}
  old = pd.read_csv(path)
  if "run_key" not in old.columns:
    return {}
  return {key: row for key, row in zip(old.run_key, old.to_dict("records"))}


def append_row(path: str, row: dict) -> None:
  """Appends a row; a file written with other columns is rewritten with their union."""
  import pandas as pd
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  new = pd.DataFrame([row])
  if os.path.exists(path):
    old_columns = list(pd.read_csv(path, nrows=0).columns)
    if old_columns != list(new.columns):
      with warnings.catch_warnings():   # all-NA columns of either side are fine here
        warnings.simplefilter("ignore", FutureWarning)
        union = pd.concat([pd.read_csv(path), new], ignore_index=True)
      union.to_csv(path, index=False)
      return
  new.to_csv(path, mode="a", header=not os.path.exists(path), index=False)


def run_main(main) -> None:
  """`app.run(main)`, printing a UsageError as `error: ...` and exiting with 2."""
  try:
    app.run(main)
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
