"""`python -m benchmarks.compare`: tuning on validation picks what it should, the
outputs are written, a killed run resumes without redoing finished trials, bad flags
end in one line."""

import dataclasses
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from tests import binaries

from tff_silo import data

ROOT = binaries.ROOT   # the repository
TINY = ["--epsilons=4,inf", "--seeds=0", "--lams=0.1,1", "--rounds=3"]


def _compare(tmp_path, *flags, timeout=600, popen=False):
  """benchmarks.compare writing to c.csv, c.md and figures in `tmp_path` (or with
  --output_dir among `flags`, to its defaults there)."""
  paths = ([] if any(f.startswith("--output_dir") for f in flags) else
           [f"--output={tmp_path / 'c.csv'}", f"--table={tmp_path / 'c.md'}",
            f"--figures_dir={tmp_path}"])
  args = [sys.executable, "-m", "benchmarks.compare", *paths, *flags]
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  if popen:   # a process of its own, to kill
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
  return binaries.run("compare", *paths, *flags, timeout=timeout)


def _finished(tmp_path, *flags, csv="c.csv"):
  """(process, rows of the CSV, its selected rows) of a run that must succeed."""
  proc = _compare(tmp_path, *flags)
  assert proc.returncode == 0, proc.stderr
  rows = pd.read_csv(tmp_path / csv)
  return proc, rows, rows[rows.row_type == "selected"]


@pytest.mark.cli
@pytest.mark.slow
def test_a_tiny_grid_selects_on_validation_and_writes_its_outputs(tmp_path):
  out = tmp_path / "out"
  proc, rows, selected = _finished(out, *TINY, f"--output_dir={out}",
                                   csv="compare_quick.csv")
  trials = rows[rows.row_type == "trial"]
  assert "mask_probability" not in rows   # a dataset without masks has no column
  # local and fedavg: 1 configuration, mrmtl: 2 lambdas; x 2 epsilons x 1 seed
  assert len(trials) == (1 + 1 + 2) * 2 and len(selected) == 3 * 2
  assert trials.run_key.is_unique
  for _, row in selected.iterrows():
    cell = trials[(trials.method == row.method) & (trials.epsilon == row.epsilon)
                  & (trials.seed == row.seed)]
    best = cell.loc[cell.validation_metric.idxmin()]   # mse: lower is better
    assert (row.lam, row.test_metric) == (best.lam, best.test_metric)
    assert row.num_trials == len(cell)
    if row.method == "mrmtl":
      assert row.tuning.startswith("free") and "not accounted" in row.tuning
    else:   # one configuration: nothing to tune
      assert row.tuning.startswith("none")
  private = trials[np.isfinite(trials.epsilon)]
  assert np.all(private.epsilon_spent <= 4.0) and np.all(private.epsilon_spent > 3.9)
  assert trials[~np.isfinite(trials.epsilon)].epsilon_spent.isna().all()
  # validation and test are different examples: different numbers
  assert not np.allclose(trials.validation_metric, trials.test_metric)
  # every output, and nothing else, in --output_dir
  written = {"compare_quick.csv", "compare_quick.md", "privacy_utility_quick.png",
             "lambda_quick.png"}
  assert set(os.listdir(out)) == written and os.listdir(tmp_path) == ["out"]
  assert all((out / name).stat().st_size > 0 for name in written)
  assert "| mrmtl |" in proc.stdout and "beats" in proc.stdout


@pytest.mark.cli
@pytest.mark.slow
def test_batches_running_at_once_write_what_one_at_a_time_writes(tmp_path):
  """Two batches at once (threads, the default) and one at a time: the same rows
  in the same order, timings aside."""
  tables = []
  for workers in (1, 2):
    out = tmp_path / str(workers)
    _, rows, _ = _finished(out, *TINY, "--lams=0.1,1,3", "--seeds=0,1",
                           f"--concurrent_batches={workers}")
    tables.append(rows.drop(columns=["wall_seconds", "peak_memory_mb"]))
  assert len(tables[0]) == (1 + 1 + 3) * 2 * 2 + 3 * 2 * 2
  pd.testing.assert_frame_equal(tables[0], tables[1])


