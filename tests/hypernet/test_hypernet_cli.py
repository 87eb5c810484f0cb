"""`python -m benchmarks.hypernet`: bad inputs end in one line; a tiny run writes one
row per (algorithm, q, S, z) with the accounted user-level epsilon."""

import json
import math
import os

import pandas as pd
import pytest
from absl import flags
from absl.testing import flagsaver

from tests import binaries
import hypernet
from benchmarks import hypernet as bench
from benchmarks import tables
from benchmarks.common import UsageError
from tff_silo.privacy.user_level import UserDPSettings

FLAGS = flags.FLAGS


def _run(*args):
  return binaries.run("hypernet", *args)


@pytest.fixture(autouse=True)
def _parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()


@pytest.mark.parametrize("overrides, message", [
    (dict(sampling_rates=["0"]), "--sampling_rates must be in (0, 1]; got 0"),
    (dict(sampling_rates=["1.5"]), "--sampling_rates must be in (0, 1]; got 1.5"),
    (dict(clips=["0"]), "--clips must be > 0; got 0"),
    (dict(clips=["0.1"], noise_multipliers=["-1"]),
     "--noise_multipliers must be >= 0; got -1"),
    (dict(noise_multipliers=["5"]), "--noise_multipliers > 0 needs --clips"),
    (dict(weight_cap=0.0), "weight_cap (w_hat) must be a positive"),
    (dict(public_user_sizes=True), "--public_user_sizes applies with --weight_cap"),
    (dict(sampling_rates=["a"]), "--sampling_rates must be a comma-separated list"),
    (dict(methods=["sgd"]), "--methods must be among"),
    (dict(dataset="mnist"), "--dataset must be one of"),
    (dict(dataset="fmnist"), "--dataset=fmnist needs --data_dir (the folder with "
                             "Fashion-MNIST's IDX files)"),
    (dict(rounds=0), "--rounds must be >= 1"),
    (dict(channels=["4"]), "--channels must be two positive integers"),
    (dict(backend="xla"), "--backend must be one of"),
    (dict(backend="tff", device="gpu"), "--device=gpu needs the vectorized backend"),
    (dict(backend="tff", xla=True), "--xla compiles the vectorized backend's rounds"),
])
def test_bad_flags_raise_usage_errors(overrides, message):
  with flagsaver.flagsaver(**overrides):
    with pytest.raises(UsageError) as error:
      bench.Settings.from_flags()
  assert message in str(error.value)


def test_fashion_mnist_users_are_label_skewed_from_the_folder(tmp_path, idx_files):
  """--dataset=fmnist: the IDX files' train and test images pooled and dealt to
  label-skewed users, as the recipe a saved run stores rebuilds them."""
  import numpy as np
  from benchmarks import datasets
  idx_files[0](tmp_path, n_train=400, n_test=100)
  s = _settings(dataset="fmnist", data_dir=str(tmp_path), num_users=10,
                classes_per_user=3, methods=["hypernet"], output=str(tmp_path / "hn.csv"))
  users = bench._users(0, s)
  assert users.num_silos == 10 and users.feature_shape == (28, 28, 1)
  sizes = [len(y) + len(t) for y, t in zip(users.y_train, users.y_test)]
  assert sum(sizes) == 500
  for y, t in zip(users.y_train, users.y_test):
    assert len(np.unique(np.concatenate([y, t]))) <= 3
  again = datasets.load(bench._recipe(0, s))[0]
  for a, b in zip(users.x_train, again.x_train):
    np.testing.assert_array_equal(a, b)


def _settings(**overrides):
  with flagsaver.flagsaver(**overrides):
    return bench.Settings.from_flags()


