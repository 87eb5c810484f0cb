"""`python -m benchmarks.attacks`: one-line errors, and a tiny run of both parts that
writes its rows and figures. Run in a process of their own (`binaries`): its flags
share names with the other benchmark binaries'."""

import os

import pandas as pd
import pytest

from tests import binaries

pytestmark = pytest.mark.cli   # every test here starts a binary


def _run(*args):
  return binaries.run("attacks", *args)


@pytest.mark.parametrize("args, message", [
    (["--iterations=0"], "error: --iterations must be >= 1; got 0"),
    (["--defenses=blur"], "error: --defenses must be among none, dp_sgd, clip, laplace; got blur"),
    (["--methods=idlg", "--batch_size=2", "--images=2"],
     "error: --methods=idlg reads one example's label"),
    (["--run=/nonexistent_runs"], "error: --run /nonexistent_runs holds no saved run"),
    (["--run=/tmp", "--defenses=none"], "error: --defenses sets the inversion of a fresh "
     "model"),
    (["--run=/tmp", "--mia_epsilons=1"], "error: --mia_epsilons sets how new targets"),
    (["--lira_shadows=4", "--parts=inversion"],
     "error: --lira_shadows applies to --parts=membership only"),
    (["--parts=membership", "--figures_dir=/tmp"],
     "error: --figures_dir applies to --parts=inversion without --run only"),
    (["--run=/tmp", "--parts=inversion", "--figures_dir=/tmp"],
     "error: --figures_dir applies to --parts=inversion without --run only"),
    (["--lira_shadows=1"], "error: --lira_shadows must be 0 (off) or >= 2"),
    (["--mia_models="], "error: --mia_models must name a folder"),
])
def test_bad_flags_end_in_one_line(args, message):
  done = _run(*args)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines()[-1].startswith(message)
  assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_saved_runs_are_attacked_from_their_files(tmp_path, monkeypatch):
  """benchmarks.run --save_models, then --run: per-silo and pooled rows with the
  TPR at low FPR, the epsilon each saved silo spent. Another machine's data-check
  key, or none, is one line (RELIABILITY_CASES H01, H02)."""
  saved = tmp_path / "saved"
  trained = binaries.run("run", "--dataset=synthetic", "--methods=local", "--rounds=2",
                         "--epsilon=4", f"--output={tmp_path}/r.csv",
                         f"--save_models={saved}")
  assert trained.returncode == 0, trained.stderr
  done = _run(f"--run={saved}", f"--mia_output={tmp_path}/m.csv", "--lira_shadows=2")
  assert done.returncode == 0, done.stderr
  rows = pd.read_csv(tmp_path / "m.csv", dtype={"silo": str})
  assert len(rows) == 21 and rows.silo.iloc[-1] == "all"
  pooled = rows.iloc[-1]
  assert 0 <= pooled["tpr_at_fpr_0.001"] <= pooled["tpr_at_fpr_0.01"] <= 1
  assert 3.9 < pooled.epsilon_spent <= 4.0 and pooled.algorithm == "local"
  assert 0 <= pooled.lira_auc <= 1 and pooled.lira_shadows == 2
  assert "TPR at 0.1% / 1%" in done.stderr
  again = _run(f"--run={saved}", f"--mia_output={tmp_path}/m.csv", "--lira_shadows=2")
  assert again.returncode == 0, again.stderr
  assert "shadow runs" not in again.stderr   # a finished attack is not redone
  assert len(pd.read_csv(tmp_path / "m.csv")) == 21
  (tmp_path / "other.key").write_bytes(bytes(range(32)))
  for key in ("other.key", "missing/none.key"):
    monkeypatch.setenv("TFF_SILO_DATA_KEY", str(tmp_path / key))
    foreign = binaries.run("attacks", f"--run={saved}", f"--mia_output={tmp_path}/f.csv",
                           fresh=True)   # (a driver keeps the key it started with)
    assert foreign.returncode == 2 and "Traceback" not in foreign.stderr
    assert "data check is keyed by data-check key" in foreign.stderr, foreign.stderr
  weights = next(saved.glob("*/weights.npz"))   # a damaged run: one line naming it
  weights.write_bytes(weights.read_bytes()[:100])
  damaged = _run(f"--run={saved}", f"--mia_output={tmp_path}/m2.csv")
  assert damaged.returncode == 2 and "Traceback" not in damaged.stderr
  assert "weights.npz is damaged" in damaged.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_saved_image_run_is_inverted_at_round_0_and_after_training(tmp_path):
  saved = tmp_path / "saved"
  trained = binaries.run("run", "--dataset=digits", "--methods=local", "--rounds=1",
                         f"--output={tmp_path}/r.csv", f"--save_models={saved}")
  assert trained.returncode == 0, trained.stderr
  done = _run(f"--run={saved}", "--parts=inversion", "--images=1", "--iterations=3",
              "--methods=idlg", f"--output={tmp_path}/inv.csv")
  assert done.returncode == 0, done.stderr
  rows = pd.read_csv(tmp_path / "inv.csv")
  assert list(rows.stage) == ["round 0", "round 1"] and set(rows.defense) == {"none"}
  assert rows.psnr.notna().all() and (rows.dataset == "digits").all()


@pytest.mark.slow
def test_a_tiny_run_writes_rows_figures_and_the_membership_table(tmp_path):
  out = str(tmp_path)
  args = ["--image_size=8", "--images=2", "--iterations=20", "--methods=idlg",
          "--defenses=none,laplace,dp_sgd", "--nus=1", "--noise_multipliers=0.05",
          f"--output_dir={out}", "--mia_rounds=1", "--mia_methods=local",
          "--mia_epsilons=inf,1"]
  done = _run(*args)
  assert done.returncode == 0, done.stderr[-2000:]
  rows = pd.read_csv(f"{out}/attacks.csv")
  assert len(rows) == 2 * 3
  assert set(rows.defense) == {"none", "laplace", "dp_sgd"}
  assert rows.label_correct.all()   # iDLG reads the label even under noise here
  assert rows[rows.defense == "laplace"].leakage.notna().all()
  assert (rows[rows.defense == "dp_sgd"].epsilon < float("inf")).all()
  for name in ("attacks_grid_idlg.png", "attacks_curves.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  mia = pd.read_csv(f"{out}/membership.csv", dtype={"silo": str})
  assert len(mia) == 2 * 41 and (mia.silo == "all").sum() == 2
  private = mia[mia.target_epsilon == 1]
  assert (private.epsilon_spent <= 1.0).all()
  # train, save, attack: each target is a saved run, its rows those of --run
  assert sorted(os.listdir(f"{out}/mia_runs")) == sorted(set(mia.saved_run.map(
      os.path.basename)))
  pooled = mia[mia.silo == "all"]
  assert pooled["tpr_at_fpr_0.01"].between(0, 1).all()
  assert pooled.train_accuracy_outside_guarantee.notna().iloc[1]
  # A rerun resumes: nothing new is appended.
  again = _run(*args)
  assert again.returncode == 0
  assert len(pd.read_csv(f"{out}/attacks.csv")) == 6
  assert len(pd.read_csv(f"{out}/membership.csv")) == 82