@pytest.mark.cli
def test_a_batch_that_completes_no_cell_writes_its_trials_and_goes_on(tmp_path):
  """On TFF's runtime a batch is one configuration's trials: lambda 0.1's finishes
  before the cell, which waits for lambda 1's, is complete."""
  _, rows, selected = _finished(tmp_path, "--methods=mrmtl", "--lams=0.1,1",
                                "--epsilons=inf", "--seeds=0", "--rounds=2",
                                "--backend=tff")
  assert list(rows.row_type) == ["trial", "trial", "selected"]
  assert list(rows.lam[:2]) == [0.1, 1.0] and len(selected) == 1


@pytest.mark.cli
@pytest.mark.slow
def test_a_bundle_of_the_grid_imports_the_rows_pjrt_writes(tmp_path):
  """--export_xla records the pending trials' rounds (no row), the standalone
  runner replays them in another process, and --import_xla writes the rows of
  --device=xla_cpu but the times (its batches one at a time, in the bundle's
  order, whatever --concurrent_batches says)."""
  _, pjrt, _ = _finished(tmp_path / "pjrt", *TINY, "--device=xla_cpu")
  out = tmp_path / "imported"
  exported, done = binaries.through_bundle(
      "compare", *TINY, "--concurrent_batches=2", f"--output={out / 'c.csv'}",
      f"--table={out / 'c.md'}", f"--figures_dir={out}", rows=out / "c.csv",
      bundle=tmp_path / "bundle")
  assert "bundle of the pending trials of 6 cell(s) written" in exported.stdout
  assert "outside any DP guarantee" in exported.stdout
  assert done.returncode == 0, done.stderr[-2000:]
  imported = pd.read_csv(out / "c.csv")
  timing = ["wall_seconds", "peak_memory_mb"]
  pd.testing.assert_frame_equal(imported.drop(columns=timing), pjrt.drop(columns=timing))


@pytest.mark.cli
@pytest.mark.slow
def test_a_killed_run_resumes_without_redoing_finished_trials(tmp_path):
  proc = _compare(tmp_path, *TINY, "--lams=0.01,0.1,1,10", popen=True)
  deadline = time.monotonic() + 300
  for line in proc.stderr:   # the first batch's trials are in the CSV
    if line.startswith("[1/") or time.monotonic() > deadline:
      break
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=120)
  first = pd.read_csv(tmp_path / "c.csv")
  finished = (first.row_type == "trial").sum()
  assert finished >= 1   # the first batch: local's private trial
  again = _compare(tmp_path, *TINY, "--lams=0.01,0.1,1,10")
  assert again.returncode == 0, again.stderr
  assert f"{finished} already in" in again.stderr
  rows = pd.read_csv(tmp_path / "c.csv")
  assert rows.run_key.is_unique
  assert (rows.row_type == "trial").sum() == (1 + 1 + 4) * 2
  # the finished trials' rows are the first run's, untouched
  pd.testing.assert_frame_equal(rows.iloc[:len(first)], first, check_dtype=False)


@pytest.mark.cli
@pytest.mark.slow
def test_a_killed_private_tuning_resumes_from_its_partial_trials(tmp_path):
  """Under private tuning finished trials wait in the partial file (each marked
  outside the guarantee) until their cell is selected; a rerun picks them up, and
  the file goes once every cell is in the output."""
  flags = (*TINY, "--lams=0.01,0.1,1,10", "--tuning=private", "--mean_trials=6",
           "--methods=mrmtl")
  proc = _compare(tmp_path, *flags, popen=True)
  deadline = time.monotonic() + 300
  for line in proc.stderr:
    if line.startswith("[1/") or time.monotonic() > deadline:
      break
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=120)
  partial = tmp_path / "c.trials.partial.csv"
  waiting = pd.read_csv(partial)
  assert len(waiting) >= 1 and waiting.outside_guarantee.all()
  secret = tmp_path / "c.trials.partial.csv.plan_secret"   # the plans' OS entropy
  assert int(secret.read_text()) >= 0
  _, rows, selected = _finished(tmp_path, *flags)
  assert len(rows) == len(selected) == 2
  assert not partial.exists() and not secret.exists()


