"""Helpers shared by the benchmark binaries: one-line usage errors, list flags, and
the tidy CSV every binary appends to (one row per run, resumable by `run_key`)."""

from __future__ import annotations

import contextlib
import gzip
import math
import numbers
import os
import sys
import tempfile
import warnings
from typing import Callable, Optional

from absl import app
from absl import flags

from benchmarks.harness import spec
from benchmarks.harness.spec import UsageError  # noqa: F401  (the binaries' error)

FLAGS = flags.FLAGS




def binary_interpreter(script: str, binary: str, stdin: Optional[str] = None):
  """`python -c script binary` run from the project's root with TensorFlow's logs
  quiet (a `subprocess.CompletedProcess`, text): how a tool reads a binary's flags,
  which every binary defines on absl's one global registry (one binary a process).
  The script prints its answer as JSON on its last line."""
  import subprocess
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([sys.executable, "-c", script, binary], cwd=root, input=stdin,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                        capture_output=True, text=True, timeout=300)


def check_finite_floats() -> None:
  """UsageError for any float flag set to inf or nan."""
  for name in FLAGS:
    flag = FLAGS[name]
    if (flag.flag_type() == "float" and flag.value is not None
        and not math.isfinite(flag.value)):
      raise UsageError(f"--{name} must be a finite number; got {flag.value}")


def check_given_lists() -> None:
  """UsageError for a list flag given empty (`--lams=`): it would otherwise run the
  default silently, or nothing."""
  for name in FLAGS:
    flag = FLAGS[name]
    if flag.present and isinstance(flag.value, list) and not flag.value:
      raise UsageError(f"--{name} is empty: give at least one value, or leave the flag "
                       "out for its default")


def flag_values(*names) -> dict:
  """The values of flags `names` as given or defaulted, a list flag's as a tuple:
  the fields of a binary's frozen `Settings` that are its flags unchanged."""
  return {name: tuple(FLAGS[name].value) if isinstance(FLAGS[name].value, list)
          else FLAGS[name].value for name in names}


def check_bounds(*names, **values) -> None:
  """UsageError for the first flag out of its range (`spec.RANGES`), of `names`
  (default: every range the calling module defined; a process may hold several
  binaries' flags): checked is its value in `values` (a number, or the parsed
  values of a list flag; a setting resolved from a preset) or else the flag's own;
  None (unset) passes."""
  caller = sys._getframe(1).f_globals["__name__"]
  for name in names or [n for n, bound in spec.RANGES.items() if bound[1] == caller]:
    spec.check_range(name, spec.RANGES[name][0],
                     values[name] if name in values else FLAGS[name].value)


def parse_seeds(values) -> list:
  """--seeds as distinct integers >= 0, at least one; UsageError otherwise."""
  seeds = spec.parse_items("seeds", values, int)
  if not seeds:
    raise UsageError("--seeds must name at least one seed")
  if min(seeds) < 0:
    raise UsageError(f"--seeds must be integers >= 0; got {','.join(values)}")
  return seeds


# Row-key fields that name where data was read from, not what a run trains with
LOCATION_KEYS = ("data_dir", "cache_dir")


def run_seed(seed: int, run_key: str) -> int:
  """The seed of the keys of the run that `run_key` (a binary's JSON row key, which
  names every setting the run trains with) identifies: `tff_silo.keys.run_seed` of
  the key without the folders it read from, so that no two runs of a grid share
  batches or noise and the same run elsewhere draws the same keys."""
  import json
  from tff_silo import keys
  configuration = {name: value for name, value in json.loads(run_key).items()
                   if name not in LOCATION_KEYS}
  return keys.run_seed(seed, configuration)


MAX_EPSILON = 1000.0   # beyond it a guarantee promises nothing; run without DP instead
MIN_EPSILON = 1e-3


def check_epsilon(name: str, value: float, non_private: str) -> None:
  """UsageError unless `value` of flag `--name` is an epsilon in [MIN_EPSILON,
  MAX_EPSILON]; `non_private` says how to ask for a run without DP."""
  if not value > 0:
    raise UsageError(f"--{name} must be > 0 ({non_private}); got {value}")
  if value > MAX_EPSILON:
    raise UsageError(f"--{name} must be at most {MAX_EPSILON:g} (a larger epsilon "
                     f"promises nothing); {non_private}")
  if value < MIN_EPSILON:
    raise UsageError(f"--{name} must be at least {MIN_EPSILON:g}; got {value:g}")


def check_applies(name: str, applies_to, requested, what: str = "--methods") -> None:
  """UsageError if flag `--name` was given but none of `requested` (the values of
  `what`) is among `applies_to`, the values it affects."""
  if FLAGS[name].present and not set(applies_to) & set(requested):
    raise UsageError(f"--{name} applies to {what}={','.join(applies_to)} only; "
                     f"not to {what}={','.join(map(str, requested))}")


# The groups of settings binaries share, one name per concept: a binary's `SPEC`
# takes them in (`spec.options` changes what it records or what they apply to).
BACKENDS = ("auto", "tff", "vectorized")
DEVICES = ("auto", "cpu", "gpu", "xla_cpu", "xla_gpu", "xla_tpu")   # xla_*: PJRT
EXECUTORS = ("local", "ray")   # `benchmarks.executors`
RAY_INSTALL = "uv sync --extra ray"


def pjrt_platform(device: str):
  """The PJRT platform a --device names (`xla_cpu`: `cpu`), or None."""
  return device.removeprefix("xla_") if device.startswith("xla_") else None


