"""The device check of issue 55 (item 4): bundles written by the binaries'
`--export_xla` replayed on an accelerator and on the same machine's CPU in one
invocation, on a node with numpy and jaxlib but no TensorFlow (run as a file:
nothing of this project is imported there):

    python3 benchmarks/speed/device_replays.py --bundles=DIR --out=OUT \
        --jobs=school:gpu,fmnist:gpu,school:cpu,fmnist:cpu:1 --deadline_seconds=480

Each job `NAME:PLATFORM[:N]` replays bundle DIR/NAME in its own process
(`tff_silo/xla_bundle.py`) in a scratch folder, so one bundle's replays on two
platforms do not overwrite each other; N: each program's first N calls only
(`--calls_per_program`, timing alone). Jobs run in the order given. One that would
start past the deadline is skipped and one running at it is stopped, so what ran
comes back; if the first job fails no other starts (give a short one first: a
device whose client does not work then costs little of a lease). OUT gets
`replays.tar.NNN`, parts of at most --part_mib of one tar: each job's replay.json
(or timing.json), results.npz and log, and summary.json (the machine, each job's
status). Back beside the bundles:

    python benchmarks/speed/device_replays.py --unpack=PARTS --bundles=DIR --out=OUT2

makes OUT2/<job> of each whole replay a replayed bundle (its files linked), for the
exporting command's `--import_xla=OUT2/<job>`: the rows then carry that device's
round seconds and memory.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                      "tff_silo", "xla_bundle.py")


def _runner_module():
  """`tff_silo/xla_bundle.py` loaded from its file (numpy only, as on the node), for
  its file names."""
  import importlib.util   # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("xla_bundle", RUNNER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_BUNDLE = _runner_module()
WRITTEN = (_BUNDLE.REPLAY, _BUNDLE.TIMING, _BUNDLE.RESULTS)   # what a replay adds
PART, SUMMARY, LOG = "replays.tar.", "summary.json", "log.txt"
PLATFORMS = ("cpu", "gpu", "tpu")


def parse_job(text: str) -> tuple:
  """`NAME:PLATFORM[:N]` -> (name, platform, N or None)."""
  parts = text.split(":")
  if (len(parts) not in (2, 3) or not parts[0] or parts[1] not in PLATFORMS
      or (len(parts) == 3 and not (parts[2].isdigit() and int(parts[2]) > 0))):
    raise SystemExit(f"error: --jobs: {text!r} is not NAME:{'|'.join(PLATFORMS)}[:N] "
                     "(N a positive count of calls per program)")
  return parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None


def link_bundle(bundle: str, folder: str) -> None:
  """A fresh `folder` holding links to `bundle`'s files but what a replay adds."""
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  for name in os.listdir(bundle):
    if name not in WRITTEN:
      os.symlink(os.path.abspath(os.path.join(bundle, name)), os.path.join(folder, name))


def machine() -> dict:
  """What the replays ran on: the host, its jaxlib, and the accelerator's name."""
  about = dict(host=platform.node(), cpus=os.cpu_count(), python=sys.version.split()[0])
  try:
    import jaxlib   # pylint: disable=import-outside-toplevel
    about["jaxlib"] = jaxlib.__version__
  except ImportError:
    about["jaxlib"] = None
  smi = shutil.which("nvidia-smi")
  if smi:
    about["nvidia_smi"] = subprocess.run(
        [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=60, check=False).stdout.strip()
  return about


def run_jobs(bundles: str, jobs: list, scratch: str, deadline_seconds: float) -> list:
  """Each job's replay in scratch/<job>; its entry (job, bundle, platform,
  calls_per_program, status, seconds)."""
  start, entries = time.monotonic(), []
  for name, device, calls in jobs:
    job = f"{name}.{device}" + (f".{calls}" if calls else "")
    entry = dict(job=job, bundle=name, platform=device, calls_per_program=calls)
    entries.append(entry)
    folder = os.path.join(scratch, job)
    shutil.rmtree(folder, ignore_errors=True)
    left = deadline_seconds - (time.monotonic() - start)
    if left < 10:
      entry["status"] = "skipped: past the deadline"
      continue
    if len(entries) > 1 and entries[0]["status"] != "ok":
      entry["status"] = "skipped: the first job failed"
      continue
    command = [sys.executable, RUNNER, folder, f"--platform={device}"] + (
        [f"--calls_per_program={calls}"] if calls else [])
    t0 = time.monotonic()
    try:
      link_bundle(os.path.join(bundles, name), folder)
      with open(os.path.join(folder, LOG), "w") as log:
        rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                            timeout=left, check=False).returncode
      entry["status"] = "ok" if rc == 0 else f"failed: exit {rc}"
    except subprocess.TimeoutExpired:
      entry["status"] = "stopped at the deadline"
    except OSError as error:   # the next job still runs; what ran still comes back
      entry["status"] = f"failed: {error}"
    entry["seconds"] = round(time.monotonic() - t0, 2)
    print(f"{job}: {entry['status']} in {entry['seconds']} s", flush=True)
  return entries


