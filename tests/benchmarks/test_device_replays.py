"""The device check's script (`benchmarks/speed/device_replays.py`, issue 55 item 4):
jobs replayed in order in a process without TensorFlow, packed into parts, and
unpacked here into bundles the exporting command imports."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import binaries
from tests.backends.test_bundles import _drive
from tff_silo import bundles

SCRIPT = os.path.join(binaries.ROOT, "benchmarks", "speed", "device_replays.py")
# As on a node without TensorFlow: the script run as a file, tensorflow unimportable.
RUN = [sys.executable, "-c", "import runpy, sys; sys.modules['tensorflow'] = None; "
       f"runpy.run_path({SCRIPT!r}, "
       "run_name='__main__')"]


def _script(*args):
  return subprocess.run(RUN + list(args), cwd=binaries.ROOT, capture_output=True,
                        text=True, timeout=300)


def _bundle(folder, data, rounds):
  recording = bundles.Recording()
  _drive(recording, data, rounds=rounds)
  recording.write(str(folder), about={})


@pytest.mark.cli
def test_the_jobs_replay_in_order_and_come_back_as_bundles_to_import(tmp_path):
  data = tf.constant([[0.1, 0.2], [0.3, -0.4]])
  _bundle(tmp_path / "bundles" / "b", data, rounds=3)
  parts, out = tmp_path / "parts", tmp_path / "back"
  proc = _script(f"--bundles={tmp_path / 'bundles'}", f"--out={parts}",
                 f"--scratch={tmp_path / 'scratch'}", "--jobs=b:cpu,b:cpu:1,b:tpu",
                 "--part_mib=0.002")   # 2 KiB: cut into several parts
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()[:3]
  starts = ("b.cpu: ok in", "b.cpu.1: ok in", "b.tpu: failed: exit 1 in")
  for line, start in zip(lines, starts):
    assert line.startswith(start), lines
  names = sorted(os.listdir(parts))
  assert len(names) > 1 and names[0] == "replays.tar.000"
  proc = _script(f"--unpack={parts}", f"--bundles={tmp_path / 'bundles'}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines() == ["b.cpu: ok", "b.cpu.1: ok", "b.tpu: failed: exit 1"]
  summary = json.loads((out / "summary.json").read_text())
  assert [j["calls_per_program"] for j in summary["jobs"]] == [None, 1, None]
  # The whole replay imports: what TensorFlow computes.
  state, _ = _drive(bundles.Replay(str(out / "b.cpu")), data)
  want, _ = _drive(None, data)
  np.testing.assert_allclose(state[0].numpy(), want[0].numpy(), rtol=1e-6)
  # The timing replay made one call of the program; the failed job says why.
  timing = json.loads((out / "b.cpu.1" / "timing.json").read_text())
  assert [s is None for s in timing["call_seconds"]] == [False, True, True]
  assert not (out / "b.cpu.1" / "manifest.json").exists()
  assert "no PJRT tpu device here" in (out / "b.tpu" / "log.txt").read_text()


@pytest.mark.cli
def test_after_a_failed_first_job_none_other_starts_and_bad_jobs_are_one_line(tmp_path):
  _bundle(tmp_path / "b", tf.ones([2, 2]), rounds=1)
  proc = _script(f"--bundles={tmp_path}", f"--out={tmp_path / 'parts'}",
                 f"--scratch={tmp_path / 'scratch'}", "--jobs=b:tpu,b:cpu")
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
  assert [j["status"] for j in summary["jobs"]] == ["failed: exit 1",
                                                    "skipped: the first job failed"]
  assert _script(f"--bundles={tmp_path}", f"--out={tmp_path / 'good'}", "--jobs=b:cpu",
                 f"--scratch={tmp_path / 'scratch'}").returncode == 0
  (tmp_path / "junk").mkdir()
  (tmp_path / "junk" / "replays.tar.000").write_bytes(b"not a tar")
  for args, message in (
      (["--jobs=b:gpu:0"], "error: --jobs: 'b:gpu:0' is not NAME:cpu|gpu|tpu[:N]"),
      (["--jobs=c:cpu"], f"error: --jobs: no bundle c in {tmp_path}"),
      (["--jobs=b:cpu,b:gpu,b:cpu"], "error: --jobs: b:cpu given twice"),
      (["--jobs=b:cpu", "--part_mib=0"], "error: --part_mib: must be positive"),
      (["--unpack=" + str(tmp_path / "nothing")], "error: --unpack: no replays.tar.NNN"),
      (["--unpack=" + str(tmp_path / "junk")], "error: --unpack: " + str(tmp_path / "junk")
       + ": not the parts of one replays.tar"),
      (["--unpack=" + str(tmp_path / "good"), "--bundles=" + str(tmp_path / "junk")],
       f"error: --bundles: no bundle b in {tmp_path / 'junk'}")):
    proc = _script(f"--bundles={tmp_path}", f"--out={tmp_path / 'o'}", *args)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(message), proc.stderr