def backend_group(vectorized_runs: str) -> dict:
  """--backend, --device and --xla for a binary whose runs have both backends
  (`vectorized_runs`: what the vectorized backend runs of it), and the executor's
  flags (`EXECUTOR_GROUP`)."""
  return dict(
      backend=spec.string("auto", "One of {choices}: 'tff' runs TFF's runtime (the "
                          "reference), 'vectorized' each round as one TensorFlow "
                          f"program (the same numbers; {vectorized_runs}); 'auto': the "
                          "vectorized one.", choices=BACKENDS),
      device=spec.string("auto", "One of {choices}: where the vectorized backend runs "
                         "('auto': a GPU if TensorFlow sees one). 'xla_cpu', 'xla_gpu', "
                         "'xla_tpu': each round lowered to HLO by TensorFlow and "
                         "compiled and run by XLA's PJRT runtime (jaxlib's client for "
                         "that device; TensorFlow itself needs none).", choices=DEVICES),
      xla=spec.boolean(False, "Compile the vectorized backend's rounds with XLA "
                       "(jit_compile=True: static shapes, the same numbers to float32 "
                       "rounding, one compilation per data shape), as a TPU needs. Off "
                       "by default: on a 2-core CPU School's rounds take as long, the "
                       "CNN rounds (DP digits, the hypernetwork) 5-7x longer "
                       "(benchmarks/RESULTS.md)."),
      **EXECUTOR_GROUP)


EXECUTOR_GROUP = dict(   # `benchmarks.executors.from_flags`
    executor=spec.string("local", "One of {choices}: where the batches of runs go. "
                         "'local' runs them in this process; 'ray' sends each as a "
                         "task to a Ray cluster (--ray_address; needs "
                         f"`{RAY_INSTALL}`). The rows are the same; only this process "
                         "writes them.", choices=EXECUTORS, given=False),
    ray_address=spec.string("auto", "With --executor=ray: host:port of the cluster's "
                            "head (`ray start --head` prints it; it wins over "
                            "RAY_ADDRESS), or 'auto': the cluster RAY_ADDRESS names, "
                            "else one running on this machine, else a new local one of "
                            "its CPUs.", given=False),
    ray_cpus_per_task=spec.real(1.0, "With --executor=ray: the CPUs each batch asks for "
                                "(the cluster runs CPUs / this batches at once on a "
                                "machine).", bounds="> 0", given=False),
    ray_gpus_per_task=spec.real(0.0, "With --executor=ray: the GPUs each batch asks for "
                                "(fractions share one).", bounds=">= 0", given=False),
)


BUNDLE_GROUP = dict(   # `bundle_from_flags`; tff_silo/xla_bundle.py
    export_xla=spec.string(None, "Write this command's rounds into this folder as a "
                           "portable bundle instead of running them (HLO modules and "
                           "all they run on; no rows): `python -m tff_silo.xla_bundle "
                           "DIR --platform=gpu` replays it wherever jaxlib runs (no "
                           "TensorFlow needed there), then the same command with "
                           "--import_xla=DIR writes the rows.", given=False),
    import_xla=spec.string(None, "Write this command's rows from the replayed bundle in "
                           "this folder (--export_xla) instead of running its rounds: "
                           "the models and metrics the replay computed (the metrics "
                           "of models chosen here, d-private clustering's and the "
                           "pandemic's, computed here), accounted here; the rows' "
                           "device, round times and device_memory_mb "
                           "(where its jaxlib reports it) are the replay's.",
                           given=False),
)


DEVICE_MEMORY_GROUP = dict(   # `check_device_memory`, `device_memory_mb`
    device_memory=spec.boolean(False, "With --device=xla_*: estimate each round "
                               "program's memory on the device from XLA's buffer "
                               "assignment (TensorFlow compiles it once more, for the "
                               "CPU) and write the largest program a row's runs called, "
                               "its arguments, results and temporaries, as "
                               "device_memory_mb.", given=False),
)


def check_device_memory() -> None:
  """UsageError in one line where --device_memory cannot apply."""
  if FLAGS.device_memory and (pjrt_platform(FLAGS.device) is None
                              or getattr(FLAGS, "shards", 0)):
    raise UsageError("--device_memory estimates the programs PJRT runs in this "
                     "process: give --device=xla_cpu, xla_gpu or xla_tpu (no --shards)")


def executables_called(s):
  """A context manager yielding the list of PJRT executables a batch calls inside,
  collected where `s.device_memory` asks for their memory (else it stays empty)."""
  if not s.device_memory:
    return contextlib.nullcontext([])
  from tff_silo import pjrt
  return pjrt.executables_called()


def device_memory_mb(executables, replay=None, first_call: int = 0):
  """The largest device memory, in MB, of the `executables` a batch called
  (`pjrt.Executable.buffer_bytes`) or of the programs of a bundle `replay`'s calls
  since `first_call` (what the replay's jaxlib reported), or None if unknown."""
  sizes = ([replay.memory_bytes(range(first_call, replay.calls))] if replay is not None
           else [sum(e.buffer_bytes()[f"{k}_bytes"] for k in ("argument", "result", "temp"))
                 for e in executables])
  return max(sizes) / 2**20 if any(sizes) else None


