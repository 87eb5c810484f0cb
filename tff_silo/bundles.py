"""A binary's rounds recorded into a portable bundle instead of run, and the
replayed bundle's results fed back in their place (issue 55; the format and the
standalone runner: `tff_silo.xla_bundle`). Both act through
`programs.bundled_rounds`, on every program `round_program` makes and on every
evaluation of rounds' results (`programs.evaluation_function`: the silos' metrics
of a vectorized runner's `SiloModels`).

`Recording`: each call of such a program is lowered to HLO (`pjrt.lower`, once
per input signature) and recorded with its arguments, each either a result of an
earlier call (the very tensor that call returned: a driver hands a round's results
to the next round and to its evaluation) or a constant (anything else: data, keys,
initial models, hyperparameters, the trace's captures). Nothing runs: a call
returns placeholders (`placeholder`: NaN, integers 0). So only a driver whose calls
are fixed before the numbers are (the ledgers' schedule: `tff_silo.simulation`,
its evaluations every `eval_every` rounds included) may export; a float constant
holding NaN was computed on the host from a placeholder and is refused.

`Replay`: the same command again. Each call must be the bundle's (its program's
HLO, its constants' digests, its results fed from the same calls, else a one-line
`BundleError`); it returns the replay's results where the bundle kept them (the
results no later round consumes: the evaluations' metric sums and the final
models; and those the driver marked as read between rounds: `keep`) and
placeholders elsewhere, which only later calls consume.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import weakref

import numpy as np
import tensorflow as tf

from tff_silo import pjrt, xla_bundle
from tff_silo.xla_bundle import BundleError


# What a bundle is to the runs' DP guarantees: it holds what their rounds read.
OUTSIDE_GUARANTEE = ("holds the silos' training data and every key of the runs (their "
                     "noise too): it is outside any DP guarantee; keep it where the "
                     "data may be, and release the rows, not the bundle")


def placeholder(shape, dtype) -> tf.Tensor:
  """What a call returns in place of a result it did not compute: NaN, or zeros
  (integers and booleans: the driver's end indexes with them)."""
  dtype = np.dtype(dtype)
  return tf.constant(np.full(shape, np.nan if dtype.kind in "fc" else 0, dtype))


def digest(value: np.ndarray) -> str:
  """A constant's identity: its dtype, shape and bytes."""
  value = np.ascontiguousarray(value)
  h = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode())
  h.update(value.tobytes())
  return h.hexdigest()


_COMPUTATION = re.compile(r"^(?:HloModule |ENTRY )?([\w.\-]+)(?:,| \{$)", re.M)


def program_digest(hlo: bytes) -> str:
  """A program's identity: its HLO text with its computations renamed in order
  (TensorFlow numbers them by how many functions the process traced before)."""
  from jaxlib import xla_client
  text = xla_client.XlaComputation(hlo).as_hlo_text()
  names = dict.fromkeys(_COMPUTATION.findall(text))
  renamed = {name: f"computation{i}" for i, name in enumerate(names)}
  if renamed:
    text = re.sub(r"\b(" + "|".join(map(re.escape, sorted(renamed, key=len, reverse=True)))
                  + r")\b", lambda m: renamed[m.group(1)], text)
  return hashlib.sha256(text.encode()).hexdigest()


class _Calls:
  """What recording and replaying share: `function` (a round program whose calls go
  to `call(lowered, flat arguments)`), and which tensors are which call's results."""

  def __init__(self):
    self._results = {}   # id(tensor) -> (weak reference, (call, result))
    self._digests = {}   # id(tensor) -> (weak reference, digest): data, once
    self.calls = 0

  def function(self, python_function) -> "BundledFunction":
    return BundledFunction(python_function, lambda: self)

  def reads_results(self, args) -> bool:
    """Whether any tensor of `args` is a result a call returned."""
    return any(self.result_of(t) is not None for t in tf.nest.flatten(args))

  def result_of(self, value):
    """(call, result) if `value` is a result a call returned, else None."""
    held = self._results.get(id(value))
    return held[1] if held is not None and held[0]() is value else None

  def constant(self, value):
    """(digest, numpy value or None where the digest was known) of an argument."""
    if isinstance(value, tf.Tensor):
      held = self._digests.get(id(value))
      if held is not None and held[0]() is value:
        return held[1], None
      array = value.numpy()
      self._digests[id(value)] = (weakref.ref(value), digest(array))
      return self._digests[id(value)][1], array
    array = np.asarray(value)
    return digest(array), array

  def keep(self, values) -> None:
    """Marks the results among `values` (tensors, nested) as read by the driver
    between rounds: a recording keeps them (`Recording.keep`); a replay, whose
    bundle kept them, returns them already."""

  def returned(self, outputs) -> None:
    for j, output in enumerate(outputs):
      self._results[id(output)] = (weakref.ref(output), (self.calls, j))
    self.calls += 1


