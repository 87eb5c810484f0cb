"""The plan runner the binaries' grids go through: run keys, resume, stacking,
progress and atomic appends in one place (no flags).

A binary lists its runs as `Run`s (the CSV's run key, a progress label, and what
the binary needs to run it), and `Plan` does the rest:

    plan = Plan(runs, output=path, signature=SIGNATURE, resume=FLAGS.resume)
    for run in plan.pending: ...               # load and check before any training
    rows = plan.execute(work, rounds=T, stack_key=..., executor=...)

Runs whose key is already in `output` are skipped (their rows read back); the
others run in batches of consecutive runs with the same `stack_key` (one program
on the vectorized backend, `tff_silo.simulation.run_simulations`), in this process
or on a Ray cluster (`benchmarks.executors`), and each batch's rows are appended
by this process as soon as it finishes, so a kill loses at most the batches
running.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

from benchmarks import common, executors


# More skipped runs than this are reported in one line.
MAX_SKIP_LINES = 20


class Run(NamedTuple):
  key: str    # the `run_key` column of the run's rows
  tag: str    # how progress lines name it
  spec: Any   # what the binary needs to run it


def consecutive(items, key: Callable) -> list:
  """`items` in order as lists of consecutive items with the same non-None `key`
  (an item whose key is None is a list of its own)."""
  groups, last = [], None
  for item in items:
    k = key(item)
    if groups and k is not None and k == last:
      groups[-1].append(item)
    else:
      groups.append([item])
    last = k
  return groups


class Plan:
  """The runs of one binary invocation against its output CSV (see the module)."""

  def __init__(self, runs, *, output: str, signature=(), resume: bool = True,
               skipped_note: str = "", flag: str = "output"):
    self.runs, self.output, self.resume = list(runs), output, resume
    self._position = {run.key: i for i, run in enumerate(self.runs, 1)}
    if len(self._position) < len(self.runs):
      raise RuntimeError("two runs of one plan share a run key")
    done = common.done_rows(output, resume, signature, flag)
    self._rows = {run.key: [done[run.key]] for run in self.runs if run.key in done}
    self.pending = [run for run in self.runs if run.key not in self._rows]
    skipped = [(i, run) for i, run in enumerate(self.runs, 1) if run.key in done]
    if len(skipped) > MAX_SKIP_LINES:
      print(f"{len(skipped)} of {len(self.runs)} runs already in {output}, skipped "
            f"(--noresume reruns them){skipped_note}", file=sys.stderr)
    else:
      for i, run in skipped:
        print(f"[{i}/{len(self.runs)}] {run.tag}: already in {output}, skipped "
              f"(--noresume reruns it){skipped_note}", file=sys.stderr)

  def _label(self, batch, batch_tag) -> str:
    first, last = self._position[batch[0].key], self._position[batch[-1].key]
    if len(batch) == 1:
      return f"[{first}/{len(self.runs)}] {batch[0].tag}"
    return f"[{first}-{last}/{len(self.runs)}] " + (
        batch_tag(batch) if batch_tag else f"{batch[0].tag} and {len(batch) - 1} more "
        "(stacked)")

  def execute(self, work: Callable, *, rounds: Optional[int] = None,
              stack_key: Optional[Callable] = None, batch_tag: Optional[Callable] = None,
              summary: Optional[Callable] = None, scope=None, executor=None) -> list:
    """Runs the pending runs and returns every run's rows in plan order.

    `work(runs, progress)` (an `executors.Work` to run on a Ray `executor`) returns
    one row (a dict) or a list of rows per run (`progress` prints round progress
    when `rounds` is given, else it is None); its rows are appended to the output
    at once. `stack_key(run)` groups consecutive runs into one batch;
    `batch_tag(runs)` names a stacked batch. After each batch a line gives the runs
    done and the time left, and what `summary(rows)` says of the batch's rows. A
    ValueError (a setting the data cannot take) ends the binary as a one-line
    error; on a cluster a batch failing every attempt is reported in one line, the
    others' rows kept, and the binary ends with an error once they are written."""
    batches = consecutive(self.pending, stack_key or (lambda run: None))
    labels = [self._label(batch, batch_tag) for batch in batches]
    progress = ((lambda i: common.round_progress(labels[i], rounds)) if rounds
                else (lambda i: None))
    start = time.perf_counter()
    finished, failed = 0, []
    with common.usage_errors(), scope or contextlib.nullcontext():
      for i, results in (executor or executors.Local()).run(work, batches, progress):
        batch, label = batches[i], labels[i]
        if isinstance(results, executors.Failed):
          print(f"{label}: failed after {results.attempts} attempt(s): "
                f"{results.error}; not in {self.output} (a rerun retries it)",
                file=sys.stderr, flush=True)
          failed.append(batch)
          continue
        for run, result in zip(batch, results, strict=True):
          rows = result if isinstance(result, list) else [result]
          if any(row["run_key"] != run.key for row in rows):
            raise RuntimeError(f"{run.tag}: a row with another run's key")
          # all of a run's rows or none; resuming, none where another process wrote
          # the run meanwhile (--noresume appends a rerun's rows beside the old)
          if not common.append_rows(self.output, rows,
                                    unique_key="run_key" if self.resume else None):
            print(f"{run.tag}: already in {self.output}, written by another process "
                  "meanwhile; not written twice", file=sys.stderr, flush=True)
          self._rows[run.key] = rows
        finished += len(batch)
        if len(batches) > 1 or summary:
          elapsed = time.perf_counter() - start
          left = elapsed / finished * (len(self.pending) - finished)
          said = ""
          if summary:
            said = summary([row for run in batch for row in self._rows[run.key]]) + "; "
          print(f"{label}: {said}{finished}/{len(self.pending)} runs done in "
                f"{elapsed:.0f} s" + (f", ~{left:.0f} s left"
                                      if finished < len(self.pending) else ""),
                file=sys.stderr, flush=True)
    if failed:
      raise common.UsageError(
          f"{len(failed)} of {len(batches)} batches failed (above); the rows of the "
          f"{finished} runs that finished are in {self.output}; a rerun retries the rest")
    print(f"rows appended to {self.output} ({len(self.pending)} run(s))" if self.pending
          else f"every run was already in {self.output}; nothing appended")
    return [row for run in self.runs for row in self._rows[run.key]]
