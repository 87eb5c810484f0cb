"""The medians `benchmarks.speed` prints after its rows: every ratio of two things
measured side by side."""

from __future__ import annotations

import statistics

from benchmarks.speed.cluster import EXECUTOR_GRIDS, EXECUTORS
from benchmarks.speed.fresh import PROTOCOLS, SCHOOL_EPSILON, XLA_MODES, XLA_WORKLOADS
from benchmarks.speed.in_process import CALIBRATION_PROTOCOLS


def _median_rows(rows, part, backend, device):
  chosen = [r for r in rows if r["part"] == part and r["backend"] == backend
            and r["device"] == device]
  if not chosen:
    return None
  keys = [k for k, v in chosen[0].items() if isinstance(v, float)]
  return {k: statistics.median(r[k] for r in chosen) for k in keys}


def report(rows):
  """Prints the medians of `rows` and their ratios."""
  print("\nmedians (ratio = tff / vectorized, side by side):")
  for part in EXECUTOR_GRIDS:
    runs = {e: [r for r in rows if r["part"] == part and r.get("executor") == e]
            for e in EXECUTORS}
    if all(runs.values()):
      (local, local_mb, local_w), (ray, ray_mb, ray_w) = [
          [statistics.median(r[k] for r in runs[e]) for k in (
              "end_to_end_seconds", "peak_memory_mb", "worker_peak_memory_mb")]
          for e in EXECUTORS]
      print(f"  {part} end to end: local {local:.1f} s, ray {ray:.1f} s, local / ray "
            f"{local / ray:.2f}x; peak memory in all {local_mb:.0f} / {ray_mb:.0f} MB "
            f"(largest worker {ray_w:.0f} MB)")
  for part, seconds in (("school", "end_to_end_seconds"),
                        ("school", "seconds_per_round_median"),
                        ("digits", "seconds_per_round_median"),
                        ("ifca", "end_to_end_seconds"),
                        ("ifca", "seconds_per_round_median"),
                        ("dprivate", "end_to_end_seconds"),
                        ("dprivate", "seconds_per_round_median"),
                        ("hypernet", "end_to_end_seconds"),
                        ("hypernet", "seconds_per_round_median")):
    tff = _median_rows(rows, part, "tff", "cpu")
    vec = _median_rows(rows, part, "vectorized", "cpu")
    if tff and vec:
      print(f"  {part} {seconds}: tff {tff[seconds]:.4f}, vectorized "
            f"{vec[seconds]:.4f}, ratio {tff[seconds] / vec[seconds]:.1f}x; peak memory "
            f"tff {tff['peak_memory_mb']:.0f} MB, vectorized "
            f"{vec['peak_memory_mb']:.0f} MB")
  gpu = _median_rows(rows, "digits", "vectorized", "gpu")
  cpu = _median_rows(rows, "digits", "vectorized", "cpu")
  if gpu and cpu:
    print(f"  digits vectorized round: cpu {cpu['seconds_per_round_median']:.4f} s, gpu "
          f"{gpu['seconds_per_round_median']:.4f} s")
  protocol = {p: [r for r in rows if r["part"] == "protocol" and r["protocol"] == p]
              for p in PROTOCOLS}
  if all(protocol.values()):
    (paper, paper_mb), (honest, honest_mb) = [
        [statistics.median(r[k] for r in protocol[p])
         for k in ("end_to_end_seconds", "peak_memory_mb")] for p in PROTOCOLS]
    print(f"  School DP run end to end (vectorized): paper protocol {paper:.2f} s, honest "
          f"default {honest:.2f} s, paper / honest {paper / honest:.2f}x; peak memory "
          f"{paper_mb:.0f} / {honest_mb:.0f} MB")
  calibration = {p: [r for r in rows if r["part"] == "calibration"
                     and r["protocol"] == p] for p in CALIBRATION_PROTOCOLS}
  if all(calibration.values()):
    seconds = {p: statistics.median(r["end_to_end_seconds"] for r in calibration[p])
               for p in CALIBRATION_PROTOCOLS}
    print(f"  calibration (cold, School epsilon {SCHOOL_EPSILON:g}): " + ", ".join(
        f"{p} {calibration[p][0]['settings']} setting(s) {seconds[p]:.2f} s"
        for p in CALIBRATION_PROTOCOLS)
          + f"; paper / honest {seconds['paper'] / seconds['honest']:.1f}x")
  for workload in XLA_WORKLOADS:
    xla = {device: [r for r in rows if r["part"] == "xla" and r["workload"] == workload
                    and r["device"] == device] for device, _, _ in XLA_MODES}
    medians = {d: [statistics.median(r[k] for r in xla[d]) for k in (
        "seconds_per_round_median", "end_to_end_seconds", "peak_memory_mb")]
               for d in xla if xla[d]}
    if "cpu" not in medians:
      continue
    plain, plain_end, plain_mb = medians["cpu"]
    for device, name in (("cpu+xla", "XLA"), ("xla_cpu", "PJRT's CPU client")):
      if device in medians:
        compiled, compiled_end, compiled_mb = medians[device]
        print(f"  {workload} rounds, {name} / not: {compiled:.4f} / {plain:.4f} s per "
              f"round ({compiled / plain:.2f}x), end to end {compiled_end:.1f} / "
              f"{plain_end:.1f} s ({compiled_end / plain_end:.2f}x); peak memory "
              f"{compiled_mb:.0f} / {plain_mb:.0f} MB")
  for r in rows:
    if r["part"] == "xla_memory":
      print(f"  {r['workload']} on a device: {r['device_memory_mb']:.1f} MB for its "
            f"largest round program (XLA's buffer assignment, for the CPU), beside "
            f"{r['peak_memory_mb']:.0f} MB of the whole process on the host")
  sweep = [r for r in rows if r["part"] == "sweep"]
  single = _median_rows(rows, "school", "vectorized", "cpu")
  for r in sweep:
    line = (f"  sweep of {r['runs']} runs in one process: {r['end_to_end_seconds']:.1f} s "
            f"({r['runs'] / r['end_to_end_seconds']:.2f} trials/s), peak "
            f"{r['peak_memory_mb']:.0f} MB")
    if single:
      line += (f"; {r['end_to_end_seconds'] / single['end_to_end_seconds']:.2f}x one fresh "
               f"vectorized run ({single['end_to_end_seconds']:.1f} s)")
    print(line)
  for sampling in ("poisson", "without_replacement"):
    steps = [r for r in rows if r["part"] == "sampling" and r["sampling"] == sampling]
    if steps:
      first, last = steps[0], steps[-1]
      print(f"  {sampling} DP step of one silo by its size n (batch 64): " + ", ".join(
          f"n={r['silo_size']:,} {r['step_seconds'] * 1e3:.2f} ms" for r in steps)
            + f"; largest / smallest {last['step_seconds'] / first['step_seconds']:.2f}x"
            + f", sizes {last['silo_size'] / first['silo_size']:.0f}x")