class BundledFunction:
  """A program whose calls the bundle `calls()` records or replays: lowered once per
  input signature, as `pjrt.PjrtFunction` compiles. A round, or an `evaluation`:
  a program whose results no later call consumes and whose inputs it does not
  consume (the bundle keeps what it evaluates, if no later round consumes it)."""

  def __init__(self, python_function, calls, evaluation: bool = False):
    self._function = tf.function(python_function, autograph=False, jit_compile=True)
    self._calls, self._lowered, self._evaluation = calls, {}, evaluation

  def __call__(self, *args):
    flat = pjrt.flat_tensors(args)
    signature = pjrt.signature(args, flat)
    if signature not in self._lowered:
      self._lowered[signature] = pjrt.lower(self._function, *args)
    lowered = self._lowered[signature]
    return lowered.pack(self._calls().call(lowered, flat, self._evaluation))


class Recording(_Calls):
  """The round programs' calls of a command, for `write` as a bundle."""

  def __init__(self):
    super().__init__()
    self._programs, self._program_index = [], {}   # (lowered, digest, captures)
    self._lowered_index = {}   # id(lowered) -> (lowered, its program's index)
    self._constants, self._constant_index = [], {}
    self._records, self._consumed = [], set()   # each call's program and arguments
    self._read = set()   # (call, result)s the driver reads between rounds: kept

  def _constant_ref(self, value, where: str) -> list:
    key, array = self.constant(value)
    if key not in self._constant_index:
      if array is None:   # (known by digest: a constant recorded already)
        raise AssertionError("a digest seen without its constant")
      if array.dtype.kind in "fc" and np.isnan(array).any():
        raise BundleError(
            f"{where} holds NaN: computed on the host from a round's results (which "
            "a bundle records, not computes), or data with NaN; neither can be "
            "replayed")
      self._constant_index[key] = len(self._constants)
      self._constants.append(array)
    return ["c", self._constant_index[key]]

  def _program_ref(self, lowered: pjrt.Lowered, c: int) -> int:
    """The index of `lowered` among the bundle's programs (its HLO and captures)."""
    if id(lowered) not in self._lowered_index:   # (each lowered program held: ids stay)
      hlo_digest = program_digest(lowered.hlo)
      captures = tuple(self._constant_ref(v, f"round call {c}'s captured tensor {i}")[1]
                       for i, v in enumerate(lowered.captures))
      if (hlo_digest, captures) not in self._program_index:
        self._program_index[(hlo_digest, captures)] = len(self._programs)
        self._programs.append((lowered, hlo_digest, captures))
      self._lowered_index[id(lowered)] = (lowered, self._program_index[(hlo_digest,
                                                                         captures)])
    return self._lowered_index[id(lowered)][1]

  def keep(self, values) -> None:
    """The results among `values` are written back by the replay too (not only
    the final ones): the driver reads them between rounds (d-private clustering's
    validation loss after every round, `dprivate_simulation`). It may not decide
    which calls follow on them: the recording's calls are fixed before any number
    is known."""
    for value in tf.nest.flatten(values):
      source = self.result_of(value)
      if source is not None:
        self._read.add(source)

  def call(self, lowered: pjrt.Lowered, flat, evaluation: bool = False) -> list:
    c = self.calls
    program = self._program_ref(lowered, c)
    args = []
    for i, value in enumerate(flat):
      source = self.result_of(value)
      if source is None:
        args.append(self._constant_ref(value, f"round call {c}'s argument {i}"))
      else:
        if not evaluation:
          self._consumed.add(source)
        args.append(["r", *source])
    self._records.append(dict(program=program, args=args, **(
        dict(evaluation=True) if evaluation else {})))
    outputs = [placeholder(shape, dtype) for shape, dtype in lowered.outputs]
    self.returned(outputs)
    return outputs

  def write(self, directory: str, about: dict) -> dict:
    """Writes the bundle into `directory` (made if missing; a bundle there
    replaced); its manifest."""
    if not self._records:
      raise BundleError("no round program ran: nothing to export")
    os.makedirs(directory, exist_ok=True)
    for name in (xla_bundle.RESULTS, xla_bundle.REPLAY):   # an older bundle's replay
      if os.path.exists(os.path.join(directory, name)):
        os.remove(os.path.join(directory, name))
    describe = lambda shapes: [[list(s), np.dtype(d).name] for s, d in shapes]
    programs = []
    for i, (lowered, hlo_digest, captures) in enumerate(self._programs):
      xla_bundle.write_atomically(os.path.join(directory, xla_bundle.program_file(i)),
                                  lambda f, hlo=lowered.hlo: f.write(gzip.compress(hlo)))
      programs.append(dict(digest=hlo_digest, captures=list(captures),
                           inputs=describe(lowered.inputs[:len(lowered.inputs)
                                                          - len(captures)]),
                           outputs=describe(lowered.outputs)))
    keep = sorted({(c, j) for c, call in enumerate(self._records)
                   for j in range(len(programs[call["program"]]["outputs"]))}
                  - self._consumed | self._read)
    manifest = dict(format=xla_bundle.FORMAT, about=about, programs=programs,
                    constants=[dict(digest=key, shape=list(v.shape), dtype=v.dtype.name)
                               for key, v in zip(self._constant_index, self._constants)],
                    calls=self._records, keep=[list(k) for k in keep])
    xla_bundle.write_atomically(
        os.path.join(directory, xla_bundle.CONSTANTS), lambda f: np.savez_compressed(
            f, **{k: a for i, v in enumerate(self._constants)
                  for k, a in xla_bundle.packed(xla_bundle.constant_name(i), v).items()}))
    xla_bundle.write_atomically(os.path.join(directory, xla_bundle.MANIFEST),
                                lambda f: f.write(json.dumps(manifest).encode()))
    return manifest