@pytest.mark.cli
def test_private_tuning_meets_its_budget_by_dp_accountings_own_bound(tmp_path):
  """Each private cell draws h trials with their own seeds; the noisy score alone
  selects; the selected row's epsilon is the tuning's total, and dp_accounting's
  RepeatAndSelectDpEvent of what a trial ran (DP-SGD at its noise, the Gaussian
  score) confirms it is within the target. --trials_output holds every trial, each
  marked outside the guarantee with the epsilon of releasing its cell's h trials:
  dp_accounting's composition of h such trials."""
  import dp_accounting
  from tff_silo.privacy import accounting
  every = tmp_path / "trials.csv"
  _, rows, _ = _finished(tmp_path, *TINY, "--tuning=private", "--mean_trials=3",
                         "--methods=local,mrmtl", f"--trials_output={every}")
  trials = pd.read_csv(every)
  assert (trials.row_type == "trial").all() and trials.outside_guarantee.all()
  drawn = trials[trials.trial >= 0]
  assert set(drawn.method) == {"mrmtl"} and set(drawn.epsilon) == {4.0}
  assert drawn.run_seed.is_unique and drawn.validation_metric.isna().all()
  assert drawn.noisy_validation_score.notna().all()
  assert np.all(drawn.epsilon_spent < 3.0)   # each trial trains with less
  rate, steps = 16 / 48, 3 * (48 // 16)   # the quick preset's B and m, 3 rounds
  orders = list(accounting.RDP_ORDERS) + [512.0, 1024.0, 2048.0, 4096.0, 8192.0]
  for _, trial in drawn.iterrows():
    assert 0.999 * 4.0 < trial.epsilon_tuned <= 4.0
    event = dp_accounting.ComposedDpEvent([
        accounting.dp_sgd_event(trial.noise_multiplier, rate, steps),
        dp_accounting.GaussianDpEvent(trial.score_noise_multiplier)])
    accountant = dp_accounting.rdp.RdpAccountant(orders)
    accountant.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(event, 3.0, 1.0))
    assert accountant.get_epsilon(1e-3) <= 4.0 * (1 + 1e-3)
    everything = dp_accounting.rdp.RdpAccountant(orders)
    everything.compose(event, len(drawn))
    assert trial.epsilon_if_released == pytest.approx(everything.get_epsilon(1e-3),
                                                      rel=1e-9)
  if len(drawn) > 1:   # several trials released cost more than one
    assert np.all(drawn.epsilon_if_released > drawn.epsilon_spent)
  selected = rows[(rows.row_type == "selected") & (rows.method == "mrmtl")
                  & (rows.epsilon == 4.0)].iloc[0]
  assert selected.noisy_validation_score == drawn.noisy_validation_score.min()
  assert selected.epsilon_spent == pytest.approx(drawn.epsilon_tuned.max())
  assert selected.tuning.startswith("private")
  untuned = rows[(rows.row_type == "selected") & (rows.method == "local")]
  assert untuned.tuning.str.startswith("none").all()
  assert untuned[untuned.epsilon == 4.0].epsilon_spent.iloc[0] > 3.99
  again = _compare(tmp_path, *TINY, "--tuning=private", "--mean_trials=3",
                   "--methods=local,mrmtl", f"--trials_output={every}")
  assert "4 already in" in again.stderr and "in 0 batches" in again.stderr


@pytest.mark.cli
def test_private_tuning_writes_only_what_its_accountant_covers(tmp_path):
  """Papernot & Steinke's bound covers the best trial alone, with h hidden: a
  private-tuning run writes one row per cell with the released columns only (no
  trial index, seed, count or summed time), saves the selected trial alone (under
  the cell's key, its privacy block the tuning's total), keeps no trial file once
  done, and draws its table and figures from those rows."""
  from benchmarks import grid
  from tff_silo import runs
  models = tmp_path / "models"
  proc, rows, selected = _finished(tmp_path, *TINY, "--tuning=private",
                                   "--mean_trials=4", "--methods=local,mrmtl",
                                   f"--save_models={models}")
  assert len(rows) == len(selected) == 4   # (local, mrmtl) x (4, inf), one seed
  assert set(rows.columns) <= set(grid.RELEASED_COLUMNS)
  assert rows[np.isfinite(rows.epsilon)].validation_metric.isna().all()
  assert sorted(os.listdir(tmp_path)) == sorted(
      ["c.csv", "c.md", "models", "privacy_utility_quick_private.png",
       "lambda_quick_private.png"])
  saved = sorted(os.listdir(models))
  assert len(saved) == 4 and sorted(rows.saved_to.map(os.path.basename)) == saved
  for _, row in rows.iterrows():
    run = runs.load(row.saved_to)
    assert run.meta["run_key"] == row.run_key and "trial" not in run.meta["info"]
    if np.isfinite(row.epsilon):
      spent = run.meta["privacy"]["epsilon_spent"]
      assert max(spent) == pytest.approx(row.epsilon_spent) and max(spent) <= 4.0
  table = (tmp_path / "c.md").read_text()
  assert "| mrmtl |" in table and proc.stdout.startswith(table.splitlines()[0])


