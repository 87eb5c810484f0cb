"""Portable run bundles (issue 55): a binary's rounds, exported by `--export_xla=DIR`
as HLO modules with everything they run on, replayed on any device a PJRT client of
jaxlib drives. This module needs numpy and jaxlib only (and jax beside a jaxlib of
0.5 or newer, whose clients jax makes), nothing of TensorFlow or of tff_silo, so a
copy of this one file replays a bundle on an accelerator node:

    python -m tff_silo.xla_bundle DIR --platform=gpu   (or: python xla_bundle.py ...)

A bundle is a folder:
  manifest.json   `format`, `about` (what exported it), `programs` (each an HLO
                  module, `program_<i>.hlo.pb.gz`, with its parameters' and results'
                  shapes and dtypes and the constants it captured), `calls` in
                  order (each one's program and arguments: ["c", i] the constant
                  `c<i>`, ["r", call, result] a result of an earlier call) and
                  `keep`, the results the replay writes back: those no later call
                  consumes (the final models) and those the exporting driver
                  reads between rounds (d-private clustering's validation).
  constants.npz   the silos' data, initial models, keys, hyperparameters, tables
                  (from format 2 a large one may be stored smaller, exactly: k
                  equal blocks as one and `c<i>.tiles`, at most 256 float values
                  as uint8 codes and `c<i>.values`: `packed`).
The replay adds `results.npz` (the kept results, `r<call>_<result>`) and, last,
`replay.json`: where it ran, each program's compile seconds and device memory,
each call's seconds. Results stay on the device from call to call; only the kept
ones come back. The binary's `--import_xla=DIR` turns them into its rows.

`--calls_per_program=N` times a bundle too large to replay whole on a slow device:
it makes each program's first N calls whose inputs it made, and writes only
`timing.json` (the same report; a skipped call's seconds are null), never results.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np

FORMAT = 2   # 2: large constants may be stored smaller (`packed`); 1 is read too
FORMATS = (1, 2)
MANIFEST, CONSTANTS = "manifest.json", "constants.npz"
RESULTS, REPLAY, TIMING = "results.npz", "replay.json", "timing.json"
PLATFORMS = ("cpu", "gpu", "tpu")


class BundleError(ValueError):
  """A folder that is not a bundle this reader reads, or a replay that failed."""


def program_file(index: int) -> str:
  """A program's serialized HloModuleProto, gzipped (integer noise's tables are
  large constants in the module)."""
  return f"program_{index}.hlo.pb.gz"


def constant_name(index: int) -> str:
  return f"c{index}"


# A constant this large is stored smaller, exactly: k equal blocks along its first
# axis (the silos of runs stacked on the same data) as one block and k; a float array
# of at most 256 values (images of 8-bit pixels) as uint8 codes into its sorted
# values, a quarter of the bytes and what deflate compresses far better.
PACK_BYTES, VALUES, TILES = 1 << 20, ".values", ".tiles"


def packed(name: str, value: np.ndarray) -> dict:
  """The arrays constants.npz holds for constant `name`: itself, or its first block
  and TILES, and its codes (under `name`) and VALUES; `unpacked` inverts it."""
  if value.nbytes < PACK_BYTES:
    return {name: value}
  out, n = {}, value.shape[0] if value.ndim else 1
  for k in range(min(n, 64), 1, -1):   # the most blocks first
    if n % k or not np.array_equal(value[:1], value[n // k:n // k + 1]):
      continue
    blocks = value.reshape(k, n // k, *value.shape[1:])
    if (blocks == blocks[:1]).all():
      value, out[name + TILES] = blocks[0], np.array(k)
      break
  values, codes = (np.unique(value, return_inverse=True) if value.dtype.kind == "f"
                   else (None, None))
  if values is None or len(values) > 256 or np.isnan(values).any():
    return dict(out, **{name: value})
  return dict(out, **{name: codes.astype(np.uint8).reshape(value.shape),
                      name + VALUES: values})


def unpacked(arrays, name: str) -> np.ndarray:
  """Constant `name` of an opened constants.npz (`packed`)."""
  value = arrays[name]
  if name + VALUES in arrays.files:
    value = arrays[name + VALUES][value]
  if name + TILES in arrays.files:
    value = np.concatenate([value] * int(arrays[name + TILES]))
  return value


def result_name(call: int, result: int) -> str:
  return f"r{call}_{result}"


def read_json(directory: str, name: str, what: str) -> dict:
  """A bundle's json file; a BundleError in one line where it is missing."""
  path = os.path.join(directory, name)
  if not os.path.isfile(path):
    raise BundleError(f"{directory}: no {name} ({what})")
  with open(path) as f:
    return json.load(f)


