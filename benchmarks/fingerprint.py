"""The rows of fixed commands, without their measured columns: a refactoring of the
binaries keeps every row the same when this prints the same digests before and
after (issue 54).

    uv run python -m benchmarks.fingerprint --write=/tmp/before.json   # at the old code
    uv run python -m benchmarks.fingerprint --write=/tmp/after.json    # at the new
    diff /tmp/before.json /tmp/after.json

Each command runs in a fresh process writing under a temporary folder, whose path
is written `OUT` in the rows (the saved-models folders, the ledger's file).
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))

# (name, binary, flags): small runs that reach many settings of each binary.
COMMANDS = (
    ("run-digits", "run", ["--rounds=3"]),
    ("run-school-dp", "run", [
        "--dataset=school", f"--data_dir={SHARED_DATA}", "--epsilon=2", "--rounds=4",
        "--methods=mrmtl,ditto,finetune,fedavg", "--lams=0.1,1", "--seeds=0,1",
        "--ledger_csv=OUT/ledger.csv"]),
    ("run-ifca-pld", "run", [
        "--dataset=school", f"--data_dir={SHARED_DATA}", "--epsilon=4", "--rounds=4",
        "--methods=ifca,ifca_finetune", "--num_clusters=2", "--accountant=pld",
        "--noise=idealized", "--selection_fraction=0.5"]),
    ("run-dprivate", "run", [
        "--dataset=two_cluster", "--methods=dprivate_clustering", "--nu=5",
        "--clients_per_round=7", "--patience=3", "--rounds=4", "--leakage_cap=50"]),
    ("run-standardize-replace", "run", [
        "--dataset=school", f"--data_dir={SHARED_DATA}", "--methods=mrmtl",
        "--epsilon=3", "--standardize=dp", "--standardize_clip=5", "--rounds=3",
        "--neighbouring=replace_one", "--outside_guarantee_metrics"]),
    ("run-corrupt-unweighted", "run", [
        "--dataset=school", f"--data_dir={SHARED_DATA}", "--methods=local,fedavg",
        "--corrupt_silos=2", "--rounds=3", "--aggregator=unweighted_mean"]),
    ("run-paper-saved", "run", [
        "--dataset=school", f"--data_dir={SHARED_DATA}", "--methods=mrmtl",
        "--protocol=paper", "--epsilon=2", "--rounds=3",
        "--save_models=OUT/models"]),
    ("run-digits-finetune", "run", [
        "--methods=finetune", "--mask_probability=0.2", "--rounds=2",
        "--finetune_fraction=0.25", "--epsilon=5", "--seeds=3"]),
    ("hypernet-digits", "hypernet", ["--rounds=2", "--num_users=8"]),
    ("hypernet-dp-saved", "hypernet", [
        "--methods=hypernet", "--rounds=2", "--num_users=8", "--sampling_rates=0.5",
        "--clips=1", "--noise_multipliers=0,1", "--weight_cap=10",
        "--public_user_sizes", "--seeds=1", "--local_steps=2", "--embedding_dim=3",
        "--channels=4,8", "--dense=16", "--save_models=OUT/models",
        "--public_user_count=8"]),
    ("hypernet-fedavg", "hypernet", [
        "--methods=fedavg", "--fedavg_local_epochs=2", "--rounds=2", "--num_users=6",
        "--classes_per_user=3", "--lr=0.1", "--batch_size=8"]),
    ("pandemic-tiny", "pandemic", [
        "--profile=tiny", "--final_week_rate=0.01", "--methods=mrmtl,local",
        "--noise_multipliers=0,8", "--rounds=2", "--generated_dir=OUT/gen",
        "--lams=0.001,0.01", "--alphas=0.5", "--sample_sizes=10"]),
    ("attacks-inversion", "attacks", [
        "--parts=inversion", "--images=2", "--iterations=5", "--image_size=8",
        "--defenses=none,laplace,dp_sgd", "--nus=1", "--noise_multipliers=0.1",
        "--methods=idlg", "--figure_images=2", "--figures_dir=OUT/figures"]),
    ("attacks-membership", "attacks", [
        "--parts=membership", "--mia_rounds=2", "--mia_methods=local,mrmtl",
        "--mia_epsilons=inf,2", "--mia_lam=0.5"]),
    ("tuning-cost", "tuning_cost", [
        "--monte_carlo_trials=20", "--num_lambdas=5", "--etas=0,1", "--tau=0.1"]),
    ("audit-quick", "audit", [
        "--methods=local,mrmtl", "--canaries=20", "--guesses=5", "--rounds=2",
        "--lam=0.5", "--mutations=noise_div4"]),
    ("compare-quick", "compare", [
        "--preset=quick", "--methods=mrmtl,fedavg,ifca", "--epsilons=1,inf", "--seeds=0",
        "--rounds=2", "--lams=0.1,1", "--lrs=0.1", "--batch_size=8",
        "--validation_fraction=0.3"]),
)
# Columns that differ between two runs of one command (attacks' `seconds` too).
VARYING = (*common.MEASURED_COLUMNS, "finished", "seconds")

flags.DEFINE_string("write", None, "Write the rows, normalized, to this JSON file.")
flags.DEFINE_list("only", None, "Run only these commands (by name).")
FLAGS = flags.FLAGS


def rows_of(binary: str, args: list) -> dict:
  """{file name: {"columns": in order, "rows": sorted}} of every CSV the command
  wrote, its measured columns dropped."""
  import pandas as pd
  with tempfile.TemporaryDirectory() as out:
    args = [a.replace("OUT", out) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{binary}", f"--output_dir={out}", *args],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode:
      raise RuntimeError(f"{binary} {' '.join(args)}: {done.stderr[-2000:]}")
    written = {}
    for folder, _, files in os.walk(out):
      for name in sorted(files):
        if name.endswith(".csv"):
          table = pd.read_csv(os.path.join(folder, name), dtype=str,
                              keep_default_na=False)
          table = table.drop(columns=[c for c in VARYING if c in table.columns])
          rows = [json.loads(json.dumps(row).replace(out, "OUT"))
                  for row in table.to_dict("records")]
          written[os.path.relpath(os.path.join(folder, name), out)] = dict(
              columns=list(table.columns),
              rows=sorted(rows, key=lambda row: json.dumps(row, sort_keys=True)))
    return written


def main(argv):
  del argv
  names = FLAGS.only or [name for name, _, _ in COMMANDS]
  every = {}
  for name, binary, args in COMMANDS:
    if name not in names:
      continue
    every[name] = rows_of(binary, args)
    digest = hashlib.sha256(json.dumps(every[name], sort_keys=True).encode())
    counts = ", ".join(f"{f}: {len(t['rows'])}" for f, t in every[name].items())
    print(f"{name}: {digest.hexdigest()[:16]} ({counts})", flush=True)
  if FLAGS.write:
    with open(FLAGS.write, "w") as f:
      json.dump(every, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  app.run(main)