def pack(summary: dict, scratch: str, out: str, part_mib: float) -> list:
  """The tar of the jobs' files and summary.json, cut into OUT/replays.tar.NNN
  (earlier parts there removed first); the parts' paths."""
  tar_path = os.path.join(scratch, "replays.tar")
  with tarfile.open(tar_path, "w") as tar:
    for entry in summary["jobs"]:
      for name in WRITTEN + (LOG,):
        path = os.path.join(scratch, entry["job"], name)
        if os.path.isfile(path):
          tar.add(path, arcname=f"{entry['job']}/{name}")
    data = json.dumps(summary, indent=1).encode()
    info = tarfile.TarInfo(SUMMARY)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
  os.makedirs(out, exist_ok=True)
  for old in glob.glob(os.path.join(out, PART + "*")):
    os.remove(old)
  paths = []
  with open(tar_path, "rb") as f:
    for i, chunk in enumerate(iter(lambda: f.read(int(part_mib * 2**20)), b"")):
      paths.append(os.path.join(out, f"{PART}{i:03d}"))
      with open(paths[-1], "wb") as g:
        g.write(chunk)
  return paths


def unpack(parts: str, bundles: str, out: str) -> dict:
  """The parts in `parts` extracted into `out`, each whole replay's folder given
  links to its bundle's files; the summary."""
  names = sorted(glob.glob(os.path.join(parts, PART + "[0-9][0-9][0-9]")))
  if not names:
    raise SystemExit(f"error: --unpack: no {PART}NNN in {parts}")
  data = bytearray()
  for name in names:
    with open(name, "rb") as f:
      data += f.read()
  os.makedirs(out, exist_ok=True)
  with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
    summary = json.load(tar.extractfile(SUMMARY))
    for entry in summary["jobs"]:
      folder = os.path.join(out, entry["job"])
      if entry["status"] != "ok" or entry["calls_per_program"]:
        continue   # no results to import
      if not os.path.isfile(os.path.join(bundles, entry["bundle"], _BUNDLE.MANIFEST)):
        raise SystemExit(f"error: --bundles: no bundle {entry['bundle']} in {bundles} "
                         f"(the bundles the replays in {parts} ran)")
      link_bundle(os.path.join(bundles, entry["bundle"]), folder)
    tar.extractall(out, filter="data")
  return summary


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--bundles", required=True, help="the folder of the bundles")
  parser.add_argument("--jobs", help="NAME:PLATFORM[:N], comma-separated")
  parser.add_argument("--out", required=True,
                      help="where replays.tar.NNN go (with --unpack: the folders)")
  parser.add_argument("--deadline_seconds", type=float, default=480.0)
  parser.add_argument("--part_mib", type=float, default=15.0)
  parser.add_argument("--scratch", default="/tmp/device_replays")
  parser.add_argument("--unpack", metavar="PARTS",
                      help="extract the replays.tar.NNN in PARTS instead of replaying")
  args = parser.parse_args(argv)
  if args.unpack:
    try:
      summary = unpack(args.unpack, args.bundles, args.out)
    except (OSError, tarfile.TarError, KeyError, ValueError) as error:
      first = str(error).splitlines()[0] if str(error) else ""
      raise SystemExit(f"error: --unpack: {args.unpack}: not the parts of one "
                       f"replays.tar, or {args.out} not writable ({type(error).__name__}"
                       f"{': ' + first if first else ''})") from None
    for entry in summary["jobs"]:
      print(f"{entry['job']}: {entry['status']}")
    return 0
  if args.part_mib <= 0:
    raise SystemExit(f"error: --part_mib: must be positive; got {args.part_mib}")
  if not args.jobs:
    raise SystemExit("error: --jobs: give NAME:PLATFORM[:N], comma-separated")
  jobs = [parse_job(j) for j in args.jobs.split(",") if j]
  twice = sorted({":".join(map(str, filter(None, j))) for j in jobs if jobs.count(j) > 1})
  if twice:
    raise SystemExit(f"error: --jobs: {', '.join(twice)} given twice (each job has one "
                     "folder)")
  missing = sorted({name for name, _, _ in jobs if not os.path.isfile(
      os.path.join(args.bundles, name, _BUNDLE.MANIFEST))})
  if missing:
    raise SystemExit(f"error: --jobs: no bundle {', '.join(missing)} in {args.bundles}")
  try:
    os.makedirs(args.scratch, exist_ok=True)
  except OSError as error:
    raise SystemExit(f"error: --scratch: {error}") from None
  summary = dict(machine=machine(),
                 jobs=run_jobs(args.bundles, jobs, args.scratch, args.deadline_seconds))
  try:
    paths = pack(summary, args.scratch, args.out, args.part_mib)
  except OSError as error:
    raise SystemExit(f"error: --out: cannot write the parts there ({error})") from None
  print(json.dumps(summary, indent=1))
  print(f"written: {', '.join(paths)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
