"""`python -m benchmarks.run`: bad input ends in one line and a non-zero exit; a tiny
run writes its CSV row and leaves no TFF worker holding the output pipes."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests import binaries, matfiles
from tff_silo.privacy import integer_law

ROOT = binaries.ROOT   # the repository


def _run(*flags, timeout=600):
  return binaries.run("run", *flags, timeout=timeout)


@pytest.mark.cli
@pytest.mark.parametrize("flags, message", [
    (["--epsilon=0"], "--epsilon must be > 0"),
    (["--epsilon=-1"], "--epsilon must be > 0"),
    (["--epsilon=1", "--delta=1.5"], "--delta must be in (0, 1)"),
    (["--dataset=mnist"], "--dataset must be one of"),
    (["--methods=sgd"], "--methods must be among"),
    (["--dataset=school"], "--data_dir is required"),
    (["--lams=-2"], "--lams must be >= 0; got -2"),
    (["--lams="], "--lams is empty: give at least one value"),
    (["--seeds=a,b"], "--seeds must be a comma-separated list"),
    (["--methods=ifca", "--num_clusters=0"], "--num_clusters must be >= 1"),
    (["--methods=ifca", "--selection_fraction=0"], "--selection_fraction must be in"),
    (["--methods=dprivate_clustering", "--nu=0"], "--nu must be > 0"),
    (["--methods=dprivate_clustering", "--nu=-1"], "--nu must be > 0"),
    (["--methods=dprivate_clustering", "--epsilon=1"], "run it without --epsilon"),
    (["--methods=dprivate_clustering", "--leakage_cap=1"], "--leakage_cap needs --nu"),
    (["--neighbouring=swap"], "--neighbouring must be one of"),
    (["--test_fraction=0.5"], "--test_fraction applies to --dataset=school,vehicle"),
    (["--protocol=mine"], "--protocol must be one of"),
    (["--epsilon=1", "--neighbouring=replace_one", "--sampling=poisson"],
     "--sampling: sampling='poisson' has no accounting under replace_one"),
    (["--epsilon=1", "--protocol=paper", "--neighbouring=replace_one"],
     "--protocol=paper is add_remove"),
    (["--protocol=paper"], "--protocol=paper is a protocol of private runs: give "
     "--epsilon"),
    (["--epsilon=1", "--protocol=paper", "--nopublic_silo_sizes"],
     "--protocol=paper takes the silo sizes as public: drop --nopublic_silo_sizes"),
    (["--xla", "--aggregator=robust"], "--xla compiles the vectorized backend's rounds, "
     "and --aggregator=robust runs on TFF's runtime: drop one"),
    (["--shards=99999999999999999999"], "--shards must be in [0, 4096]"),
    (["--epsilon=1", "--public_silo_sizes", "--assumed_silo_size=20"],
     "assumed_silo_size is for add_remove with private silo sizes"),
    (["--backend=jax"], "--backend must be one of"),
    (["--device=tpu"], "--device must be one of"),
    (["--backend=tff", "--device=gpu"], "--device=gpu needs the vectorized backend"),
    (["--backend=tff", "--xla"], "--xla compiles the vectorized backend's rounds"),
    (["--device=xla_tpu"], "--device=xla_tpu: no PJRT tpu device here"),
    (["--backend=tff", "--device=xla_cpu"], "--device=xla_cpu runs the vectorized "
     "backend's rounds through XLA's PJRT runtime: use --backend=vectorized"),
    (["--device=xla_cpu", "--xla"], "--xla: --device=xla_cpu compiles every round "
     "with XLA already; drop --xla"),
    (["--device=xla_cpu", "--aggregator=robust"], "--device=xla_cpu runs the "
     "vectorized backend's rounds, and --aggregator=robust runs on TFF's runtime"),
    (["--export_xla=b", "--import_xla=b"], "--export_xla and --import_xla: give one"),
    (["--export_xla=b", "--device=cpu"], "--export_xla: --device=cpu: a bundle runs "
     "where it is replayed"),
    (["--dataset=two_cluster", "--methods=dprivate_clustering", "--patience=3",
      "--export_xla=b"], "--export_xla: --patience stops on the validation loss, which "
     "a bundle's rounds cannot know before they are replayed: drop --patience"),
    (["--import_xla=no_such_folder"], "--import_xla: no_such_folder: no manifest.json"),
    (["--device_memory"], "--device_memory estimates the programs PJRT runs in this "
     "process: give --device=xla_cpu"),
    (["--aggregator=median"], "--aggregator must be one of mean, unweighted_mean"),
    (["--aggregator=dp_fixed"], "--aggregator=dp_fixed needs --silo_epsilon"),
    (["--silo_epsilon=2"], "--silo_epsilon applies to --aggregator=dp_fixed|dp_adaptive"),
    (["--aggregator=dp_fixed", "--silo_epsilon=0"], "--silo_epsilon must be > 0"),
    (["--aggregator=robust", "--backend=vectorized"],
     "--aggregator=robust runs on TFF's runtime only"),
    (["--aggregator=no_such_module_x:f"], "--aggregator no_such_module_x:f: cannot import"),
    (["--methods=ifca", "--aggregator=dp_fixed", "--silo_epsilon=2"],
     "--aggregator=dp_fixed is unweighted; the ifca algorithms need a weighted one"),
    (["--methods=dprivate_clustering", "--aggregator=robust"],
     "--aggregator applies to --methods=local,fedavg"),
    (["--methods=mocha", "--aggregator=unweighted_mean"],
     "--aggregator applies to --methods=local,fedavg"),
    (["--methods=mocha,mrmtl", "--aggregator=unweighted_mean"],
     "mocha has no server mean: run it apart"),
    (["--dataset=two_cluster", "--methods=dprivate_clustering,fedavg",
      "--aggregator=unweighted_mean"], "dprivate_clustering has no server mean"),
    (["--corrupt_silos=1"], "--corrupt_silos applies to --dataset=school,synthetic"),
    (["--dataset=synthetic", "--corruption=-5"], "--corruption applies with "
     "--corrupt_silos >= 1 only"),
    (["--dataset=synthetic", "--corrupt_silos=20"], "--corrupt_silos=20 leaves no "
     "honest silo (the data has 20)"),
    (["--save_models="], "--save_models must name a folder"),
    (["--save_models=/proc/1/m"], "--save_models /proc/1/m: /proc/1 is not a writable "
     "folder"),
    (["--epsilon=1", "--ledger_csv=/proc/1/l.csv"], "--ledger_csv /proc/1/l.csv: its "
     "folder /proc/1 is not writable"),
])
def test_bad_flags_end_in_one_line(flags, message):
  proc = _run(*flags, timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and message in lines[0], proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.cli
def test_gpu_without_one_ends_in_one_line():
  import tensorflow as tf
  if tf.config.list_physical_devices("GPU"):
    pytest.skip("this machine has a GPU")
  proc = _run("--device=gpu", timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "TensorFlow sees no GPU" in lines[0], proc.stderr


@pytest.mark.cli
def test_data_dir_without_the_file(tmp_path):
  proc = _run("--dataset=school", f"--data_dir={tmp_path}", timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "data file not found" in lines[0], proc.stderr


@pytest.mark.cli
@pytest.mark.parametrize("binary", ["run", "hypernet"])
def test_help_lists_the_binarys_own_and_shared_flags_and_exits_0(binary):
  done = binaries.run(binary, "--help", fresh=True)   # absl's main module: the file
  assert done.returncode == 0, done.stderr[-2000:]
  for flag in ("--methods", "--rounds", "--backend", "--output"):
    assert f"  {flag}:" in done.stdout, flag


@pytest.mark.cli
def test_tiny_run_writes_a_row_and_exits(tmp_path):
  out = tmp_path / "rows.csv"
  # capture_output waits for the pipes to close: a leaked worker would hang this.
  proc = _run("--dataset=synthetic", "--methods=mrmtl,local", "--rounds=2",
              "--epsilon=2", "--lams=0.5", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = pd.read_csv(out)
  assert list(rows.algorithm) == ["mrmtl", "local"]
  for column in ("algorithm", "dataset", "seed", "rounds", "epsilon", "delta", "lam",
                 "lr", "batch_size", "clip", "metric", "train_metric", "test_metric",
                 "epsilon_spent_max", "noise_multiplier_mean", "wall_seconds"):
    assert column in rows.columns
  assert (rows.epsilon_spent_max <= 2.0).all() and (rows.noise_multiplier_mean > 0).all()
  assert "mrmtl" in proc.stdout
  # The guarantee's terms are in the row; the un-noised train metric is not.
  assert (rows.protocol == "add_remove").all() and (rows.sampling == "poisson").all()
  assert (rows.assumed_silo_size == 150).all() and not rows.public_silo_sizes.any()
  assert rows.train_metric.isna().all()
  assert "train_metric_outside_guarantee" not in rows.columns
  # auto picks the vectorized backend for these; the row says where it ran
  assert (rows.backend == "vectorized").all() and rows.device.isin(["cpu", "gpu"]).all()
  assert (rows.peak_memory_mb > 0).all()


@pytest.mark.cli
def test_xla_rounds_from_the_command_line(tmp_path):
  """--xla compiles the rounds (tests/backends/test_xla.py ties their numbers to the
  uncompiled ones) and the row says so; --device=xla_cpu runs the same HLO through
  PJRT's CPU client: the same rows but the device. Every round is evaluated
  (--eval_every=1: the rows' history)."""
  rows = {}
  args = ["--dataset=synthetic", "--methods=mrmtl,ifca,mocha", "--rounds=2",
          "--epsilon=2", "--lams=0.5", "--eval_every=1"]
  for name, flags in (("xla", ["--xla"]), ("pjrt", ["--device=xla_cpu",
                                                    "--device_memory"])):
    out = tmp_path / f"{name}.csv"
    proc = _run(*args, *flags, f"--output={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows[name] = pd.read_csv(out)
  xla, pjrt = rows["xla"], rows["pjrt"]
  assert list(xla.algorithm) == ["mrmtl", "ifca", "mocha"]
  assert (xla.device == "cpu+xla").all() and (xla.epsilon_spent_max <= 2.0).all()
  assert np.isfinite(xla.test_metric).all()
  for history, test in zip(xla.history, xla.test_metric):
    assert [r for r, _ in json.loads(history)] == [1, 2]
    assert json.loads(history)[-1][1] == pytest.approx(test, abs=1e-6)
  assert (pjrt.device == "xla_cpu").all() and list(pjrt.run_key) == list(xla.run_key)
  np.testing.assert_allclose(pjrt.test_metric, xla.test_metric, rtol=1e-5)
  np.testing.assert_array_equal(pjrt.epsilon_spent_max, xla.epsilon_spent_max)
  # --device_memory: each row's largest program on the device (XLA's estimate), a
  # measured column (it follows the silos' sizes) outside the guarantee.
  assert (pjrt.device_memory_mb > 0).all() and "device_memory_mb" not in xla
  assert pjrt.outside_guarantee_columns.str.contains("device_memory_mb").all()
  # The same command exported as a bundle (no rows), replayed by the standalone
  # runner in another process (the evaluations too), imported: the rows of
  # --device=xla_cpu but the times.
  out = tmp_path / "imported.csv"
  exported, proc = binaries.through_bundle("run", *args, f"--output={out}", rows=out,
                                           bundle=tmp_path / "bundle")
  assert "bundle of 3 run(s) written" in exported.stdout
  assert "outside any DP guarantee" in exported.stdout
  assert proc.returncode == 0, proc.stderr[-2000:]
  # (each evaluation is one of the bundle's calls: the metrics come from the replay)
  calls = json.loads((tmp_path / "bundle" / "manifest.json").read_text())["calls"]
  assert sum(call.get("evaluation", False) for call in calls) == 3 * 2 * 2
  imported = pd.read_csv(out)
  timing = ["wall_seconds", "seconds_per_round_median", "peak_memory_mb", "finished",
            "flags"]
  pjrt = pjrt.drop(columns="device_memory_mb").assign(   # (jaxlib 0.4 reports none)
      outside_guarantee_columns=pjrt.outside_guarantee_columns.str.replace(
          " device_memory_mb", ""))
  pd.testing.assert_frame_equal(imported.drop(columns=timing), pjrt.drop(columns=timing))


@pytest.mark.cli
@pytest.mark.parametrize("dataset", ["synthetic", "two_cluster"])
def test_dprivate_clustering_exports_its_rounds_and_imports_the_rows(tmp_path, dataset):
  """D-private clustering's rounds, its sampled users and their declines are fixed
  before any number (without --patience): the bundle's replay, imported, gives the
  rows of --device=xla_cpu but the times. On two_cluster the validation users pick
  the round kept from every round's hypotheses, which the bundle writes back."""
  args = [f"--dataset={dataset}", "--methods=dprivate_clustering", "--nu=5",
          "--rounds=4", "--clients_per_round=3", "--leakage_cap=5"]
  pjrt = tmp_path / "pjrt.csv"
  proc = _run(*args, "--device=xla_cpu", f"--output={pjrt}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = tmp_path / "imported.csv"
  exported, proc = binaries.through_bundle("run", *args, f"--output={out}", rows=out,
                                           bundle=tmp_path / "bundle")
  assert "bundle of 1 run(s) written" in exported.stdout
  assert proc.returncode == 0, proc.stderr[-2000:]
  imported, pjrt = pd.read_csv(out), pd.read_csv(pjrt)
  assert np.isfinite(imported.test_metric).all() and (imported.leakage_max <= 5).all()
  timing = ["wall_seconds", "seconds_per_round_median", "peak_memory_mb", "finished",
            "flags"]
  pd.testing.assert_frame_equal(imported.drop(columns=timing), pjrt.drop(columns=timing))


@pytest.mark.cli
def test_a_run_prints_no_tensorflow_start_up_lines(tmp_path):
  """Without TF_CPP_MIN_LOG_LEVEL set, TensorFlow's C++ log lines (on a CPU machine:
  "Unable to register cuDNN factory" ...) stay silent; the progress lines show."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--dataset=synthetic",
                         "--methods=local", "--rounds=1", f"--output={tmp_path / 'r.csv'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not re.search(r"^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] ", proc.stderr, re.M), proc.stderr
  assert "round 1/1" in proc.stderr


def test_binaries_let_tensorflow_grow_gpu_memory(monkeypatch):
  """Importing `benchmarks` (every binary does, before TensorFlow) turns on
  TensorFlow's GPU memory growth, unless the user chose otherwise."""
  import importlib
  import benchmarks
  monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
  importlib.reload(benchmarks)
  assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
  monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
  importlib.reload(benchmarks)
  assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"


@pytest.mark.cli
def test_mocha_runs_from_the_command_line(tmp_path):
  out = tmp_path / "rows.csv"
  proc = _run("--dataset=synthetic", "--methods=mocha", "--rounds=2", "--epsilon=2",
              "--lams=0.01,0.1", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = pd.read_csv(out)
  assert list(rows.algorithm) == ["mocha", "mocha"] and list(rows.lam) == [0.01, 0.1]
  assert (rows.epsilon_spent_max <= 2.0).all() and (rows.epsilon_spent_max > 1.99).all()
  assert rows.test_metric.notna().all() and rows.test_metric.nunique() == 2


@pytest.mark.cli
@pytest.mark.slow
def test_aggregators_from_the_command_line(tmp_path):
  """A built-in with silo-level DP and a user's factory by module path: each row
  says which ran, its parameters, its measurements and its own guarantee."""
  out = tmp_path / "agg.csv"
  common = ["--dataset=synthetic", "--methods=mrmtl", "--rounds=3", f"--output={out}"]
  proc = _run(*common, "--aggregator=dp_fixed", "--silo_epsilon=2",
              "--aggregator_clip=0.5")
  assert proc.returncode == 0, proc.stderr
  user = "tensorflow_federated.python.aggregators.mean:UnweightedMeanFactory"
  proc = _run(*common, f"--aggregator={user}", "--corrupt_silos=2")
  assert proc.returncode == 0, proc.stderr
  dp, own = pd.read_csv(out).to_dict("records")
  assert own["corrupt_silos"] == 2 and own["corruption"] == -10
  assert np.isfinite(own["honest_test_metric"]) and pd.isna(dp["honest_test_metric"])
  assert dp["aggregator"] == "dp_fixed" and dp["backend"] == "tff"
  assert 1.98 < dp["silo_epsilon_spent"] <= 2.0 and dp["silo_delta"] == 1e-3
  # its integer noise's table gap adds to the delta: 3 rounds of d coordinates
  tail = integer_law.release_tail(3 * (10 + 1))   # synthetic: 10 weights + bias
  assert dp["silo_delta_with_sampler_tail"] == pytest.approx(1e-3 + tail, rel=1e-12)
  assert dp["silo_guarantee_covers"].startswith("the server's aggregates")
  assert '"clip": 0.5' in dp["aggregator_params"]
  assert dp["server_weights"] == "unweighted"
  assert own["aggregator"] == user and pd.isna(own["silo_epsilon_spent"])


@pytest.mark.cli
def test_saved_models_load_with_the_split_they_trained_on(tmp_path):
  from benchmarks import datasets
  from tff_silo import runs
  out = tmp_path / "runs.csv"
  proc = _run("--dataset=synthetic", "--methods=mrmtl,fedavg", "--rounds=2",
              "--epsilon=4", "--noise=idealized", f"--output={out}",
              f"--save_models={tmp_path / 'saved'}")
  assert proc.returncode == 0, proc.stderr
  rows = pd.read_csv(out)
  for row in rows.to_dict("records"):
    saved = runs.load(row["saved_to"])
    assert saved.meta["run_key"] == row["run_key"]
    assert max(saved.meta["privacy"]["epsilon_spent"]) == pytest.approx(
        row["epsilon_spent_max"])
    silos, _ = datasets.load(saved.meta["data"])
    saved.check_data(silos)
    assert len(saved.silo_weights) == silos.num_silos
    assert saved.model().name == "linear_regression"
    # shadow models retrain as the run trained, its noise mechanism included
    assert saved.training_run(silos, seed=5).process.config.noise == "idealized"


@pytest.mark.cli
def test_a_test_share_other_than_the_datasets_is_a_column_and_a_run_of_its_own(tmp_path):
  """Thesis Fig. G.7's splits: --test_fraction holds out that share of every silo,
  and enters the row, the run key and the saved recipe only when given."""
  from benchmarks import datasets
  from tff_silo import runs
  matfiles.write_school(tmp_path, sizes=[40, 50, 60])
  out = tmp_path / "rows.csv"
  base = ["--dataset=school", f"--data_dir={tmp_path}", "--methods=local",
          "--rounds=1", "--batch_size=4", f"--output={out}",
          f"--save_models={tmp_path / 'saved'}"]
  for given in ([], ["--test_fraction=0.8"]):
    assert _run(*base, *given).returncode == 0
  default, held_out = pd.read_csv(out).to_dict("records")
  assert pd.isna(default["test_fraction"]) and held_out["test_fraction"] == 0.8
  assert "test_fraction" not in default["run_key"]
  assert default["run_key"] != held_out["run_key"]
  tests = []
  for row in (default, held_out):
    silos, _ = datasets.load(runs.load(row["saved_to"]).meta["data"])
    tests.append([len(y) for y in silos.y_test])
  assert tests == [[8, 10, 12], [32, 40, 48]]


@pytest.mark.cli
def test_finetuning_fractions_are_rows_apart_in_tables_and_pairs(tmp_path):
  """Thesis Fig. G.1: finetuning from different shares of the rounds are separate
  rows of the summary and separate labels of --paired, each paired with FedAvg."""
  out = tmp_path / "rows.csv"
  base = ["--dataset=synthetic", "--rounds=2", "--seeds=0,1", f"--output={out}"]
  for fraction in ("0.25", "0.75"):
    assert _run(*base, "--methods=finetune,fedavg",
                f"--finetune_fraction={fraction}").returncode == 0
  rows = pd.read_csv(out)
  assert sorted(rows.finetune_fraction.dropna()) == [0.25, 0.25, 0.75, 0.75]
  assert rows[rows.algorithm == "fedavg"].finetune_fraction.isna().all()
  from benchmarks import tables
  table = tables.summary_table(rows)
  assert len(table[table.algorithm == "finetune"]) == 2
  done = binaries.run("summarize", str(out), "--paired=finetune finetune_fraction="
                      "0.25:fedavg,finetune finetune_fraction=0.75:fedavg")
  assert done.returncode == 0, done.stderr
  for fraction in ("0.25", "0.75"):
    assert re.search(rf"^\| finetune finetune_fraction={fraction} \| fedavg \| inf "
                     rf"\| 2 \|", done.stdout, re.M), done.stdout


@pytest.mark.cli
def test_paper_and_shuffled_rows_say_what_their_epsilon_is(tmp_path):
  out = tmp_path / "rows.csv"
  base = ["--dataset=synthetic", "--methods=local", "--rounds=1", "--epsilon=2",
          f"--output={out}"]
  assert _run(*base, "--protocol=paper", "--outside_guarantee_metrics").returncode == 0
  assert _run(*base, "--protocol=paper", "--sampling=shuffle").returncode == 0
  paper, shuffled = pd.read_csv(out).to_dict("records")
  assert paper["protocol"] == "paper" and paper["public_silo_sizes"]
  assert paper["epsilon_spent_max"] <= 2.0 and paper["train_metric_outside_guarantee"] > 0
  assert pd.isna(shuffled["epsilon_spent_max"]) and shuffled["epsilon_if_poisson_max"] > 0
  from benchmarks import tables
  assert len(tables.summary_table(pd.read_csv(out))) == 2   # never averaged together


def test_summary_table_means_over_seeds():
  from benchmarks import tables
  df = pd.DataFrame(dict(dataset="d", algorithm=["a", "a", "b"], lam=0.0, epsilon=1.0,
                         seed=[0, 1, 0], test_metric=[0.2, 0.4, 0.5],
                         train_metric=[0.1, 0.1, 0.1], epsilon_spent_max=[0.9, 1.0, 0.8],
                         noise_multiplier_mean=1.0, wall_seconds=1.0))
  table = tables.summary_table(df).set_index("algorithm")
  assert table.loc["a", "test_mean"] == pytest.approx(0.3)
  assert table.loc["a", "seeds"] == 2 and table.loc["a", "eps_spent_max"] == 1.0
  assert "| d | a |" in tables.to_markdown(tables.summary_table(df))


@pytest.mark.cli
def test_rerun_resumes_from_the_csv(tmp_path):
  out = tmp_path / "rows.csv"
  flags = ["--dataset=synthetic", "--methods=local", "--rounds=1", f"--output={out}"]
  assert _run(*flags).returncode == 0
  again = _run(*flags)
  assert again.returncode == 0 and "skipped" in again.stderr
  assert len(pd.read_csv(out)) == 1
  assert _run(*flags, "--noresume").returncode == 0
  assert len(pd.read_csv(out)) == 2


@pytest.mark.cli
def test_sigterm_stops_the_worker(tmp_path):
  import signal
  import time
  proc = subprocess.Popen(
      [sys.executable, "-m", "benchmarks.run", "--dataset=synthetic", "--methods=local",
       "--rounds=3000", "--backend=tff", f"--output={tmp_path / 'rows.csv'}"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  deadline = time.monotonic() + 300
  for line in proc.stderr:  # wait until training is under way (progress every 300)
    if "round" in line or time.monotonic() > deadline:
      break
  proc.send_signal(signal.SIGTERM)
  # communicate() returns only once every holder of the pipes (a worker too) is gone.
  proc.communicate(timeout=60)
  assert proc.returncode != 0


@pytest.mark.cli
@pytest.mark.parametrize("flags, message", [
    (["--dataset=two_cluster", "--methods=dprivate_clustering", "--nu=5",
      "--leakage_cap=0.1"], "below the leakage of one participation"),
    (["--dataset=synthetic", "--methods=ifca", "--num_clusters=30"],
     "more than the 20 silos"),
])
def test_clustering_inputs_checked_at_run_time_end_in_one_line(tmp_path, flags, message):
  proc = _run(*flags, "--rounds=2", f"--output={tmp_path / 'rows.csv'}", timeout=300)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.strip() and "round" not in l]
  assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


@pytest.mark.cli
def test_clustering_rows_record_cluster_quality_and_leakage(tmp_path):
  out = tmp_path / "rows.csv"
  proc = _run("--dataset=two_cluster", "--methods=dprivate_clustering,ifca",
              "--rounds=4", "--nu=5", "--clients_per_round=7", "--leakage_cap=1.2",
              f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = pd.read_csv(out).set_index("algorithm")
  assert rows.loc["dprivate_clustering", "leakage_per_participation"] == pytest.approx(0.4)
  assert rows.loc["dprivate_clustering", "leakage_max"] <= 1.2 + 1e-9
  assert rows.loc["ifca", "num_clusters"] == 2
  assert -1 <= rows.loc["ifca", "ari"] <= 1
  # d-private clustering's assignment uses un-noised training losses: named so.
  assert -1 <= rows.loc["dprivate_clustering", "ari_outside_guarantee"] <= 1
  assert pd.isna(rows.loc["dprivate_clustering", "ari"])
  # two_cluster's hypotheses start from N(0, 1), as every run's did before the flag,
  # and such runs keep their keys
  assert rows.loc["dprivate_clustering", "hypothesis_init_std"] == 1.0
  assert "hypothesis_init_std" not in rows.loc["dprivate_clustering", "run_key"]


@pytest.mark.cli
@pytest.mark.slow
def test_rotated_fashion_mnist_users_train_dprivate_clustering(tmp_path, idx_files):
  """Galli et al. Table 4's stand-in: 200 users of 250 / 40 images (the IDX files
  the test writes), half rotated, two hypotheses near the model's initialization."""
  idx_files[0](tmp_path, n_train=50_000, n_test=8_000, gz=False)
  out = tmp_path / "rows.csv"
  proc = _run("--dataset=fmnist_rotated", f"--data_dir={tmp_path}",
              "--methods=dprivate_clustering", "--rounds=1", "--nu=5",
              "--clients_per_round=4", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  row = pd.read_csv(out).iloc[0]
  assert (row.num_silos, row.num_clusters, row.clients_per_round) == (200, 2, 4)
  assert row.hypothesis_init_std == 0.01 and '"hypothesis_init_std": 0.01' in row.run_key
  assert 0 <= row.test_metric <= 1
  assert row.leakage_max == pytest.approx(row.leakage_per_participation)   # at most once


@pytest.mark.cli
@pytest.mark.slow
def test_speed_times_both_backends_side_by_side(tmp_path):
  """`benchmarks.speed --parts=hypernet,protocol,calibration`: one fresh UDP-Alg run
  per backend, the same accuracy on both, and the medians' ratios printed; a School
  file's DP run end to end and its calibration cold under the paper's protocol (a
  setting per silo size here) and the honest default (one)."""
  out = tmp_path / "speed.csv"
  matfiles.write_school(tmp_path, sizes=[40, 50, 60, 70, 80, 90])
  done = subprocess.run([sys.executable, "-m", "benchmarks.speed",
                         "--parts=hypernet,protocol,calibration",
                         f"--data_dir={tmp_path}", "--repeats=1", "--hypernet_rounds=1",
                         "--rounds=2", f"--output={out}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.returncode == 0, done.stderr[-2000:]
  rows = pd.read_csv(out)
  timed = rows[rows.part == "hypernet"]
  assert sorted(timed.backend) == ["tff", "vectorized"]
  assert timed.test_metric.nunique() == 1 and (rows.peak_memory_mb > 0).all()
  assert "hypernet end_to_end_seconds: tff" in done.stdout
  runs = rows[rows.part == "protocol"].set_index("protocol")
  assert sorted(runs.index) == ["honest", "paper"] and (runs.rounds == 2).all()
  assert runs.test_metric["honest"] != runs.test_metric["paper"]   # weighted mean
  assert "School DP run end to end (vectorized): paper protocol" in done.stdout
  calibration = rows[rows.part == "calibration"].set_index("protocol")
  assert sorted(calibration.index) == ["honest", "paper", "replace_one"]
  assert calibration.settings["honest"] == 1 and calibration.settings["paper"] == 6
  assert calibration.settings["replace_one"] == 6
  assert "calibration (cold, School epsilon 6): paper 6 setting(s)" in done.stdout