def print_exported(directory: str, what: str, manifest=None) -> None:
  """The last line of an --export_xla: `what` the bundle in `directory` holds (with
  its calls and programs where `manifest` is given), the next two steps, and that
  the bundle is outside any guarantee."""
  from tff_silo import bundles
  calls = "" if manifest is None else (f": {len(manifest['calls'])} round calls of "
                                       f"{len(manifest['programs'])} program(s)")
  print(f"bundle of {what} written to {directory}{calls}. Replay it with `python -m "
        f"tff_silo.xla_bundle {directory} --platform=cpu|gpu|tpu`, then run this "
        "command with --import_xla instead of --export_xla for the rows. The bundle "
        f"{bundles.OUTSIDE_GUARANTEE}")


def replayed_seconds(replay, first_call: int, rounds: int) -> dict:
  """A run's wall_seconds (its evaluations' included) and seconds_per_round_median
  from a bundle `replay`'s seconds of its calls since `first_call` (summed per round
  where a round made several calls)."""
  import numpy as np
  seconds = replay.call_seconds(first_call, replay.calls)
  per_round = (seconds.reshape(rounds, -1).sum(axis=1)
               if rounds and len(seconds) % rounds == 0 else seconds)
  return dict(wall_seconds=float(replay.call_seconds(first_call, replay.calls,
                                                     evaluations=True).sum()),
              seconds_per_round_median=float(np.median(per_round)))


def bundle_from_flags(methods_refused=()):
  """The bundle --export_xla records into (`tff_silo.bundles.Recording`) or
  --import_xla replays from (`Replay`), or None; UsageError in one line for flags a
  bundle cannot carry (`methods_refused`: {method: why} of the binary's own)."""
  if not (FLAGS.export_xla or FLAGS.import_xla):
    return None
  if FLAGS.export_xla and FLAGS.import_xla:
    raise UsageError("--export_xla and --import_xla: give one (export writes the "
                     "bundle, import the rows of its replay)")
  flag = "--export_xla" if FLAGS.export_xla else "--import_xla"
  from tff_silo import aggregators
  refused = [
      (backend_for(FLAGS.backend) != "vectorized"
       or getattr(FLAGS, "aggregator", "mean") not in aggregators.PLAIN,
       "bundles hold the vectorized backend's rounds (plain means)"),
      (FLAGS.xla, "drop --xla (a bundle's rounds are XLA programs)"),
      (FLAGS.device != "auto",
       f"--device={FLAGS.device}: a bundle runs where it is replayed (python -m "
       "tff_silo.xla_bundle DIR --platform=...); drop --device"),
      (FLAGS.executor != "local" or getattr(FLAGS, "shards", 0),
       "a bundle's rounds are recorded in this process: drop --executor and --shards"),
      (FLAGS.export_xla and (getattr(FLAGS, "save_models", None)
                             or getattr(FLAGS, "ledger_csv", None)),
       "--export_xla runs no round: give --save_models and --ledger_csv with "
       "--import_xla")]
  refused += [(m in FLAGS.methods, why) for m, why in dict(methods_refused).items()]
  for bad, why in refused:
    if bad:
      raise UsageError(f"{flag}: {why}")
  from tff_silo import bundles
  if FLAGS.export_xla:
    check_writable(os.path.join(FLAGS.export_xla, "manifest.json"), "export_xla")
    return bundles.Recording()
  try:
    return bundles.Replay(FLAGS.import_xla)
  except (bundles.BundleError, OSError) as e:
    raise UsageError(f"--import_xla: {e}") from None


def shards_group(silos: str) -> dict:
  """--shards (`tff_silo.sharding`): one run's `silos` across shards."""
  return dict(shards=spec.integer(
      0, f"0: each run trains in one process. N >= 1: each run's {silos} are split "
      "into N shards that load and train their own where they run (tff_silo.sharding; "
      "with --executor=ray, Ray actors spread over the cluster's machines; with local, "
      "in this process), this process keeping the server model and the ledgers: the "
      f"same rows, to float32 rounding. Vectorized backend; at most the run's {silos}.",
      bounds="[0, 4096]", given=False))


def aggregator_group() -> dict:
  """--aggregator and its settings (`tff_silo.aggregators`)."""
  from tff_silo import aggregators   # no TensorFlow: names only
  return dict(
      aggregator=spec.string("mean", "The server's aggregator: one of "
                             f"{', '.join(aggregators.BUILTINS)} (tff_silo.aggregators), "
                             "or module.path:callable naming a tff.aggregators factory "
                             "(or a callable returning one). Any but the plain means "
                             "runs on TFF's runtime."),
      silo_epsilon=spec.real(None, "--aggregator=dp_fixed|dp_adaptive: the silo-level "
                             "epsilon (add/remove one silo's whole update) their noise "
                             "is calibrated to over all rounds."),
      silo_delta=spec.real(1e-3, "--aggregator=dp_fixed|dp_adaptive: the silo-level "
                           "delta.", bounds="(0, 1)"),
      aggregator_clip=spec.real(1.0, "--aggregator=dp_fixed: the L2 clip of a silo's "
                                "update (dp_adaptive: its initial clip).", bounds="> 0"))


def save_models_group(what: str) -> dict:
  """--save_models: where `what` (each run or trial) is saved (`tff_silo.runs`)."""
  return dict(save_models=spec.string(
      None, f"Save {what}'s silo models, data recipe and privacy (tff_silo.runs) in a "
      "folder of its own under this one, for `benchmarks.attacks --run`; rows say where "
      "(`saved_to`).", given=False))