class Replay(_Calls):
  """A replayed bundle's results, handed to the same command's round calls in order
  (`finish` when it is done: every call made)."""

  def __init__(self, directory: str):
    super().__init__()
    self.directory, self._digested = directory, {}
    self.manifest = xla_bundle.read_manifest(directory)
    self.report = xla_bundle.read_json(
        directory, xla_bundle.REPLAY,
        f"not replayed yet: run python -m tff_silo.xla_bundle {directory} first")
    with np.load(os.path.join(directory, xla_bundle.RESULTS)) as results:
      self._kept = {tuple(k): results[xla_bundle.result_name(*k)]
                    for k in self.manifest["keep"]}

  def _differs(self, c: int, what: str):
    return BundleError(
        f"round call {c}{what} differs from the bundle's in {self.directory}: the "
        "bundle was exported by another command (flags, data or version)")

  def call(self, lowered: pjrt.Lowered, flat, evaluation: bool = False) -> list:
    c, calls = self.calls, self.manifest["calls"]
    if c >= len(calls):
      raise BundleError(f"this command makes more round calls than the "
                        f"{len(calls)} of the bundle in {self.directory}: the bundle "
                        "was exported by another command")
    expected = calls[c]
    program = self.manifest["programs"][expected["program"]]
    if id(lowered) not in self._digested:   # (each lowered program held: ids stay)
      self._digested[id(lowered)] = (lowered, program_digest(lowered.hlo))
    if self._digested[id(lowered)][1] != program["digest"]:
      raise self._differs(c, "'s program")
    constants = self.manifest["constants"]
    for i, (value, ref) in enumerate(zip(flat, expected["args"])):
      source = self.result_of(value)
      if (ref[0] == "r" and source != tuple(ref[1:])) or (
          ref[0] == "c" and (source is not None
                             or self.constant(value)[0] != constants[ref[1]]["digest"])):
        raise self._differs(c, f"'s argument {i}")
    if len(flat) != len(expected["args"]):
      raise self._differs(c, "'s number of arguments")
    if evaluation != expected.get("evaluation", False):
      raise self._differs(c, "'s kind (a round or an evaluation)")
    outputs = [tf.constant(self._kept[(c, j)]) if (c, j) in self._kept
               else placeholder(shape, dtype)
               for j, (shape, dtype) in enumerate(lowered.outputs)]
    self.returned(outputs)
    return outputs

  def memory_bytes(self, calls: range) -> int:
    """The largest device memory (arguments, results, temporaries) of the programs
    of `calls`, as the replay's jaxlib reported it (0 where it reported none)."""
    memory = self.report["memory"]
    programs = {self.manifest["calls"][c]["program"] for c in calls}
    return max((sum(memory[p].get(k, 0) for k in ("argument", "output", "temp"))
                for p in programs), default=0)

  def call_seconds(self, start: int, stop: int, evaluations: bool = False) -> np.ndarray:
    """The replay's seconds of the round calls among calls start..stop-1 (and of
    the evaluations among them too, with `evaluations`)."""
    calls = self.manifest["calls"]
    return np.asarray([s for c, s in zip(range(start, stop),
                                         self.report["call_seconds"][start:stop])
                       if evaluations or not calls[c].get("evaluation", False)])

  def finish(self) -> None:
    if self.calls != len(self.manifest["calls"]):
      total = len(self.manifest["calls"])
      raise BundleError(f"this command made {self.calls} of the {total} round calls of "
                        f"the bundle in {self.directory}: the bundle was exported by "
                        "another command")
