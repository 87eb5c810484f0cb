"""Rounds run by XLA's PJRT runtime (issue 55): a traced program is lowered by
TensorFlow to HLO once per input signature, compiled by a PJRT client of jaxlib
(the CPU client here; a GPU or TPU client where jaxlib has one) and executed there.

TensorFlow is only the compiler: what runs is the HLO module, on whatever device
the client drives, so a round reaches accelerators that TensorFlow 2.14 cannot
(its GPU build needs CUDA 11.8, its TPU build is a package of its own).

The module's parameters are the program's flat tensor inputs, then the tensors its
trace captured (`ConcreteFunction.captured_inputs`: the graph's inputs in TF's own
order), exactly: `lower` checks that the module has one parameter per input with
that input's shape and dtype, and refuses a program that TensorFlow specialized on
an input's value (a must-be-constant input folded into the module) rather than
guessing which parameter is which. Inputs that are the same tensor as at the last
call (the stacked silos, the captured tables), and results passed back as inputs
(a round's state, fed to the next round), stay on the device between calls.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import threading
from typing import Callable

import numpy as np
import tensorflow as tf

PLATFORMS = ("cpu", "gpu", "tpu")
_CLIENTS = {}
_LOCK = threading.Lock()


def client(platform: str = "cpu"):
  """The process's PJRT client for `platform` (made on first use)."""
  if platform not in PLATFORMS:
    raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
  with _LOCK:
    if platform not in _CLIENTS:
      import jaxlib
      from jaxlib import xla_client
      try:
        _CLIENTS[platform] = (xla_client.make_cpu_client() if platform == "cpu"
                              else xla_client.make_gpu_client() if platform == "gpu"
                              else xla_client.make_tpu_client())
      except Exception as error:   # no such device, or no plugin for it in this jaxlib
        raise RuntimeError(f"no PJRT {platform} device here (jaxlib "
                           f"{jaxlib.__version__}: {error})".splitlines()[0]) from None
    return _CLIENTS[platform]


@dataclasses.dataclass(frozen=True)
class Lowered:
  """A program's HLO module (serialized `HloModuleProto`) and what its parameters
  and results are: `inputs` the (shape, dtype) of each parameter, the flat tensor
  inputs then the `captures` (the values the trace captured, passed after the
  inputs at every call); `pack` turns the flat results into the program's
  outputs."""
  hlo: bytes
  inputs: tuple
  captures: tuple
  outputs: tuple
  pack: Callable


def flat_tensors(args):
  flat = tf.nest.flatten(args, expand_composites=True)
  if not all(isinstance(t, (tf.Tensor, np.ndarray)) for t in flat):
    kinds = sorted({type(t).__name__ for t in flat
                    if not isinstance(t, (tf.Tensor, np.ndarray))})
    raise TypeError(f"a PJRT program takes tensors only, got {kinds}")
  return flat


def signature(args, flat) -> tuple:
  """What a program is lowered once for: the structure of `args` and the shapes and
  dtypes of their `flat` tensors."""
  return (repr(tf.nest.map_structure(lambda _: 0, args, expand_composites=True)),
          tuple((tuple(t.shape), str(t.dtype)) for t in flat))


def lower(function: tf.types.experimental.GenericFunction, *args) -> Lowered:
  """`function` (a `tf.function` with `jit_compile=True`) lowered to HLO for
  `args`; a ValueError if the module's parameters are not the flat inputs."""
  from jaxlib import xla_client
  concrete = function.get_concrete_function(*args)
  captures = tuple(concrete.captured_inputs)
  if any(t.dtype == tf.resource for t in captures):
    raise TypeError("a PJRT program cannot capture variables (resource handles)")
  flat = flat_tensors(args) + list(captures)
  inputs = tuple((tuple(t.shape), tf.as_dtype(t.dtype).as_numpy_dtype) for t in flat)
  hlo = function.experimental_get_compiler_ir(*args)(stage="hlo_serialized")
  shape = xla_client.XlaComputation(hlo).program_shape()
  params = [(tuple(p.dimensions()), np.dtype(p.numpy_dtype()))
            for p in shape.parameter_shapes()]
  if params != [(s, np.dtype(d)) for s, d in inputs]:
    raise ValueError(
        f"the HLO module's {len(params)} parameters are not the program's "
        f"{len(inputs)} flat inputs and captures (TensorFlow folded an input it needs "
        f"as a constant into the module, or dropped one): make such an input part of "
        f"the program's key, not a tensor")
  structure = concrete.structured_outputs
  result = shape.result_shape()
  leaves = result.tuple_shapes() if result.is_tuple() else [result]
  outputs = tuple((tuple(s.dimensions()), np.dtype(s.numpy_dtype())) for s in leaves)
  pack = lambda values: tf.nest.pack_sequence_as(structure, values,
                                                 expand_composites=True)
  return Lowered(hlo, inputs, tuple(t.numpy() for t in captures), outputs, pack)