@pytest.mark.cli
def test_a_second_run_in_one_process_calibrates_for_its_own_settings(tmp_path):
  """Two private-tuning runs in one process (`binaries` keeps one per binary, as a
  notebook calling main twice would) share no calibration: the second, with fewer
  trials' worth of budget each (E[h] 10 after 4), meets its own epsilon."""
  for mean_trials in ("4", "10"):
    out = tmp_path / mean_trials
    proc = binaries.run("compare", *TINY, "--tuning=private", "--methods=mrmtl",
                        f"--mean_trials={mean_trials}", f"--output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.read_csv(out / "compare_quick.csv")
    private = rows[np.isfinite(rows.epsilon)]
    assert len(private) == 1 and (private.epsilon_spent <= 4.0).all()


@pytest.mark.cli
def test_membership_inference_reports_leakage_beside_utility(tmp_path):
  proc, _, selected = _finished(tmp_path, "--methods=local,fedavg", "--epsilons=inf",
                                "--seeds=0", "--rounds=3", "--membership")
  assert selected.mia_auc.between(0, 1).all() and selected.mia_advantage.notna().all()
  assert not selected.mia_inside_guarantee.any()
  assert (tmp_path / "leakage_quick.png").stat().st_size > 0
  assert "Membership inference" in proc.stdout


@pytest.mark.cli
def test_ifca_methods_run_in_the_grid(tmp_path):
  _, _, selected = _finished(tmp_path, "--methods=ifca,ifca_mrmtl", "--epsilons=4",
                             "--seeds=0", "--lams=1", "--rounds=3")
  assert sorted(selected.method) == ["ifca", "ifca_mrmtl"]
  assert np.all((selected.epsilon_spent > 3.99) & (selected.epsilon_spent <= 4.0))


@pytest.mark.cli
def test_mocha_is_tuned_over_lambda_in_the_grid(tmp_path):
  _, rows, selected = _finished(tmp_path, "--methods=mocha,local", "--epsilons=4",
                                "--seeds=0", "--lams=0.001,0.1", "--rounds=3")
  trials = rows[(rows.row_type == "trial") & (rows.method == "mocha")]
  assert sorted(trials.lam) == [0.001, 0.1] and trials.test_metric.nunique() == 2
  assert list(selected.method) == ["local", "mocha"]
  assert np.all((selected.epsilon_spent > 3.99) & (selected.epsilon_spent <= 4.0))


@pytest.mark.cli
@pytest.mark.slow
def test_the_hypernetwork_runs_with_a_user_level_epsilon(tmp_path):
  """UDP-Alg among the methods: one configuration, its noise calibrated so that T
  user-sampled Gaussian rounds are (epsilon, delta)-DP at the user level, by
  dp_accounting's own computation."""
  import dp_accounting
  from benchmarks import configs
  _, rows, selected = _finished(tmp_path, "--preset=digits", "--methods=hypernet",
                                "--epsilons=4,inf", "--seeds=0", "--rounds=2")
  assert len(rows[rows.row_type == "trial"]) == 2
  assert (rows.mask_probability == 0.1).all()   # the digits' own, as a column
  private = selected[np.isfinite(selected.epsilon)].iloc[0]
  assert private.privacy_unit == "user" and private.tuning.startswith("none")
  assert not private.test_metric_inside_guarantee   # each user's un-noised embedding
  q = configs.COMPARE_PRESETS["digits"].hypernet.sampling_rate
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(private.noise_multiplier)), 2)
  assert 3.9 < accountant.get_epsilon(configs.COMPARE_PRESETS["digits"].delta) <= 4.0
  assert 3.9 < private.epsilon_spent <= 4.0
  assert selected[~np.isfinite(selected.epsilon)].privacy_unit.isna().all()
  assert selected.test_metric.between(0, 1).all()