def test_a_noise_the_integer_grid_cannot_draw_is_refused_before_any_run(tmp_path):
  """z sqrt(P) / (2 SIGMA) must stay at most 0.5: z = 20 over the default digits
  hypernetwork (P = 1,405,906: 0.72) is refused naming the flag and P; a network
  small enough (hidden width 2) takes it."""
  grid = dict(methods=["hypernet"], clips=["0.1"], noise_multipliers=["1", "20"],
              output=str(tmp_path / "hn.csv"))
  s = _settings(**grid)
  with pytest.raises(UsageError) as error:
    bench._check_noise(bench._users(0, s), s)
  assert str(error.value).startswith("--noise_multipliers: a noise multiplier of 20.0")
  assert "P = 1,405,906 weights" in str(error.value)
  small = _settings(**grid, hidden_width=2, channels=["4", "8"], dense=16)
  bench._check_noise(bench._users(0, small), small)


@pytest.mark.cli
def test_bad_input_ends_in_one_line():
  done = _run("--sampling_rates=1.5")
  assert done.returncode == 2
  assert done.stderr.strip() == "error: --sampling_rates must be in (0, 1]; got 1.5"


@pytest.mark.cli
def test_a_user_without_data_ends_in_one_line():
  done = _run("--num_users=1000", "--methods=hypernet")
  assert done.returncode == 2
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and "use fewer users" in lines[0]


@pytest.mark.cli
@pytest.mark.slow
def test_a_bundle_imports_the_rows_pjrt_writes(tmp_path):
  """--export_xla records the runs' rounds (no row), the standalone runner replays
  them in another process, --import_xla writes the rows of --device=xla_cpu but the
  times; --device_memory adds the largest program's estimate to the latter."""
  small = ["--rounds=2", "--num_users=6", "--sampling_rates=0.5", "--clips=0.1",
           "--noise_multipliers=2", "--channels=4,8", "--dense=8", "--hidden_width=8",
           "--local_steps=2", "--public_user_count=6", "--eval_every=1"]
  pjrt, out, bundle = tmp_path / "pjrt.csv", tmp_path / "hn.csv", tmp_path / "bundle"
  done = _run(*small, "--device=xla_cpu", "--device_memory", f"--output={pjrt}")
  assert done.returncode == 0, done.stderr[-2000:]
  exported, done = binaries.through_bundle("hypernet", *small, f"--output={out}",
                                           rows=out, bundle=bundle)
  assert "bundle of 2 run(s) written" in exported.stdout
  assert done.returncode == 0, done.stderr[-2000:]
  imported, pjrt = pd.read_csv(out), pd.read_csv(pjrt)
  assert (pjrt.device_memory_mb > 0).all() and (imported.device == "xla_cpu").all()
  pjrt = pjrt.drop(columns="device_memory_mb").assign(   # (jaxlib 0.4 reports none)
      outside_guarantee_columns=pjrt.outside_guarantee_columns.str.replace(
          " device_memory_mb", ""))
  timing = ["wall_seconds", "seconds_per_round_median", "peak_memory_mb", "finished",
            "flags"]
  pd.testing.assert_frame_equal(imported.drop(columns=timing), pjrt.drop(columns=timing))