def read_manifest(directory: str) -> dict:
  manifest = read_json(directory, MANIFEST, "not a bundle written by --export_xla")
  if manifest.get("format") not in FORMATS:
    raise BundleError(f"{directory}: a bundle of format {manifest.get('format')}; this "
                      f"reader reads formats {', '.join(map(str, FORMATS))}")
  return manifest


def write_atomically(path: str, write) -> None:
  """`write(file)` to a temporary file beside `path`, then renamed onto it."""
  temporary = f"{path}.partial"
  with open(temporary, "wb") as f:
    write(f)
  os.replace(temporary, path)


def last_uses(manifest: dict) -> dict:
  """(call, result) -> the last call consuming it."""
  last = {}
  for c, call in enumerate(manifest["calls"]):
    for ref in call["args"]:
      if ref[0] == "r":
        last[(ref[1], ref[2])] = c
  return last


class Device:
  """One PJRT device across jaxlib's generations: `put` (numpy to the device),
  `compile` (a serialized HloModuleProto), `execute` (device arrays in and out),
  `memory` (a compiled program's bytes on the device)."""

  def __init__(self, platform: str):
    if platform not in PLATFORMS:
      raise BundleError(f"platform must be one of {', '.join(PLATFORMS)}; got {platform!r}")
    import jaxlib
    from jaxlib import xla_client
    self.platform, self.jaxlib = platform, jaxlib.__version__
    self._xc = xla_client
    try:
      try:
        import jax
      except ImportError:   # jaxlib alone (before 0.5, which makes its own clients)
        make = dict(cpu="make_cpu_client", gpu="make_gpu_client", tpu="make_tpu_client")
        self.client = getattr(xla_client, make[platform])()
        self.device = self.client.devices()[0]
        self._put = lambda x: self.client.buffer_from_pyval(x, self.device)
      else:
        jax.config.update("jax_enable_x64", True)   # int64 / float64 arguments stay so
        self.device = jax.devices(platform)[0]
        self.client = self.device.client
        self._put = lambda x: jax.device_put(x, self.device)
    except RuntimeError as error:
      raise BundleError(f"no PJRT {platform} device here (jaxlib {self.jaxlib}: "
                        f"{str(error).splitlines()[0]})") from None
    self.kind = getattr(self.device, "device_kind", platform)
    self._loads = hasattr(self.client, "compile_and_load")   # jaxlib >= 0.5's API

  def put(self, value: np.ndarray):
    return self._put(np.asarray(value))

  def compile(self, hlo: bytes):
    xc = self._xc
    if self._loads:   # StableHLO in
      module = xc._xla.mlir.hlo_to_stablehlo(hlo)   # pylint: disable=protected-access
      return self.client.compile_and_load(module, xc.DeviceList((self.device,)),
                                          xc.CompileOptions())
    module = xc._xla.mlir.xla_computation_to_mlir_module(   # pylint: disable=protected-access
        xc.XlaComputation(hlo))
    return self.client.compile(module)

  def execute(self, executable, arguments) -> list:
    """The program's results (on the device, computed: waited for)."""
    if self._loads:
      results = executable.execute_sharded(list(arguments))
      outputs = [shards[0] for shards in results.disassemble_into_single_device_arrays()]
    else:
      outputs = executable.execute(list(arguments))
    for output in outputs:
      output.block_until_ready()
    return outputs

  @staticmethod
  def memory(executable) -> dict:
    """The compiled program's argument, result and temporary bytes on the device
    (what the client reports; jaxlib 0.4's CPU client reports zeros)."""
    try:
      stats = executable.get_compiled_memory_stats()
    except Exception:   # pylint: disable=broad-except  (a client without the stats)
      return {}
    return {name: int(getattr(stats, f"{name}_size_in_bytes", 0))
            for name in ("argument", "output", "temp", "generated_code")}