@pytest.mark.cli
@pytest.mark.slow
def test_a_dp_aggregator_reports_its_silo_level_epsilon(tmp_path):
  proc, _, selected = _finished(tmp_path, "--methods=fedavg", "--epsilons=4", "--seeds=0",
                                "--rounds=3", "--aggregator=dp_fixed", "--silo_epsilon=3")
  row = selected.iloc[0]
  assert row.aggregator == "dp_fixed" and row.backend == "tff"
  assert 2.99 < row.silo_epsilon_spent <= 3.0 and row.silo_delta == 1e-3
  assert 3.99 < row.epsilon_spent <= 4.0   # the silos' example-level DP beside it
  assert "Server aggregator: dp_fixed, silo-level epsilon 3" in proc.stdout
  # integer noise: its table's gap, ~1e-18 a coordinate, is all the sampler adds
  assert row.silo_delta_with_sampler_tail == pytest.approx(row.silo_delta, rel=1e-12)
  assert "covers the server's aggregates" in proc.stdout


@pytest.mark.cli
@pytest.mark.slow
def test_saved_trials_load_with_the_silos_they_trained_on(tmp_path):
  from benchmarks import datasets
  from tff_silo import runs, simulation
  _, rows, _ = _finished(tmp_path, "--methods=mrmtl", "--epsilons=4", "--seeds=0",
                         "--lams=0.1,1", "--rounds=2", f"--save_models={tmp_path / 's'}")
  trials = rows[rows.row_type == "trial"]
  assert len(trials) == 2 and trials.saved_to.notna().all()
  saved = runs.load(trials.saved_to.iloc[0])
  silos = datasets.load(saved.meta["data"])[0]
  saved.check_data(silos)   # the training part of the validation split
  assert saved.meta["info"]["lam"] == trials.lam.iloc[0]
  shadow = simulation.run_simulations([saved.training_run(silos, seed=5)], rounds=2,
                                      backend="vectorized")[0]
  assert 3.99 < max(shadow.privacy.epsilon_spent) <= 4.0