OUTPUT_DIR = os.path.join("benchmarks", "out")   # git ignores it


def output_group(**paths) -> dict:
  """--output_dir, and a path flag for each `name=(file name, help)` whose default
  is that file (or folder; "." is --output_dir itself) under --output_dir, so that
  no run writes outside one ignored folder unless told to (`resolve_output_flags`)."""
  return dict(
      output_dir=spec.string(OUTPUT_DIR, "Folder every output goes to unless its own "
                             "flag names another path (git ignores the default).",
                             given=False),
      **{name: spec.string(None, help_text, output=file_name, given=False)
         for name, (file_name, help_text) in paths.items()})


def check_shards_flag(backend: str) -> None:
  """A one-line error for --shards out of bounds or with another backend than the
  vectorized one (`backend`: the one the run resolved)."""
  check_bounds("shards")
  if FLAGS.shards and backend != "vectorized":
    raise UsageError(f"--shards runs on the vectorized backend, not "
                     f"--backend={FLAGS.backend}")


def check_backend(backend: str, device: str, xla: bool = False) -> None:
  """UsageError for a --backend / --device / --xla combination that cannot run
  (their choices: the binary's SPEC checks them first): a GPU or XLA for TFF's
  runtime (CPU only, uncompiled), or a GPU TensorFlow does not see."""
  if backend == "tff" and device == "gpu":
    raise UsageError("--device=gpu needs the vectorized backend: TFF's runtime (the "
                     "PyPI worker_binary) runs on the CPU only")
  if backend == "tff" and xla:
    raise UsageError("--xla compiles the vectorized backend's rounds: use "
                     "--backend=vectorized (or auto)")
  platform = pjrt_platform(device)
  if platform is not None:
    if backend == "tff":
      raise UsageError(f"--device={device} runs the vectorized backend's rounds "
                       "through XLA's PJRT runtime: use --backend=vectorized (or auto)")
    if xla:
      raise UsageError(f"--xla: --device={device} compiles every round with XLA "
                       "already; drop --xla")
    from tff_silo import pjrt
    try:
      pjrt.client(platform)
    except RuntimeError as e:
      raise UsageError(f"--device={device}: {e}") from None
  if device == "gpu" and not _gpus():
    raise UsageError("--device=gpu: TensorFlow sees no GPU (on a CUDA machine install "
                     "with `uv sync --extra gpu`)")


def _gpus() -> list:
  import tensorflow as tf
  return tf.config.list_physical_devices("GPU")


def backend_for(backend: str, aggregator=None) -> str:
  """The backend a run uses: `auto` is the vectorized one (the same numbers, much
  faster; it runs every algorithm of benchmarks.run and benchmarks.hypernet), or
  TFF's runtime for an `aggregator` (`tff_silo.aggregators.AggregatorChoice`) other
  than the plain means, which only TFF runs."""
  if aggregator is not None and not aggregator.plain:
    if backend == "vectorized":
      raise UsageError(f"--aggregator={aggregator.name} runs on TFF's runtime only: "
                       "use --backend=tff (or auto)")
    return "tff"
  return "vectorized" if backend == "auto" else backend


def check_aggregator_flags() -> None:
  """UsageError for --aggregator settings that cannot go together."""
  from tff_silo import aggregators
  dp = FLAGS.aggregator in aggregators.DP_BUILTINS
  if "xla" in FLAGS and FLAGS.xla and FLAGS.aggregator not in aggregators.PLAIN:
    raise UsageError(f"--xla compiles the vectorized backend's rounds, and --aggregator="
                     f"{FLAGS.aggregator} runs on TFF's runtime: drop one")
  if pjrt_platform(FLAGS.device) and FLAGS.aggregator not in aggregators.PLAIN:
    raise UsageError(f"--device={FLAGS.device} runs the vectorized backend's rounds, "
                     f"and --aggregator={FLAGS.aggregator} runs on TFF's runtime: drop "
                     "one")
  if dp and FLAGS.silo_epsilon is None:
    raise UsageError(f"--aggregator={FLAGS.aggregator} needs --silo_epsilon (the "
                     "silo-level budget its noise is calibrated to)")
  for name in ("silo_epsilon", "silo_delta", "aggregator_clip"):
    if FLAGS[name].present and not dp:
      raise UsageError(f"--{name} applies to --aggregator="
                       f"{'|'.join(aggregators.DP_BUILTINS)} only")
  if FLAGS.silo_epsilon is not None:
    check_epsilon("silo_epsilon", FLAGS.silo_epsilon, "use --aggregator=mean for no "
                  "silo-level DP")
  check_bounds("silo_delta", "aggregator_clip")


def check_save_models() -> None:
  """Before any work: --save_models names a folder that exists or can be made, and
  is writable (a trained run's row was lost at the save)."""
  if FLAGS.save_models is not None:
    check_folder(FLAGS.save_models, "save_models")


def saved_or_reported(save: Callable[[], str], what: str) -> Optional[str]:
  """`save()`'s folder (`tff_silo.runs.save`, which leaves no partial folder); where
  the disk refuses it (an OSError: no space left, a folder gone read-only), one
  line on stderr naming `what`, and None: the run's row is kept without its models
  (a trained row was lost at the save: RELIABILITY_CASES D3)."""
  try:
    return save()
  except OSError as e:
    print(f"error: the models of {what} could not be saved ({e.strerror or e}); its "
          "row is kept without them (saved_to empty): to save them, make room, "
          "remove the row and run the command again", file=sys.stderr, flush=True)
    return None