@pytest.mark.cli
@pytest.mark.slow
def test_tiny_grid_writes_rows_with_the_accounted_epsilon(tmp_path):
  out = tmp_path / "hn.csv"
  done = _run("--rounds=2", "--num_users=6", "--sampling_rates=0.5",
              "--clips=0.1", "--noise_multipliers=0,2", "--channels=4,8",
              "--dense=8", "--hidden_width=8", "--local_steps=2", f"--output={out}",
              "--public_user_count=6",
              f"--plot={tmp_path / 'grid.png'}", f"--save_models={tmp_path / 'saved'}")
  assert done.returncode == 0, done.stderr[-2000:]
  assert (tmp_path / "grid.png").stat().st_size > 0
  rows = pd.read_csv(out)
  assert list(rows.algorithm) == ["hypernet", "hypernet", "fedavg"]
  assert set(rows.backend) == {"vectorized"} and set(rows.device) == {"cpu"}
  assert (rows.peak_memory_mb > 0).all()
  noisy = rows[rows.noise_multiplier == 2].iloc[0]
  expected = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1,
                            noise_multiplier=2.0).epsilon(2, 1e-5,
                                                          noisy.hypernet_parameters)
  assert noisy.epsilon == pytest.approx(expected, rel=1e-9)
  assert noisy.sigma == pytest.approx(2.0 * 0.1 / (0.5 * 6), rel=1e-6)
  # a round's signal-to-noise bound, q W / (z sqrt(P)) without a weight cap
  snr = tables.signal_to_noise(rows)
  assert snr[1] == pytest.approx(0.5 * 6 / (2 * math.sqrt(noisy.hypernet_parameters)))
  assert math.isinf(snr[0]) and math.isnan(snr[2])
  assert "signal_to_noise" in done.stdout
  users = bench._users(0, _settings(num_users=6, output=str(out)))
  majority = bench._majority_accuracy(users)
  assert 0.1 < majority <= 1   # two classes a user: far above one class in ten
  assert f"most frequent training class scores {majority:.4f}" in done.stdout
  assert math.isinf(rows.epsilon[0]) and math.isinf(rows.epsilon[2])
  assert len(json.loads(noisy.user_accuracy)) == 6
  # the accuracies come from each user's un-noised embedding: outside the guarantee
  assert not noisy.accuracy_inside_guarantee and "embeddings" in noisy.guarantee_covers
  assert noisy.public_user_count == 6 and pd.isna(rows.public_user_count[2])
  assert pd.isna(rows.accuracy_inside_guarantee[0])   # no noise: no guarantee at all
  assert "test_accuracy" in done.stdout and "rows appended" in done.stdout
  again = _run("--rounds=2", "--num_users=6", "--sampling_rates=0.5",
               "--clips=0.1", "--noise_multipliers=0,2", "--channels=4,8",
               "--dense=8", "--hidden_width=8", "--local_steps=2", f"--output={out}",
               "--public_user_count=6")
  assert again.returncode == 0 and "skipped" in again.stderr
  assert len(pd.read_csv(out)) == 3
  _check_saved(rows, expected)


def _check_saved(rows, epsilon):
  """The saved runs: the hypernetwork regenerates every user's model, the noisy
  one carries its user-level epsilon, FedAvg's global model is every user's."""
  import numpy as np
  from tff_silo import runs
  noisy = runs.load(rows.saved_to[1])
  assert noisy.meta["privacy"]["unit"] == "user"
  assert "hypernetwork/embeddings" in noisy.meta["privacy"]["outside"]
  assert noisy.meta["privacy"]["covers"].startswith("the noised aggregates and")
  assert noisy.meta["privacy"]["epsilon_spent"] == pytest.approx([epsilon] * 6)
  network, phi, embeddings = hypernet.from_saved_run(noisy)
  for u in range(6):
    for ours, theirs in zip(network.generate(phi, embeddings[u]), noisy.silo_weights[u]):
      np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-5, atol=1e-6)
  fedavg = runs.load(rows.saved_to[2])
  assert fedavg.meta["privacy"] is None and len(fedavg.server_weights) == 1
  for ours, theirs in zip(fedavg.server_weights[0], fedavg.silo_weights[5]):
    assert np.array_equal(ours, theirs)
  attacked = binaries.run("attacks", f"--run={rows.saved_to[1]}", "--parts=membership",
                          f"--mia_output={os.path.dirname(rows.saved_to[1])}/m.csv")
  assert attacked.returncode == 0, attacked.stderr[-2000:]
  pooled = pd.read_csv(f"{os.path.dirname(rows.saved_to[1])}/m.csv").iloc[-1]
  assert pooled.privacy_unit == "user" and pooled.algorithm == "hypernet"
  assert pooled.epsilon_spent == pytest.approx(epsilon)