@pytest.mark.cli
@pytest.mark.parametrize("tuning", ["free", "private"])
def test_a_disk_that_refuses_the_models_keeps_the_rows(tmp_path, tuning):
  """RELIABILITY_CASES D3 for compare: every save failing (ENOSPC) leaves each
  trained row in place, saved_to empty, one line per save on stderr (the trials'
  and, under private tuning, the selected trial's publication)."""
  script = (
      "import errno, sys\n"
      "from tff_silo import runs\n"
      "def full(*args, **kwargs):\n"
      "  raise OSError(errno.ENOSPC, 'No space left on device')\n"
      "runs.save = full\n"
      "from benchmarks import common, compare\n"
      "sys.argv = ['compare', *sys.argv[1:]]\n"
      "common.run_main(compare.main)\n")
  out = tmp_path / "c.csv"
  private = ["--tuning=private", "--mean_trials=2"] if tuning == "private" else []
  done = subprocess.run(
      [sys.executable, "-c", script, f"--output={out}", f"--table={tmp_path / 'c.md'}",
       f"--figures_dir={tmp_path}", "--methods=mrmtl", "--epsilons=4", "--seeds=0",
       "--lams=0.1,1", "--rounds=2", f"--save_models={tmp_path / 's'}", *private],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.returncode == 0, done.stderr[-2000:]
  refused = [line for line in done.stderr.splitlines() if "could not be saved" in line]
  rows = pd.read_csv(out)
  selected = rows[rows.row_type == "selected"]
  assert len(selected) == 1 and selected.saved_to.isna().all()
  if tuning == "free":
    trials = rows[rows.row_type == "trial"]
    assert len(trials) == 2 and trials.saved_to.isna().all()
    assert len(refused) == 2, done.stderr[-2000:]
  else:   # the staged saves refused: nothing to publish
    assert refused and all("row is kept" in line for line in refused)
  assert "Traceback" not in done.stderr


@pytest.mark.cli
def test_vehicle_accuracy_is_tuned_upwards(tmp_path, shared_data):
  """A preset read from --data_dir whose metric is accuracy (higher is better)."""
  _, rows, selected = _finished(tmp_path, "--preset=vehicle", f"--data_dir={shared_data}",
                                "--methods=mrmtl", "--epsilons=inf", "--seeds=0",
                                "--lrs=0.01,0.1", "--lams=0.1", "--rounds=3")
  trials = rows[rows.row_type == "trial"]
  assert set(trials.metric) == {"accuracy"} and len(trials) == 2
  assert selected.validation_metric.iloc[0] == trials.validation_metric.max()


def test_the_fashion_mnist_presets_read_their_folder(tmp_path, idx_files):
  from benchmarks import datasets
  idx_files[0](tmp_path, n_train=400, n_test=100)
  silos = datasets.compare_preset_silos("fmnist_hetero", 0, str(tmp_path))
  assert silos.num_silos == 30 and silos.feature_shape == (28, 28, 1)
  with pytest.raises(data.DataError, match="fewer than 40 silos x 1500"):
    datasets.compare_preset_silos("fmnist", 0, str(tmp_path))


@pytest.mark.cli
def test_private_tuning_of_ifca_counts_its_selections(tmp_path):
  """IFCA's private selections take a share of the trial's own epsilon; the
  calibration solves for it and the total, recomputed from what ran, meets the
  target."""
  every = tmp_path / "trials.csv"
  _, _, selected = _finished(tmp_path, "--methods=ifca_mrmtl", "--epsilons=4",
                             "--seeds=0", "--lams=0.1,1", "--rounds=10",
                             "--tuning=private", "--mean_trials=2",
                             f"--trials_output={every}")
  rows = pd.read_csv(every)
  drawn = rows[rows.trial >= 0]
  assert len(drawn) >= 1
  assert np.all((drawn.epsilon_tuned > 0.99 * 4.0) & (drawn.epsilon_tuned <= 4.0))
  assert selected.epsilon_spent.iloc[0] <= 4.0


def test_selection_never_picks_a_diverged_trial():
  from benchmarks import grid
  s = grid.Settings(
      preset="quick", dataset="quick", methods=("mrmtl",), epsilons=(math.inf,),
      seeds=(0,), rounds=3, batch_size=16, clip=1.0, delta=1e-3,
      validation_fraction=0.2, assumed_silo_size=48, num_clusters=2, lrs=(0.1,),
      lams=(0.1, 1.0, 10.0))
  trials = pd.DataFrame(dict(
      method="mrmtl", epsilon=math.inf, seed=0, lam=[0.1, 1.0, 10.0], lr=0.1, trial=-1,
      metric="mse", validation_metric=[0.5, math.nan, 0.4], test_metric=[0.6, 0.1, 0.45],
      wall_seconds=1.0, run_key=["a", "b", "c"]))
  planned = trials[["method", "epsilon", "seed"]].to_dict("records")
  assert grid.selected(s, trials, planned).lam.tolist() == [10.0]
  trials.loc[2, "validation_metric"] = math.inf
  assert grid.selected(s, trials, planned).lam.tolist() == [0.1]
  accuracy = trials.assign(metric="accuracy", validation_metric=[0.5, math.nan, 0.7])
  assert grid.selected(s, accuracy, planned).lam.tolist() == [10.0]
  assert grid.selected(s, trials.iloc[:2], planned).empty   # not finished yet


@pytest.mark.parametrize("tuning", ["free", "private"])
def test_every_trial_of_a_grid_has_keys_of_its_own(tuning):
  """Trials of one seed (every method, configuration, epsilon and draw) each take
  their own run seed, the same on a rerun; another setting (rounds) moves them all."""
  from benchmarks import grid
  s = grid.Settings(
      preset="quick", dataset="quick", rounds=3, batch_size=16, clip=1.0, delta=1e-3,
      validation_fraction=0.2, assumed_silo_size=48, lrs=(0.1, 0.3),
      lams=(0.1, 1.0, 10.0), tuning=tuning, membership=False, seeds=(0, 1),
      methods=("local", "fedavg", "mrmtl", "ditto"), epsilons=(2.0, 4.0, math.inf),
      num_clusters=2, tuning_eta=1.0, mean_trials=4.0, score_budget_share=0.1,
      score_clip=4.0, plan_secret=12345 if tuning == "private" else None)
  trials = grid.trials(s)
  seeds = [t["run_seed"] for t in trials]
  assert len(set(seeds)) == len(trials) > 40
  assert seeds == [t["run_seed"] for t in grid.trials(s)]
  other = dataclasses.replace(s, rounds=4)
  assert not set(seeds) & {t["run_seed"] for t in grid.trials(other)}
  if tuning == "private":
    # The plans (h and the configurations drawn) follow the secret, not the seeds.
    plans = lambda secret: [(t["method"], t["epsilon"], t["seed"], t["lam"], t["lr"])
                            for t in grid.trials(dataclasses.replace(
                                s, plan_secret=secret))]
    assert plans(12345) == plans(12345)
    assert len({tuple(plans(secret)) for secret in range(5)}) == 5
    # A method's plans follow its name, not its place in the grid's methods.
    alone = [p for p in plans(12345) if p[0] == "ditto"]
    moved = dataclasses.replace(s, methods=("ditto", "mrmtl"))
    assert [(t["method"], t["epsilon"], t["seed"], t["lam"], t["lr"])
            for t in grid.trials(moved) if t["method"] == "ditto"] == alone
    from unittest import mock
    with mock.patch.object(grid, "METHODS", ("ditto", *grid.METHODS[:4])):
      assert [p for p in plans(12345) if p[0] == "ditto"] == alone
    with pytest.raises(ValueError, match="plan_secret"):
      grid.trials(dataclasses.replace(s, plan_secret=None))


@pytest.mark.cli
@pytest.mark.parametrize("flag, message", [
    ("--preset=mnist", "--preset must be one of"),
    ("--output_dir=README.md", "--output_dir must name a folder; got 'README.md'"),
    ("--methods=sgd", "--methods must be among"),
    ("--methods=hypernet", "--methods=hypernet runs on image silos only (--preset=digits"),
    ("--epsilons=0", "--epsilons must be > 0 (inf runs without DP)"),
    ("--epsilons=-inf", "--epsilons must be > 0"),
    ("--epsilons=2000", "--epsilons must be at most 1000"),
    ("--epsilons=a", "--epsilons must be numbers or inf"),
    ("--lams=-1", "--lams must be > 0; got -1"),
    ("--lams=", "--lams is empty: give at least one value, or leave the flag out"),
    ("--validation_fraction=1", "--validation_fraction must be in (0, 1)"),
    ("--table=/proc/1/t.md", "--table /proc/1/t.md: its folder /proc/1 is not writable"),
    ("--concurrent_batches=0", "--concurrent_batches must be in [1, 64]"),
    ("--concurrent_batches=100000", "--concurrent_batches must be in [1, 64]"),
    ("--tuning=private --mean_trials=1e12", "--mean_trials must be in (1, 1000]"),
    ("--tuning=private --epsilons=inf", "--tuning=private pays for tuning private "
                                        "cells, and --epsilons=inf has none"),
    ("--mask_probability=0.2", "--mask_probability applies to the digits/fmnist "
                               "presets only; --preset=quick has no masks"),
    ("--preset=digits --mask_probability=1", "--mask_probability must be in [0, 1)"),
    ("--preset=school", "--preset=school needs --data_dir"),
    ("--preset=fmnist", "--preset=fmnist needs --data_dir (the folder with Fashion"),
    ("--data_dir=/tmp", "--data_dir applies to --preset=vehicle,fmnist,fmnist_hetero,"),
    ("--tuning=oracle", "--tuning must be one of"),
    ("--mean_trials=3", "--mean_trials applies to --tuning=private only"),
    ("--trials_output=/tmp/t.csv", "--trials_output applies to --tuning=private only"),
    ("--aggregator=dp_fixed --silo_epsilon=2 --tuning=private",
     "--aggregator=dp_fixed with --tuning=private: the silo-level cost of tuning"),
    ("--aggregator=median", "--aggregator must be one of mean"),
    ("--methods=mocha,mrmtl --aggregator=unweighted_mean",
     "--aggregator=unweighted_mean: mocha has no server mean"),
    ("--export_xla=b --xla", "--export_xla: drop --xla (a bundle's rounds are XLA"),
    ("--import_xla=no_such_folder", "--import_xla: no_such_folder: no manifest.json"),
    ("--preset=digits --methods=local,hypernet --epsilons=0.3,inf",   # before any trial
     "--epsilons: the hypernetwork at epsilon 0.3 needs z = 19.1, beyond integer noise "
     "over its 2,181,386 weights"),
])
def test_bad_flags_end_in_one_line(tmp_path, flag, message):
  proc = _compare(tmp_path, *flag.split(), timeout=120)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_a_mask_probability_makes_the_silos_and_keys_of_its_own():
  """--mask_probability reaches the silos (0: no white pixels beyond the images'
  own) and the trials' seeds; unset, the recipes and keys are those of before."""
  from benchmarks import datasets, grid
  s = grid.Settings(
      preset="digits", dataset="digits", methods=("mrmtl",), epsilons=(math.inf,),
      seeds=(0,), rounds=3, batch_size=16, clip=1.0, delta=1e-3,
      validation_fraction=0.2, assumed_silo_size=29, num_clusters=4, lrs=(0.1,),
      lams=(0.1, 1.0))
  masked = dataclasses.replace(s, mask_probability=0.4)
  assert "mask_probability" not in grid.recipe(s, 0)
  assert grid.recipe(masked, 0)["mask_probability"] == 0.4
  plain, none, heavy = (datasets.compare_preset_silos("digits", 0, None, p)
                        for p in (None, 0.0, 0.4))
  white = lambda silos: np.mean([np.mean(x == 1.0) for x in silos.x_train])
  assert white(none) < white(plain) < white(heavy)
  assert {t["run_seed"] for t in grid.trials(s)}.isdisjoint(
      t["run_seed"] for t in grid.trials(masked))
  # rows say which: the flag's probability, else the loader's own default
  assert grid.setting_columns(masked) == dict(mask_probability=0.4)
  assert grid.setting_columns(s) == dict(mask_probability=0.1)
  assert grid.setting_columns(dataclasses.replace(s, dataset="school")) == {}


@pytest.mark.parametrize("name", ["digits", "fmnist"])
def test_the_registry_knows_each_masked_loaders_own_mask_probability(name):
  import inspect
  from benchmarks import datasets
  from tff_silo import data
  loader = {"digits": data.load_rotated_masked_digits,
            "fmnist": data.rotated_masked_fmnist_silos}[name]
  default = inspect.signature(loader).parameters["mask_probability"].default
  assert datasets.DATASETS[name].mask_probability == default
  assert set(datasets.taking("compare", masked=True)) == {"digits", "fmnist"}


def test_validation_split_holds_out_training_examples_only():
  silos = data.heterogeneous_linear_silos(num_silos=3, num_examples=400, seed=0)
  fit, x_val, y_val = data.validation_split(silos, 0.2, seed=1)
  for k in range(3):
    n = len(silos.y_train[k])
    assert len(fit.y_train[k]) + len(y_val[k]) == n
    assert abs(len(y_val[k]) - 0.2 * n) < 4 * np.sqrt(0.16 * n)   # a coin each
    pooled = np.concatenate([fit.y_train[k], y_val[k]])
    np.testing.assert_array_equal(np.sort(pooled), np.sort(silos.y_train[k]))
    np.testing.assert_array_equal(fit.y_test[k], silos.y_test[k])   # test untouched
    assert len(x_val[k]) == len(y_val[k])
  again = data.validation_split(silos, 0.2, seed=1)
  np.testing.assert_array_equal(again[2][0], y_val[0])


def test_validation_coins_leave_other_examples_in_place():
  """Adding an example (last) leaves every other example's side as it was: the
  neighbouring relation private tuning's accounting needs."""
  x = np.arange(40, dtype=np.float32)[:, None]
  make = lambda n: data.make_silos("s", "regression", [x[:n]], [x[:n, 0]], [x[:2]],
                                   [x[:2, 0]])
  _, _, small = data.validation_split(make(39), 0.3, seed=4)
  _, _, large = data.validation_split(make(40), 0.3, seed=4)
  np.testing.assert_array_equal(large[0][large[0] < 39], small[0])


def test_validation_split_refuses_a_silo_left_without_training_examples():
  one = data.make_silos("one", "regression", [np.zeros((1, 2))], [np.zeros(1)],
                        [np.zeros((1, 2))], [np.zeros(1)])
  with pytest.raises(data.DataError, match="silo 0 drew all its 1 training"):
    data.validation_split(one, 0.999, seed=0)