# HLO that sends values to or from the host inside a program.
_HOST_OPS = re.compile(r"\b(send|recv|send-done|recv-done|infeed|outfeed)\(|"
                       r'custom_call_target="[^"]*(callback|Callback|host)[^"]*"')


# A constant instruction: its element type and dimensions.
_CONSTANT = re.compile(r"= ([a-z]+)(\d*)\[([\d,]*)\]\S* constant\(")


def hlo_facts(lowered: Lowered) -> dict:
  """What an accelerator needs of a lowered program, read from its HLO: `f64` (TPUs
  have no float64), `dynamic` (bounded dynamic shapes, `<=N`), `host_calls` (the
  instructions that go to the host inside the program: callbacks, send/recv,
  infeed/outfeed), `argument_bytes` and `result_bytes`, the buffers a call holds on
  the device besides its temporaries, and `constant_bytes`, the largest constant
  compiled into the module (a table there is compiled, and copied, at each use)."""
  from jaxlib import xla_client
  text = xla_client.XlaComputation(lowered.hlo).as_hlo_text()
  nbytes = lambda shapes: sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize
                              for s, d in shapes)
  constants = [max(int(bits or 8) // 8, 1) * int(np.prod(
      [int(d) for d in dims.split(",") if d], dtype=np.int64))
               for _, bits, dims in _CONSTANT.findall(text)]
  return dict(f64="f64[" in text, dynamic=bool(re.search(r"\[[^\]]*<=", text)),
              host_calls=sorted({m.group(0) for m in _HOST_OPS.finditer(text)}),
              argument_bytes=nbytes(lowered.inputs), result_bytes=nbytes(lowered.outputs),
              constant_bytes=max(constants, default=0))


def buffer_bytes(function: tf.types.experimental.GenericFunction, *args) -> dict:
  """A round's memory on a device, estimated by XLA's buffer assignment of `function`
  (`jit_compile=True`) for `args` as TensorFlow's XLA compiles it for the CPU (a
  second compilation): `argument_bytes` (its inputs), `result_bytes` (what it
  returns), `temp_bytes` (what it holds while it runs) and `constant_bytes`. A GPU's
  compiler fuses and schedules differently, so its temporaries differ; the replay of
  a bundle reports what the device's own compiler assigns (`tff_silo.xla_bundle`, on
  jaxlib 0.5 and newer)."""
  from tensorflow.compiler.xla.service import hlo_pb2
  proto = hlo_pb2.HloProto.FromString(function.experimental_get_compiler_ir(*args)(
      stage="optimized_hlo_proto_serialized"))
  sizes = dict(argument_bytes=0, result_bytes=0, temp_bytes=0, constant_bytes=0)
  for allocation in proto.buffer_assignment.buffer_allocations:
    kind = ("argument" if allocation.is_entry_computation_parameter
            else "constant" if allocation.is_constant
            else "result" if allocation.maybe_live_out
            else None if allocation.is_thread_local   # a kernel's stack, not the device's
            else "temp")
    if kind is not None:
      sizes[f"{kind}_bytes"] += int(allocation.size)
  return sizes


_COLLECTING = threading.local()


@contextlib.contextmanager
def executables_called():
  """Collects, in a list it yields, the `Executable`s this thread calls inside."""
  before, _COLLECTING.called = getattr(_COLLECTING, "called", None), []
  try:
    yield _COLLECTING.called
  finally:
    _COLLECTING.called = before


def executables(functions) -> list:
  """The `Executable`s that the `PjrtFunction`s among `functions` compiled."""
  return [e for f in functions if isinstance(f, PjrtFunction)
          for e in f._compiled.values()]   # pylint: disable=protected-access


