"""`python -m benchmarks.pandemic`: bad flags end in one line; a tiny generated
profile runs end to end, writes rows and figures, and a rerun resumes."""

import math
import os

import numpy as np
import pandas as pd
import pytest

from tests import binaries

pytestmark = pytest.mark.cli   # every test here starts a binary


def _run(*args):
  return binaries.run("pandemic", *args, timeout=900)


@pytest.mark.parametrize("args, message", [
    (["--profile=huge"], "error: --profile must be one of"),
    (["--methods=sgd"], "error: --methods must be among"),
    (["--modes=fast"], "error: --modes must be among"),
    (["--feature_sets=contact"], "error: --feature_sets must be among"),
    (["--noise_multipliers=-1"], "error: --noise_multipliers must be >= 0; got -1"),
    (["--alphas=1.5"], "error: --alphas must be in (0, 1)"),
    (["--lr=inf"], "error: --lr must be a finite number"),   # run_main, every binary
    (["--data_dir=/nonexistent"], "error: --data_dir /nonexistent is not a directory"),
    (["--region_transmission=1,2"], "error: --region_transmission must give 3 factors"),
    (["--region_home_weight=1,0,1"], "error: --region_home_weight must be in (0, 100]; "
     "got 1,0,1"),
    (["--region_transmission=1e300,1,1"], "error: --region_transmission must be in "
     "(0, 100]"),
    (["--shards=-1"], "error: --shards must be in [0, 4096]; got -1"),
    (["--shards=2", "--backend=tff"], "error: --shards runs on the vectorized backend, "
     "not --backend=tff"),
    (["--shards=2", "--gradient_norms"], "error: --gradient_norms reads every silo in "
     "this process"),
    (["--gradient_norms", "--noise_multipliers=1"], "error: --gradient_norms trains "
     "without DP (thesis Fig. 2.9): drop --noise_multipliers"),
    (["--degree_figure", "--gradient_norms"], "error: --degree_figure draws Fig. 2.8 "
     "from the accountant alone: drop --gradient_norms"),
    (["--degree_figure", "--shards=2"], "error: --degree_figure draws Fig. 2.8 from the "
     "accountant alone: drop --shards"),
    (["--degree_figure", "--figures_dir=/proc/x"], "error: --figures_dir "),
    (["--generated_dir=/proc/1/x"], "error: --generated_dir /proc/1/x: /proc/1 is not a "
                                    "writable folder"),   # P19, P20: after the work
    (["--generate_only", "--epsilon_table"], "error: --generate_only generates "
     "--profile and runs nothing: drop --epsilon_table"),
    (["--generate_only", "--data_dir=/tmp"], "error: --generate_only generates "
     "--profile and runs nothing: drop --data_dir"),
])
def test_bad_flags_end_in_one_line(args, message):
  done = _run(*args)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines()[-1].startswith(message), done.stderr
  assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_tiny_profile_runs_end_to_end(tmp_path):
  """(The tiny profile's smallest silos are one batch: every example a node's
  replacement changes is in it, so a noise small against that shift has no finite
  epsilon, and the row says so.)"""
  args = ["--profile=tiny", "--final_week_rate=0.01", "--methods=mrmtl,centralized",
          "--noise_multipliers=0,8", f"--output_dir={tmp_path}"]
  done = _run(*args)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = pd.read_csv(tmp_path / "pandemic.csv")
  assert list(rows.method) == ["mrmtl", "mrmtl", "centralized", "centralized"]
  assert (rows.persons == 2000).all() and rows.average_precision.between(0, 1).all()
  private = rows[rows.sigma == 8]
  assert np.isfinite(private.epsilon_theorem).all() and (
      private.epsilon_code < private.epsilon_theorem).all()
  assert private.guarantee.str.startswith("node-level").all()
  # the unit it names, the capping outside it, delta well below 1/n, held-out scores
  assert private.guarantee.str.contains("degree-capped graph").all()
  assert private.guarantee.str.contains("lies outside it").all()
  assert (rows.delta_rule == "1/(10 n)").all() and (rows.node_examples == 41).all()
  assert (rows.scored_on == "held-out households").all()
  assert (rows.scored < 0.35 * rows.persons).all()
  assert list(private.noise_multiplier) == [8.0, 8.0]   # the noise given
  # every output in --output_dir
  assert set(os.listdir(tmp_path)) == {"pandemic.csv", "pandemic_data",
                                       "pandemic_ap_epsilon.png", "pandemic_time.png"}
  for name in ("pandemic_ap_epsilon.png", "pandemic_time.png"):
    assert (tmp_path / name).stat().st_size > 0
  again = _run(*args)
  assert again.returncode == 0 and again.stderr.count("skipped") == 4
  assert len(pd.read_csv(tmp_path / "pandemic.csv")) == 4
  small = _run(*args[:3], "--noise_multipliers=2", *args[4:])
  assert small.returncode == 0, small.stderr[-2000:]
  rows = pd.read_csv(tmp_path / "pandemic.csv")
  row = rows[(rows.sigma == 2) & (rows.method == "mrmtl")].iloc[0]
  assert math.isinf(row.epsilon_theorem)
  assert row.guarantee.startswith("none: no finite node-level epsilon")
  # Table 2.3's ablation: new keys for fewer groups, the full set's keys unchanged
  ablated = _run(*args[:3], "--noise_multipliers=0", "--feature_sets=node", *args[4:])
  assert ablated.returncode == 0, ablated.stderr[-2000:]
  rows = pd.read_csv(tmp_path / "pandemic.csv")
  assert list(rows.feature_set) == ["node+contact+location"] * 6 + ["node"] * 2
  assert rows.run_key.str.contains('"feature_set": "node"').sum() == 2
  assert not rows.run_key.str.contains("node+contact", regex=False).any()


