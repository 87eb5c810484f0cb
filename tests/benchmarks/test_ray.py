"""The Ray executor (`benchmarks.executors`, `--executor=ray`) on a local two-CPU
cluster, one per test module (a test that uses it starts processes: marked
`cli`): the rows equal the local executor's, a failing batch
is retried and then reported while the others' results are kept, and bad input
ends in one line."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest

from benchmarks import datasets, executors
from benchmarks.common import UsageError
from tests import binaries

# What differs between two runs of the same rows: times (columns *_seconds and
# seconds_*), memory, the clock.
UNCOMPARED = {"seconds_per_round_median", "peak_memory_mb", "finished"}


@pytest.fixture(scope="module")
def cluster():
  import ray
  warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")
  ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
           log_to_driver=False, logging_level="warning")
  yield ray.get_runtime_context().gcs_address
  ray.shutdown()


def _same_rows(local_csv, ray_csv):
  local, on_ray = pd.read_csv(local_csv), pd.read_csv(ray_csv)
  assert sorted(local.columns) == sorted(on_ray.columns)
  order = [c for c in ("row_type", "run_key") if c in local]
  local = local.sort_values(order).reset_index(drop=True)
  on_ray = on_ray.sort_values(order).reset_index(drop=True)
  compared = [c for c in local.columns
              if c not in UNCOMPARED and not c.endswith("_seconds")]
  pd.testing.assert_frame_equal(local[compared], on_ray[compared])
  return local


def _both(binary, tmp_path, cluster, *args, output="--output", name="rows.csv",
          plan_secret=None):
  """Rows of the same command run with the local and the Ray executor (with
  `plan_secret`, both private-tuning runs given that secret's plans)."""
  paths = {}
  for executor in ("local", "ray"):
    folder = tmp_path / executor
    folder.mkdir()
    if plan_secret is not None:   # compare's secret beside its partial trial store
      (folder / plan_secret[0]).write_text(f"{plan_secret[1]}\n")
    extra = [] if executor == "local" else ["--executor=ray", f"--ray_address={cluster}"]
    path = folder if output == "--output_dir" else folder / name
    done = binaries.run(binary, *args, *extra, f"{output}={path}")
    assert done.returncode == 0, done.stderr[-3000:]
    paths[executor] = folder / name
  return _same_rows(paths["local"], paths["ray"])


@pytest.mark.cli
def test_run_rows_are_the_local_executors(tmp_path, cluster):
  """Stacked seeds of MR-MTL under DP-SGD, one task on a worker (IFCA's private
  selections on workers: the sharded test below)."""
  rows = _both("run", tmp_path, cluster, "--dataset=synthetic", "--methods=mrmtl",
               "--seeds=0,1", "--rounds=3", "--epsilon=3")
  assert len(rows) == 2 and np.isfinite(rows.test_metric).all()
  assert set(rows.runs_stacked) == {2}


@pytest.mark.cli
def test_a_sharded_run_on_the_cluster_is_the_unsharded_run(tmp_path, cluster):
  """--shards=2: IFCA-preconditioned MR-MTL (private selections, then MR-MTL's
  proximal step) with each half of the silos on an actor; the rows' metrics and
  epsilons are the unsharded run's."""
  args = ["--dataset=synthetic", "--methods=ifca_mrmtl", "--seeds=0", "--rounds=3",
          "--epsilon=3", "--selection_fraction=0.5"]
  rows = {}
  for name, extra in (("alone", []), ("sharded", ["--executor=ray",
                                                  f"--ray_address={cluster}",
                                                  "--shards=2", "--ray_cpus_per_task=1"])):
    done = binaries.run("run", *args, *extra, f"--output={tmp_path / name}.csv")
    assert done.returncode == 0, done.stderr[-3000:]
    rows[name] = pd.read_csv(tmp_path / f"{name}.csv").sort_values("algorithm")
  alone, sharded = (rows[n].reset_index(drop=True) for n in ("alone", "sharded"))
  assert list(sharded.shards) == [2] and list(sharded.run_key) == list(alone.run_key)
  assert sharded.num_selections[0] >= 1
  np.testing.assert_allclose(sharded.test_metric, alone.test_metric, rtol=1e-5)
  np.testing.assert_array_equal(sharded.epsilon_spent_max, alone.epsilon_spent_max)


@pytest.mark.cli
def test_compare_rows_are_the_local_executors(tmp_path, cluster):
  """A grid's trial and selected rows, private tuning's noisy scores included."""
  rows = _both("compare", tmp_path, cluster, "--preset=quick", "--methods=mrmtl,fedavg",
               "--epsilons=1,inf", "--seeds=0", "--rounds=3", "--lams=0.1,1",
               "--lrs=0.1", "--tuning=private", "--mean_trials=2",
               output="--output_dir", name="compare_quick.csv",
               plan_secret=("compare_quick.trials.partial.csv.plan_secret", 2 ** 100 + 7))
  assert set(rows.method) == {"mrmtl", "fedavg"}


@pytest.mark.cli
def test_hypernet_rows_are_the_local_executors(tmp_path, cluster):
  _both("hypernet", tmp_path, cluster, "--rounds=2", "--num_users=6",
        "--sampling_rates=0.5", "--clips=0.1", "--noise_multipliers=2", "--channels=4,8",
        "--dense=8", "--hidden_width=8", "--local_steps=2")


@pytest.mark.cli
def test_pandemic_rows_are_the_local_executors(tmp_path, cluster):
  generated = tmp_path / "generated"
  rows = _both("pandemic", tmp_path, cluster, "--profile=tiny", "--final_week_rate=0.01",
               "--methods=mrmtl", "--noise_multipliers=8", "--rounds=2",
               f"--generated_dir={generated}", output="--output_dir",
               name="pandemic.csv")
  assert rows.average_precision.between(0, 1).all()


@pytest.mark.cli
def test_a_sharded_pandemic_run_on_the_cluster_is_the_unsharded_run(tmp_path, cluster):
  """--shards=3: each actor loads and trains one client; the rows' AP and epsilon
  are the unsharded run's. A shard whose machine holds other data is refused; more
  shards than clients end in one line."""
  generated = tmp_path / "generated"
  args = ["--profile=tiny", "--final_week_rate=0.01", "--methods=mrmtl",
          "--noise_multipliers=8", "--rounds=2", f"--generated_dir={generated}"]
  on_ray = ["--executor=ray", f"--ray_address={cluster}"]
  rows = {}
  for name, extra in (("alone", []),
                      ("sharded", [*on_ray, "--shards=3", "--ray_cpus_per_task=0.5"])):
    done = binaries.run("pandemic", *args, *extra, f"--output_dir={tmp_path / name}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows[name] = pd.read_csv(tmp_path / name / "pandemic.csv")
  alone, sharded = rows["alone"], rows["sharded"]
  assert len(alone) == len(sharded) == 1 and sharded.shards[0] == 3
  assert sharded.average_precision[0] == pytest.approx(alone.average_precision[0],
                                                       rel=1e-4)
  for column in ("run_key", "epsilon_theorem", "epsilon_code", "scored", "silos"):
    assert sharded[column][0] == alone[column][0], column
  assert sharded.shard_peak_memory_mb[0] > 0
  script = ("from absl import flags\n"
            "from benchmarks import pandemic\n"
            f"flags.FLAGS(['pandemic', *{args!r}, '--output={tmp_path / 'c.csv'}'])\n"
            "s = pandemic.Settings.from_flags()\n"
            "folder, meta = pandemic._data_dir(s, generate=False)\n"
            "mine = pandemic._data_key(folder, meta)\n"
            "print(pandemic._shard(s, (mine, lambda: 'loaded'), None))\n"
            "try:\n"
            "  pandemic._shard(s, (dict(mine, files='another'), None), None)\n"
            "except ValueError as e:\n"
            "  print(type(e).__name__, e)\n")
  checked = subprocess.run([sys.executable, "-c", script], cwd=binaries.ROOT,
                           capture_output=True, text=True, timeout=300)
  assert checked.stdout.splitlines() == [
      "loaded", f"DataMismatch the data in {generated / 'tiny-seed0-rate0.01'} is not "
      "the driver's: give every machine the same files"], checked.stderr[-2000:]
  done = binaries.run("pandemic", *args, "--shards=4", f"--output_dir={tmp_path / 'bad'}")
  assert done.returncode == 2 and done.stderr.strip() == (
      "error: --shards=4 is more than the 3 clients of scenario01"), done.stderr[-2000:]


def _other_data():
  raise datasets.DataMismatch("the data in /x is not the driver's")


@pytest.mark.cli
def test_a_shard_that_cannot_load_its_data_ends_the_run_in_one_line(cluster):
  """The actor keeps its constructor's error, so the driver sees its type (a
  ValueError: a one-line usage error) and message, not a dead actor's traceback."""
  from tff_silo import sharding
  on_ray = executors.RayCluster(address=cluster, cpus=0.5)
  shards = on_ray.shards([_other_data])
  with pytest.raises(ValueError) as raised:
    sharding.gather(shards, "describe")
  assert str(raised.value) == "DataMismatch: the data in /x is not the driver's"


def test_shards_that_cannot_all_fit_on_the_cluster_are_refused():
  on_two_cpus = executors.RayCluster.__new__(executors.RayCluster)
  on_two_cpus.cpus, on_two_cpus.gpus, on_two_cpus.total_cpus, on_two_cpus.total_gpus = (
      1.0, 0.0, 2.0, 0.0)
  on_two_cpus.check_shards(2)
  with pytest.raises(UsageError, match=r"^--shards=3 actors of 1 CPU\(s\) and 0 GPU\(s\) "
                     "each do not fit at once in the cluster's 2 CPUs and 0 GPUs: lower "
                     "--ray_cpus_per_task"):
    on_two_cpus.check_shards(3)


@pytest.mark.cli
def test_a_run_killed_on_the_cluster_exits_cleanly_and_resumes(tmp_path, cluster):
  """SIGTERM ends the driver through the binary's handler and atexit (Ray's own
  handler would dump a stack trace), the finished batches' rows kept; the same
  command resumes."""
  args = [sys.executable, "-m", "benchmarks.compare", "--epsilons=4,inf", "--seeds=0",
          "--lams=0.1,1", "--rounds=3", f"--output_dir={tmp_path}",
          "--executor=ray", f"--ray_address={cluster}", "--ray_cpus_per_task=2"]
  proc = subprocess.Popen(args, cwd=binaries.ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  deadline = time.monotonic() + 300
  for line in proc.stderr:   # a batch's trials are in the CSV
    if line.startswith("[1/") or time.monotonic() > deadline:
      break
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  # (143 from the handler or its watchdog; 1 when the signal comes inside
  # ray.wait, which exits so)
  assert proc.returncode in (1, 128 + signal.SIGTERM), err[-3000:]
  assert "SIGTERM received" not in err
  finished = (pd.read_csv(tmp_path / "compare_quick.csv").row_type == "trial").sum()
  assert finished >= 1
  again = binaries.run("compare", *args[3:])
  assert again.returncode == 0, again.stderr[-2000:]
  assert f"{finished} already in" in again.stderr
  rows = pd.read_csv(tmp_path / "compare_quick.csv")
  assert rows.run_key.is_unique and (rows.row_type == "trial").sum() == (1 + 1 + 2) * 2


# --- the executor itself, on functions of this module (importable on a worker) ---


@dataclasses.dataclass(frozen=True)
class _Settings:
  failing: tuple


def _double(s, batch, progress):
  del progress
  if batch[0] in s.failing:
    raise (ValueError if batch[0] < 0 else RuntimeError)(f"batch {batch[0]} fails")
  return [2 * x for x in batch]


@pytest.mark.cli
def test_a_failing_batch_is_retried_then_reported_and_the_others_kept(cluster, capsys):
  del cluster   # the executor joins the cluster this process started
  work = executors.Work(_double, _Settings(failing=(3, -1)), __name__)
  batches = [[1, 2], [3], [-1], [4]]
  results = dict(executors.RayCluster("auto").run(work, batches))
  assert results[0] == [2, 4] and results[3] == [8]
  assert results[1] == executors.Failed("RuntimeError: batch 3 fails", 3)
  # a ValueError is a setting the data cannot take: never retried
  assert results[2] == executors.Failed("ValueError: batch -1 fails", 1)
  assert capsys.readouterr().err.count("retried: RuntimeError: batch 3 fails") == 2


def test_the_local_executor_runs_in_order_in_threads():
  work = executors.Work(_double, _Settings(failing=()), __name__)
  batches = [[i] for i in range(5)]
  assert list(executors.Local(workers=2).run(work, batches)) == [
      (i, [2 * i]) for i in range(5)]


def test_a_workers_data_that_is_not_the_drivers_is_refused(monkeypatch):
  recipe = dict(dataset="synthetic", seed=0)
  monkeypatch.setattr(datasets, "_CACHE", {})
  monkeypatch.setattr(datasets, "_EXPECTED", {})
  expected = datasets.travelling(datasets.load, recipe)[2]
  datasets._CACHE.clear()
  datasets.expect(datasets.load, recipe, expected)
  assert datasets.digest(datasets.cached(datasets.load, recipe)) == expected
  datasets._CACHE.clear()
  datasets.expect(datasets.load, recipe, "0" * 64)
  with pytest.raises(datasets.DataMismatch, match="differs from the driver's"):
    datasets.cached(datasets.load, recipe)


def test_the_digest_sees_every_array():
  silos = datasets.load(dict(dataset="synthetic", seed=0))[0]
  changed = list(silos.y_test)
  changed[-1] = changed[-1].copy()
  changed[-1][0] += 1
  assert datasets.digest(silos) != datasets.digest(
      dataclasses.replace(silos, y_test=tuple(changed)))
  assert datasets.digest(silos) == datasets.digest(
      datasets.load(dict(dataset="synthetic", seed=0))[0])


def test_ray_missing_names_the_install_command(monkeypatch):
  monkeypatch.setitem(sys.modules, "ray", None)
  with pytest.raises(UsageError, match=r"`uv sync --extra ray`"):
    executors.RayCluster("auto")


def test_files_a_batch_writes_are_refused_on_several_machines():
  class Cluster(NamedTuple):
    name: str
    machines: int
  with pytest.raises(UsageError, match=r"^--save_models writes files where a batch "
                     r"runs, and the cluster has 2 machines"):
    executors.check_files_written(Cluster("ray", 2), ["save_models", "ledger_csv"])
  executors.check_files_written(Cluster("ray", 1), ["save_models"])   # one machine
  executors.check_files_written(Cluster("ray", 2), [])


@pytest.mark.cli
@pytest.mark.parametrize("args, message", [
    (["--executor=ray", "--ray_address=127.0.0.1:1"],
     "error: --ray_address=127.0.0.1:1: no Ray cluster answers there"),
    (["--executor=ray", "--ray_address=nowhere"],
     "error: --ray_address='nowhere': give auto or host:port"),
    (["--executor=dask"], "error: --executor must be one of"),
    (["--ray_cpus_per_task=2"], "error: --ray_cpus_per_task applies with "
     "--executor=ray only"),
    (["--executor=ray", "--ray_cpus_per_task=0"], "error: --ray_cpus_per_task must be "
     "> 0"),
])
def test_bad_executor_flags_end_in_one_line(tmp_path, args, message):
  done = binaries.run("run", "--dataset=synthetic", "--methods=local", "--rounds=1",
                      f"--output={tmp_path / 'rows.csv'}", *args)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().startswith(message), done.stderr[-2000:]
  assert "\n" not in done.stderr.strip()
  assert not (tmp_path / "rows.csv").exists()


@pytest.mark.cli
def test_more_cpus_a_task_than_the_cluster_has_ends_in_one_line(tmp_path, cluster):
  done = binaries.run("run", "--dataset=synthetic", "--methods=local", "--rounds=1",
                      f"--output={tmp_path / 'rows.csv'}", "--executor=ray",
                      f"--ray_address={cluster}", "--ray_cpus_per_task=64")
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().startswith("error: --ray_cpus_per_task=64 and "
                                        "--ray_gpus_per_task=0: the cluster has 2 CPUs")


def test_a_dead_ray_address_in_the_environment_is_one_line_under_auto(monkeypatch):
  """--ray_address=auto joins what RAY_ADDRESS names: a dead one is refused at once
  (Ray retried it for minutes), naming the variable; unset, auto is not checked."""
  monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
  with pytest.raises(UsageError, match=r"^RAY_ADDRESS \(the environment\)="
                     r"127\.0\.0\.1:1: no Ray cluster answers there .*, or unset it$"):
    executors.check_reachable("auto")
  monkeypatch.setenv("RAY_ADDRESS", "nowhere")
  with pytest.raises(UsageError, match=r"^RAY_ADDRESS \(the environment\)='nowhere'"):
    executors.check_reachable("auto")
  monkeypatch.delenv("RAY_ADDRESS")
  executors.check_reachable("auto")