def replay(directory: str, platform: str = "cpu", progress=None,
           calls_per_program: int | None = None) -> dict:
  """Runs a bundle's calls in order on `platform` and writes `results.npz` and then
  `replay.json` (returned); `progress(calls done, calls)` after each call. With
  `calls_per_program`, only each program's first calls whose inputs were made, to
  time them: `timing.json` is written, and no results."""
  if calls_per_program is not None and calls_per_program < 1:
    raise BundleError(f"calls_per_program must be at least 1; got {calls_per_program}")
  manifest = read_manifest(directory)
  device = Device(platform)
  start = time.perf_counter()
  constants = np.load(os.path.join(directory, CONSTANTS))
  placed = {}

  def constant(index):
    if index not in placed:
      placed[index] = device.put(unpacked(constants, constant_name(index)))
    return placed[index]

  executables, compile_seconds, memory = [], [], []
  for i, _ in enumerate(manifest["programs"]):
    with gzip.open(os.path.join(directory, program_file(i)), "rb") as f:
      hlo = f.read()
    t0 = time.perf_counter()
    executables.append(device.compile(hlo))
    compile_seconds.append(time.perf_counter() - t0)
    memory.append(device.memory(executables[-1]))
  keep = {tuple(k) for k in manifest["keep"]}
  last = last_uses(manifest)
  held, seconds, made = {}, [], [0] * len(executables)
  calls = manifest["calls"]
  for c, call in enumerate(calls):
    program = manifest["programs"][call["program"]]
    if calls_per_program is not None and (
        made[call["program"]] >= calls_per_program
        or any(ref[0] == "r" and (ref[1], ref[2]) not in held for ref in call["args"])):
      seconds.append(None)   # timing only: not made (nor what needs its results)
      continue
    made[call["program"]] += 1
    arguments = [constant(ref[1]) if ref[0] == "c" else held[(ref[1], ref[2])]
                 for ref in call["args"]] + [constant(i) for i in program["captures"]]
    t0 = time.perf_counter()
    outputs = device.execute(executables[call["program"]], arguments)
    seconds.append(time.perf_counter() - t0)
    for j, output in enumerate(outputs):
      if (c, j) in keep or (c, j) in last:
        held[(c, j)] = output
    for ref in call["args"]:   # results no later call needs leave the device
      if ref[0] == "r" and last[(ref[1], ref[2])] == c and tuple(ref[1:]) not in keep:
        del held[(ref[1], ref[2])]
    if progress is not None:
      progress(c + 1, len(calls))
  if calls_per_program is None:
    kept = {result_name(c, j): np.asarray(held[(c, j)]) for c, j in sorted(keep)}
    write_atomically(os.path.join(directory, RESULTS), lambda f: np.savez(f, **kept))
  report = dict(format=FORMAT, platform=platform, device=device.kind,
                jaxlib=device.jaxlib, compile_seconds=compile_seconds, memory=memory,
                call_seconds=seconds, wall_seconds=time.perf_counter() - start,
                finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
                calls_per_program=calls_per_program)
  write_atomically(os.path.join(directory, REPLAY if calls_per_program is None else TIMING),
                   lambda f: f.write(json.dumps(report, indent=1).encode()))
  return report


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m tff_silo.xla_bundle",
      description="Replays a bundle written by a binary's --export_xla=DIR on a PJRT "
      "device; the same binary command with --import_xla=DIR then writes its rows.")
  parser.add_argument("directory", help="the bundle (a folder)")
  parser.add_argument("--platform", default="cpu", choices=PLATFORMS,
                      help="the PJRT device to replay on (default: cpu)")
  parser.add_argument("--calls_per_program", type=int, default=None, metavar="N",
                      help="time only each program's first N calls; writes "
                      f"{TIMING}, no results (default: every call)")
  args = parser.parse_args(argv)
  shown = [0.0]

  def progress(done, total):
    if done == total or time.perf_counter() - shown[0] > 10:
      shown[0] = time.perf_counter()
      print(f"call {done}/{total}", file=sys.stderr, flush=True)

  try:
    report = replay(args.directory, args.platform, progress, args.calls_per_program)
  except (BundleError, OSError) as error:
    print(f"xla_bundle: {error}", file=sys.stderr)
    return 1
  calls = [s for s in report["call_seconds"] if s is not None]
  written = (RESULTS if args.calls_per_program is None else
             f"{TIMING} (timing only: {len(calls)} of {len(report['call_seconds'])} calls)")
  print(f"replayed {len(calls)} calls on {report['platform']} ({report['device']}, "
        f"jaxlib {report['jaxlib']}): compile {sum(report['compile_seconds']):.2f} s, "
        f"a call's median {np.median(calls) if calls else 0:.4f} s, in all "
        f"{report['wall_seconds']:.2f} s; written: "
        f"{os.path.join(args.directory, written)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