def check_folder(folder: str, flag: str) -> None:
  """Before any work: `--flag` names a folder that exists or can be made (its
  nearest existing ancestor a writable folder), and is writable."""
  if not folder or os.path.isfile(folder):
    raise UsageError(f"--{flag} must name a folder; got {folder!r}")
  existing = os.path.abspath(folder)   # it, or the folder it would be made in
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(f"--{flag} {folder}: {existing} is not a writable folder")


def aggregator_key(name: str, silo_epsilon, silo_delta, clip) -> dict:
  """The aggregator settings a run's result depends on (part of its run key): the
  aggregator `name` and, for a DP one, its budget and clip."""
  from tff_silo import aggregators
  dp = name in aggregators.DP_BUILTINS
  return dict(aggregator=name,
              **(dict(silo_epsilon=silo_epsilon, silo_delta=silo_delta,
                      aggregator_clip=clip) if dp else {}),
              # (dp_fixed's noise became integer: rows of its float noise not reused)
              **({"aggregator_noise": "integer"} if name == "dp_fixed" else {}))


def aggregator_columns(choice, rounds_run: int, measurements: dict,
                       dimension: int) -> dict:
  """A row's aggregator: its name, parameters and last measurements (where TFF
  reports them), and for a DP aggregator its silo-level guarantee over the rounds
  run (of a `dimension`-value aggregate), in columns of its own: epsilon at
  silo_delta for exact Gaussian noise, the delta its sampler adds, and what
  the guarantee covers."""
  import json
  from tff_silo import aggregators
  columns = dict(aggregator=choice.name, aggregator_params=json.dumps(choice.params),
                 aggregator_measurements=json.dumps(measurements))
  if choice.silo_level_dp:   # (its budget: in its params, as the flags gave it)
    epsilon, delta = choice.params["silo_epsilon"], choice.params["silo_delta"]
    columns.update(silo_epsilon=epsilon,
                   silo_epsilon_spent=choice.silo_epsilon(rounds_run, delta),
                   silo_delta=delta,
                   silo_delta_with_sampler_tail=delta + choice.silo_delta_tail(
                       rounds_run, dimension),
                   silo_guarantee_covers=aggregators.SILO_GUARANTEE_COVERS,
                   silo_noise_multiplier=choice.noise_multiplier)
  return columns


def aggregator_choice(num_silos: int, rounds: int):
  """The `tff_silo.aggregators.AggregatorChoice` the flags name for a run of
  `rounds` rounds over `num_silos` silos; UsageError in one line."""
  from tff_silo import aggregators
  dp = FLAGS.aggregator in aggregators.DP_BUILTINS
  try:
    return aggregators.choose(
        FLAGS.aggregator, num_silos=num_silos, rounds=rounds,
        silo_epsilon=FLAGS.silo_epsilon if dp else None,
        silo_delta=FLAGS.silo_delta if dp else None, clip=FLAGS.aggregator_clip)
  except (ValueError, TypeError) as e:
    raise UsageError(f"--{e}") from None


def device_scope(device: str, backend: str, xla: bool = False, bundle=None):
  """(context manager placing TensorFlow's ops, label for the row) for --device and
  --xla (the label "cpu+xla", "gpu+xla"; "xla_cpu", "xla_gpu", "xla_tpu": rounds
  run by PJRT, what TensorFlow runs besides on the CPU), or for a `bundle`
  (`bundle_from_flags`: the rounds recorded, or replayed on the device the label
  names). TFF's runtime runs in its CPU-only worker whatever the scope says."""
  import tensorflow as tf
  if backend == "tff":
    return contextlib.nullcontext(), "cpu (tff worker)"
  from tff_silo.backends.vectorized import programs
  if bundle is not None:
    report = getattr(bundle, "report", None)
    return (_Scopes(lambda: tf.device("/CPU:0"), lambda: programs.bundled_rounds(bundle)),
            f"xla_{report['platform']}" if report else "export")
  platform = pjrt_platform(device)
  if platform is not None:
    return _Scopes(lambda: tf.device("/CPU:0"),
                   lambda: programs.pjrt_rounds(platform)), device
  place, label = ((tf.device("/CPU:0"), "cpu") if device == "cpu" or not _gpus()
                  else (tf.device("/GPU:0"), "gpu"))
  if not xla:
    return place, label
  return _Scopes(lambda: place, programs.xla_rounds), f"{label}+xla"


def placement(s, bundle=None):
  """What a batch of a binary's runs runs inside, in this process or on a Ray
  worker: the device placement (and XLA) of its settings' `device`, `backend`,
  `xla` and, where they have one, `aggregator`; or the `bundle`'s."""
  return device_scope(s.device, backend_for(s.backend, getattr(s, "aggregator", None)),
                      s.xla, bundle)[0]


class _Scopes:
  """A context manager entering the managers the `makers` make, each time anew (a
  binary enters its scope once per run; a generator's manager enters once)."""

  def __init__(self, *makers):
    self._makers, self._stacks = makers, []

  def __enter__(self):
    stack = contextlib.ExitStack()
    for make in self._makers:
      stack.enter_context(make())
    self._stacks.append(stack)

  def __exit__(self, *exc):
    return self._stacks.pop().__exit__(*exc)