@pytest.mark.slow
def test_a_bundle_imports_the_rows_pjrt_writes(tmp_path):
  """--export_xla records the runs' rounds (no row, nothing scored), the standalone
  runner replays them in another process, --import_xla scores them and writes the
  rows of --device=xla_cpu but the times (the export wrote no row before)."""
  args = ["--profile=tiny", "--final_week_rate=0.01", "--methods=mrmtl",
          "--noise_multipliers=8", "--rounds=2", f"--generated_dir={tmp_path / 'data'}",
          f"--figures_dir={tmp_path}"]
  pjrt, out, bundle = tmp_path / "pjrt.csv", tmp_path / "p.csv", tmp_path / "bundle"
  done = _run(*args, "--device=xla_cpu", f"--output={pjrt}")
  assert done.returncode == 0, done.stderr[-2000:]
  exported, done = binaries.through_bundle("pandemic", *args, f"--output={out}",
                                           rows=out, bundle=bundle, timeout=900)
  assert "bundle of 1 run(s) written" in exported.stdout
  assert done.returncode == 0, done.stderr[-2000:]
  timing = ["train_seconds", "load_seconds", "peak_memory_mb", "finished"]
  imported, pjrt = pd.read_csv(out), pd.read_csv(pjrt)
  assert imported.average_precision.between(0, 1).all()
  pd.testing.assert_frame_equal(imported.drop(columns=timing), pjrt.drop(columns=timing))


def test_generate_only_writes_the_profile_and_no_row(tmp_path):
  """The profile's folder, printed, and nothing else under the output folder; a
  second call finds it and generates nothing."""
  args = ["--profile=tiny", "--generate_only", f"--output_dir={tmp_path}"]
  done = _run(*args)
  assert done.returncode == 0, done.stderr[-2000:]
  folder = done.stdout.strip().splitlines()[-1]
  assert os.path.isfile(os.path.join(folder, "synthetic_meta.json"))
  assert os.listdir(tmp_path) == ["pandemic_data"] and "generating" in done.stderr
  again = _run(*args)
  assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == folder
  assert "generating" not in again.stderr


def test_the_degree_figure_is_fig_2_8_from_the_accountant(tmp_path):
  """Fig. 2.8 without data: the figure and its CSV; the authors' exponent gives
  the stand-in values of ../shared/PANDEMIC.md (computed there with numpy/scipy:
  12.4, 47 and 203 at sigma 1, S = 1, 21, 101; 0.853 at sigma 10, S = 1), and
  the printed theorem's exponent (4x the authors') at sigma equals the authors' at
  sigma / 2."""
  done = _run("--degree_figure", f"--figures_dir={tmp_path}")
  assert done.returncode == 0, done.stderr
  assert os.path.getsize(tmp_path / "pandemic_degree.png") > 0
  df = pd.read_csv(tmp_path / "pandemic_degree.csv")
  eps = df.set_index(["neighbouring", "sigma", "max_neighbourhoods"]).epsilon
  for sigma, s, want in ((1.0, 1, 12.4), (1.0, 21, 47.0), (1.0, 101, 203.0),
                         (10.0, 1, 0.853)):
    assert eps["add_remove", sigma, s] == pytest.approx(want, rel=0.01)
  for sigma in (1.0, 2.0, 10.0):
    for s in (1, 10, 51):
      assert eps["replace_one", sigma, s] == pytest.approx(
          eps["add_remove", sigma / 2, s], rel=1e-9)


def test_the_gradient_norm_figure_is_fig_2_9(tmp_path):
  """Fig. 2.9 on the tiny profile: the figure and the shares below C / 5 and C per
  model and label, labelled outside any guarantee; no training rows."""
  done = _run("--profile=tiny", "--final_week_rate=0.01", "--gradient_norms",
              "--clip=5", f"--output_dir={tmp_path}", f"--figures_dir={tmp_path}")
  assert done.returncode == 0, done.stderr[-3000:]
  assert os.path.getsize(tmp_path / "pandemic_gradient_norms.png") > 0
  assert not (tmp_path / "pandemic.csv").exists()
  df = pd.read_csv(tmp_path / "pandemic_gradient_norms.csv")
  assert set(zip(df.model, df.label.astype(str))) == {
      (m, l) for m in ("initial", "trained") for l in ("0.0", "1.0", "all")}
  assert (df.below_clip_5 <= df.below_clip).all() and df.below_clip.between(0, 1).all()
  every = df[df.label.astype(str) == "all"].set_index("model").examples
  assert every["initial"] == every["trained"] == df[df.label.astype(str) != "all"].groupby(
      "model").examples.sum()["initial"]
  assert df.guarantee.str.startswith("none").all() and (df["clip"] == 5).all()