def lowered_programs(functions) -> list:
  """The `Lowered` programs that the `PjrtFunction`s among `functions` compiled."""
  return [e.lowered for e in executables(functions)]


class Executable:
  """A lowered program compiled for one PJRT device: `__call__` takes the
  program's flat inputs (tensors or numpy arrays, its captures excluded) and
  returns its flat outputs as tensors. An input tensor that is the same object as
  at the last call, or as one of the results of the last `KEPT_CALLS` calls, keeps
  its device buffer (tensors do not change; numpy arrays can, so they go to the
  device at every call): a round's state, passed back, is not sent again."""

  KEPT_CALLS = 4   # (several runs' rounds may alternate, one per thread)

  def __init__(self, lowered: Lowered, platform: str = "cpu", estimate=None):
    from jaxlib import xla_client
    self.lowered, self.client = lowered, client(platform)
    self._estimate, self._bytes = estimate, None
    self.device = self.client.devices()[0]
    computation = xla_client.XlaComputation(lowered.hlo)
    module = xla_client._xla.mlir.xla_computation_to_mlir_module(computation)   # pylint: disable=protected-access
    self._compiled = self.client.compile(module)
    self._captured = [self._put(c) for c in lowered.captures]
    self._last = []   # (input, its buffer) of the last call, by position
    self._results = collections.deque(maxlen=self.KEPT_CALLS)   # {id: (tensor, buffer)}
    self.sent = []   # bytes of inputs each call sent to the device (captures: none)

  def _put(self, value):
    if isinstance(value, tf.Tensor):
      value = value.numpy()
    return self.client.buffer_from_pyval(np.asarray(value), self.device)

  def _buffer(self, x, kept, buffer):
    """The device buffer of input `x`, whose position held `kept` (in `buffer`),
    and the bytes sent to the device to make it."""
    if isinstance(x, tf.Tensor):
      if x is kept:
        return buffer, 0
      for results in list(self._results):
        tensor, result = results.get(id(x), (None, None))
        if tensor is x:
          return result, 0
    value = x.numpy() if isinstance(x, tf.Tensor) else np.asarray(x)
    return self._put(value), value.nbytes

  def buffer_bytes(self):
    """`buffer_bytes` of the program (computed on first use), or None where the
    executable was made without its function."""
    if self._bytes is None and self._estimate is not None:
      self._bytes = self._estimate()
    return self._bytes

  def __call__(self, flat):
    called = getattr(_COLLECTING, "called", None)
    if called is not None and not any(e is self for e in called):
      called.append(self)
    last = self._last + [(None, None)] * (len(flat) - len(self._last))
    made = [self._buffer(x, kept, buffer) for x, (kept, buffer) in zip(flat, last)]
    self.sent.append(sum(sent for _, sent in made))
    self._last = current = [(x, buffer) for x, (buffer, _) in zip(flat, made)]
    buffers = [buffer for _, buffer in current] + self._captured
    results = self._compiled.execute(buffers)
    tensors = [tf.constant(np.asarray(result)) for result in results]
    self._results.append({id(t): (t, r) for t, r in zip(tensors, results)})
    return tensors


class PjrtFunction:
  """What `tf.function(python_function, jit_compile=True)` computes, run by PJRT on
  `platform`: lowered and compiled once per input signature."""

  def __init__(self, python_function: Callable, platform: str = "cpu"):
    self.platform = platform
    self._function = tf.function(python_function, autograph=False, jit_compile=True)
    self._compiled = {}
    self._lock = threading.Lock()

  def __call__(self, *args):
    flat = flat_tensors(args)
    key = signature(args, flat)
    with self._lock:
      if key not in self._compiled:
        specs = tf.nest.map_structure(tf.type_spec_from_value, args)
        self._compiled[key] = Executable(   # (the estimate on zeros: `lower` refused
            lower(self._function, *args), self.platform,   # values the HLO depends on)
            estimate=lambda: buffer_bytes(self._function, *tf.nest.map_structure(
                lambda spec: tf.zeros(spec.shape, spec.dtype), specs)))
      executable = self._compiled[key]
    return executable.lowered.pack(executable(flat))