@contextlib.contextmanager
def usage_errors():
  """A ValueError inside (a setting the data cannot take, a bad file: not a bug)
  ends the binary as a one-line UsageError."""
  try:
    yield
  except UsageError:
    raise
  except ValueError as e:
    raise UsageError(str(e)) from None


def peak_memory_mb() -> float:
  """Peak resident memory of this process or of any child it waited for (TFF's
  worker is one), in MB (Linux reports ru_maxrss in KB)."""
  import resource
  return max(resource.getrusage(who).ru_maxrss
             for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024.0


def round_progress(tag: str, rounds: int):
  """A `progress(rounds_done, total, seconds)` callback for the simulation drivers:
  prints `tag`, the round, the time so far and the time left at this pace to stderr
  after the first round (no estimate yet: it carries the tracing), about every tenth
  round and at the end."""
  step = max(1, rounds // 10)

  def progress(rounds_done, total, seconds):
    if rounds_done % step == 0 or rounds_done in (1, total):
      left = (f", ~{seconds / rounds_done * (total - rounds_done):.0f} s left"
              if 1 < rounds_done < total else "")
      print(f"{tag}: round {rounds_done}/{total} ({seconds:.1f} s{left})",
            file=sys.stderr, flush=True)

  return progress


def read_rows(path: str, signature=(), flag: str = "output"):
  """The rows of an existing CSV of this binary as a DataFrame; a UsageError in one
  line, naming the file (as `--flag`, or as an argument when `flag` is None), when it
  cannot be read as a CSV or lacks the `signature` columns every row of this binary
  has (another binary's file)."""
  import pandas as pd
  name = path if flag is None else f"--{flag} {path}"
  remedy = ("give a CSV this binary wrote" if flag is None
            else f"move it away or give another --{flag}")
  try:
    table = pd.read_csv(path, low_memory=False)
  except pd.errors.EmptyDataError:
    raise UsageError(f"{name} is an empty file, not a CSV of rows; {remedy}") from None
  except (OSError, UnicodeDecodeError, ValueError) as e:   # ParserError is a ValueError
    reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    raise UsageError(f"{name} cannot be read as a CSV ({reason}); {remedy}") from None
  if len(table) and not isinstance(table.index, pd.RangeIndex):   # extras: an index
    raise UsageError(f"{name} has rows with more fields than its header's "
                     f"{len(table.columns)}; {remedy}")
  with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:   # (committed
    f.seek(-1, os.SEEK_END)                            # rows: benchmarks/results/)
    if f.read(1) != b"\n":   # every row this project writes ends in a newline
      raise UsageError(f"{name} ends in the middle of a row (a write that was cut "
                       f"off?); {remedy}")
  missing = [c for c in signature if c not in table.columns]
  if missing:
    raise UsageError(f"{name} holds other rows than this binary's (no "
                     f"{', '.join(missing)} column); {remedy}")
  return table


def _check_file_path(path: str, flag: str) -> None:
  """UsageError unless `--flag` names a file path (not a folder) whose folder exists
  or can be made, and is writable."""
  if not path:
    raise UsageError(f"--{flag} must name a file")
  if os.path.isdir(path):
    raise UsageError(f"--{flag} {path} is a directory; give a file path")
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise UsageError(f"--{flag} {path}: its folder cannot be created "
                     f"({e.strerror or type(e).__name__})") from None
  if not os.access(folder, os.W_OK | os.X_OK):
    raise UsageError(f"--{flag} {path}: its folder {folder} is not writable")


def check_writable(path: str, flag: str) -> None:
  """Before any work: a file can be written to `--flag` (its folder exists or can be
  made and is writable, it is not a folder, an existing file is writable)."""
  _check_file_path(path, flag)
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise UsageError(f"--{flag} {path} is not writable")


def check_output(path: str, signature=(), flag: str = "output") -> None:
  """Before any work: `--flag` can take rows (its folder exists or can be made and is
  writable, it is not a folder, an existing file is writable and is a CSV of this
  binary's rows, `read_rows`). Raises UsageError."""
  _check_file_path(path, flag)
  if os.path.exists(path):
    if not os.path.isfile(path) or not os.access(path, os.R_OK | os.W_OK):
      raise UsageError(f"--{flag} {path} is not a readable and writable file")
    read_rows(path, signature, flag)


def define_output_flags(**paths) -> None:
  """`output_group(**paths)`'s flags, as the calling module's (a binary without a
  `Spec` of its own)."""
  spec.Spec(output_group(**paths)).define(module_name=spec.calling_module())


def output_dir() -> str:
  """--output_dir; UsageError unless it names a folder (or where one can be)."""
  folder = FLAGS.output_dir
  if not folder or os.path.isfile(folder):
    raise UsageError(f"--output_dir must name a folder; got {folder!r}")
  return folder


def resolve_output_flags() -> None:
  """Sets every path flag of `output_group` left unset to its file under
  --output_dir (`run_main` does this before the binary's main)."""
  for name, file_name in spec.OUTPUTS.items():
    if FLAGS[name].value is None:
      FLAGS[name].value = os.path.normpath(os.path.join(output_dir(), file_name))


FIGURE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")


def check_figure_path(path: str, flag: str = "plot") -> None:
  """Before any work: a figure can be written to `--flag` (a known extension, its
  folder exists or can be made and is writable, not a folder). Raises UsageError."""
  extension = os.path.splitext(path)[1].lower().lstrip(".")
  if extension not in FIGURE_FORMATS:
    raise UsageError(f"--{flag} {path} must end in one of "
                     f"{', '.join('.' + f for f in FIGURE_FORMATS)}")
  check_writable(path, flag)


def done_rows(path: str, resume: bool, signature=(), flag: str = "output") -> dict:
  """Rows already in `path`, keyed by their `run_key` (empty unless `resume`)."""
  if not (resume and os.path.isfile(path)):
    return {}
  old = read_rows(path, signature, flag)
  if "run_key" not in old.columns:
    return {}
  return {key: row for key, row in zip(old.run_key, old.to_dict("records"))}


# Columns measured while the run touched private data: times and memory follow the
# silos' sizes and Poisson batch sizes, and how many runs stacked follows memory
# estimates made from the sizes. No DP noise covers them.
MEASURED_COLUMNS = ("wall_seconds", "seconds_per_round_median", "train_seconds",
                    "load_seconds", "peak_memory_mb", "shard_peak_memory_mb",
                    "shard_peaks_mb", "device_memory_mb", "runs_stacked")


# What a DP row's noise is. `noise` = integer (the default,
# `tff_silo.privacy.integer_gaussian`): integer sums and rounded-Gaussian noise, the
# guarantee the numbers computed have, certified up to `integer_law.EPSILON_CEILING`,
# for every Gaussian release of the library (DP-SGD, DP standardization, validation
# scores, user-level means, dp_fixed); dp_adaptive (TFF's factory, TensorFlow's
# normals) and the selections' Gumbel noise still draw float noise. Otherwise
# (`gaussian`, `--noise=idealized`) the accountants treat it as the real-valued
# Gaussian; the float grid of its draws (Mironov 2012) adds to delta what they do
# not charge (issue 53).
NOISE_MECHANISM = ("idealized real-valued noise: the accountants' Gaussian (or "
                   "Laplace) over the reals; the float grid of the draws adds to delta "
                   "what is not accounted")
INTEGER_NOISE_MECHANISM = (
    "integer: the Gaussian releases (DP-SGD, DP standardization, validation scores, "
    "user-level means, dp_fixed) are integer sums plus rounded-Gaussian noise, private "
    "for the numbers computed (epsilon certified up to {ceiling:g}); dp_adaptive's "
    "(TFF's factory) and private selections' noise idealized real-valued")
OUTSIDE_INTEGER_CEILING = (
    "integer, epsilon above {ceiling:g}: outside what the sampler's table is certified "
    "for (its tail is charged at epsilon {ceiling:g}); the epsilon is the exact "
    "mechanism's")


def _spent_epsilons(row: dict) -> list:
  """The finite epsilons a row reports, in columns named so."""
  return [value for name, value in row.items()
          if (name.startswith("epsilon") or name.endswith("epsilon_spent"))
          and isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value)]


def _spends_privacy(row: dict) -> bool:
  """Whether a row reports privacy spent: a finite epsilon in a column named so."""
  return bool(_spent_epsilons(row))


def labelled(row: dict) -> dict:
  """`row` with `outside_guarantee_columns` naming its `MEASURED_COLUMNS` (space-
  separated), where it has any: they are outside every privacy guarantee a row
  states; and, where it reports an epsilon, `noise_mechanism`: its `noise`'s
  (`INTEGER_NOISE_MECHANISM`, or `OUTSIDE_INTEGER_CEILING` above the ceiling), else
  `NOISE_MECHANISM`."""
  from tff_silo.privacy.integer_law import EPSILON_CEILING   # no TensorFlow
  out = dict(row)
  measured = [name for name in MEASURED_COLUMNS if name in row]
  if measured:
    out["outside_guarantee_columns"] = " ".join(measured)
  if _spends_privacy(row):
    if row.get("noise") != "integer":
      out["noise_mechanism"] = NOISE_MECHANISM
    elif max(_spent_epsilons(row)) > EPSILON_CEILING:
      out["noise_mechanism"] = OUTSIDE_INTEGER_CEILING.format(ceiling=EPSILON_CEILING)
    else:
      out["noise_mechanism"] = INTEGER_NOISE_MECHANISM.format(ceiling=EPSILON_CEILING)
  return out


def append_row(path: str, row: dict) -> None:
  """`append_rows(path, [row])`."""
  append_rows(path, [row])


def append_rows(path: str, rows, unique_key: Optional[str] = None) -> int:
  """Appends rows at once, atomically: the new file (the old bytes and the rows, or,
  when they have other columns, the union of both) is written beside `path` and
  renamed over it, so a kill at any moment leaves either the old or the new file.
  Writers of one folder take turns (`_turn`), so two processes lose no row. With
  `unique_key` (a column: `run_key`), rows whose value there the file already has
  are left out: two identical commands at once write each run once. Each row is
  `labelled`. Returns how many rows were written; an `OSError` (no space left, a
  read-only folder) is a one-line UsageError naming the file, its rows kept."""
  import pandas as pd
  rows = [labelled(row) for row in rows]
  with _turn(path):
    header = list(pd.read_csv(path, nrows=0).columns) if os.path.exists(path) else None
    if unique_key and header and unique_key in header:
      have = set(pd.read_csv(path, usecols=[unique_key], dtype=str)[unique_key])
      rows = [row for row in rows if str(row[unique_key]) not in have]
    if not rows:
      return 0
    new = pd.DataFrame(rows)
    old_bytes, table = b"", new
    if header is not None:
      with open(path, "rb") as f:
        old_bytes = f.read()
      if header == list(new.columns):
        if old_bytes and not old_bytes.endswith(b"\n"):
          old_bytes += b"\n"
        table = None
      else:
        with warnings.catch_warnings():   # all-NA columns of either side are fine here
          warnings.simplefilter("ignore", FutureWarning)
          table = pd.concat([pd.read_csv(path, low_memory=False), new], ignore_index=True)
    write_atomically(path, old_bytes + new.to_csv(header=False, index=False).encode()
                     if table is None else table.to_csv(index=False).encode())
  return len(rows)


@contextlib.contextmanager
def _turn(path: str):
  """An exclusive `flock` on the folder of `path`, held from a read of the file to
  its replacement (two processes appending 200 rows each to one file kept 216 of
  400 without it: ../shared/RELIABILITY_CASES.md, 2c); the folder, not a lock file
  beside `path`, so that nothing is left behind. An OSError is a one-line
  UsageError."""
  import fcntl
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
  except OSError as e:
    raise UsageError(f"cannot write {path}: {e.strerror}") from None
  try:
    fcntl.flock(handle, fcntl.LOCK_EX)
    yield
  finally:
    os.close(handle)


def drop_rows(path: str, run_keys) -> None:
  """Removes the rows with these run keys from the CSV `path`, atomically; the file
  goes when no row is left."""
  import pandas as pd
  if not os.path.exists(path):
    return
  with _turn(path):
    table = pd.read_csv(path, low_memory=False)
    kept = table[~table.run_key.isin(set(run_keys))]
    if kept.empty:
      os.remove(path)
    elif len(kept) < len(table):
      write_atomically(path, kept.to_csv(index=False).encode())


def write_atomically(path: str, content: bytes) -> None:
  """Writes `content` beside `path` (its folder made if missing) and renames it over
  `path` (keeping its mode), so that a kill at any moment leaves either the old or
  the new file; a SIGTERM waits for the rename (`runtime.termination_deferred`). An
  OSError (no space left, a read-only folder) is a one-line UsageError naming
  `path`, no temporary left."""
  from tff_silo import runtime
  folder = os.path.dirname(os.path.abspath(path))
  with runtime.termination_deferred():
    try:
      os.makedirs(folder, exist_ok=True)
      handle, temporary = tempfile.mkstemp(
          dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:
      raise UsageError(f"cannot write {path}: {e.strerror}") from None
    umask = os.umask(0)
    os.umask(umask)
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o666 & ~umask
    try:
      os.chmod(temporary, mode)
      with os.fdopen(handle, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
      os.replace(temporary, path)
    except BaseException as e:
      with contextlib.suppress(OSError):
        os.remove(temporary)
      if isinstance(e, OSError):
        raise UsageError(f"cannot write {path}: {e.strerror}; it is as it was before "
                         "this write") from None
      raise


_RENAMED = {}   # old flag name -> new


def define_renamed_flags(**renamed) -> None:
  """Flags renamed to the one name each concept has in every binary (`old="new"`):
  an old name, left out of --help, ends in a one-line error naming the new one."""
  for old, new in renamed.items():
    flags.DEFINE_string(old, None, f"Renamed: give --{new}.",
                        module_name="benchmarks (internal: renamed flags)")
    _RENAMED[old] = new


def check_renamed_flags() -> None:
  """UsageError naming the new flag for an old name that was given."""
  for old, new in _RENAMED.items():
    if FLAGS[old].present:
      raise UsageError(f"--{old} is now --{new}")


# absl's help flags: they print the flags and exit (0 here, where absl exits 1).
HELP_FLAGS = {f"{dashes}{name}" for dashes in ("-", "--")
              for name in ("help", "helpfull", "helpshort", "h", "?")}


def takes_arguments(main):
  """Marks a binary's `main` as taking positional arguments (`run_main` refuses
  them for every other binary)."""
  main.takes_arguments = True
  return main


def run_main(main, check_first=None) -> None:
  """`app.run(main)` with old flag names, non-finite floats, empty lists and
  arguments besides the flags (unless `main` `takes_arguments`) refused and the
  path flags resolved (`resolve_output_flags`), printing a UsageError as
  `error: ...` and exiting with 2, and --help exiting with 0. A binary that must import
  TensorFlow before `app.run` calls its main (TF 2.14's Keras, first imported inside
  it, cannot build functional models) passes `check_first`, its flag checks: they
  run on the parsed flags before TensorFlow is imported, so a mistake costs no
  TensorFlow start-up."""
  def prepare():   # what every binary checks first
    check_renamed_flags()
    check_finite_floats()
    check_given_lists()
    if "output_dir" in FLAGS:
      resolve_output_flags()

  def resolved_main(argv):
    prepare()
    if len(argv) > 1 and not getattr(main, "takes_arguments", False):
      raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return main(argv)

  try:
    if check_first is not None and _parses(sys.argv):
      prepare()
      check_first()
      import tensorflow  # noqa: F401  (before app.run: see above)
    app.run(resolved_main)
  except SystemExit as e:   # absl ends a --help with 1: it is no failure
    if e.code == 1 and set(sys.argv[1:]) & HELP_FLAGS:
      sys.exit(0)
    raise
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print("interrupted: every finished run's row is in the output; rerun the same "
          "command to resume", file=sys.stderr)
    sys.exit(130)


def _parses(argv) -> bool:
  """Whether absl parses `argv` (--help and bad flags are left to app.run)."""
  try:
    FLAGS(argv)
  except flags.Error:
    return False
  return True
