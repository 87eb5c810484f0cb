r"""Attacks against each defense: gradient inversion and membership inference.

Inversion (Galli et al. sec. 5.3): the sigmoid LeNet (weights uniform in
(-0.5, 0.5)) at initialization; each attacked image is one client's batch of size 1
and one SGD step; the server inverts the update it receives under each defense:

    uv run python -m benchmarks.attacks --parts=inversion

Defaults: 20 digits images upsampled to 32x32, iDLG and DLG with 300 L-BFGS
iterations; defenses none, the Euclidean Laplace mechanism per layer for each
--nus, DP-SGD (clip --clip, each --noise_multipliers) and clipping alone. The attacker
knows the public clip C and clips its dummy gradient alike (--clip_aware). One CSV row
per attacked image and setting (MSE, PSNR, SSIM, label, the privacy spent), a grid of
ground truth vs reconstructions per method and a PSNR/SSIM-vs-noise figure.

Membership inference (thesis sec. 2.5.3): the silo models of local training, FedAvg
and MR-MTL on the rotated & masked digits silos, non-private and with silo-specific
DP-SGD at each --mia_epsilons, attacked with tensorflow-privacy's tools:

    uv run python -m benchmarks.attacks --parts=membership

Each target is trained, saved under --mia_models (`tff_silo.runs`) and attacked
from its files as `--run` attacks any saved run: one row per silo and one
`silo=all` row per model set (AUC, attacker advantage, epsilon spent per silo, the
pooled TPR at 0.1% and 1% FPR, LiRA's with --lira_shadows).

Membership inference against saved runs (`benchmarks.run --save_models=DIR`):

    uv run python -m benchmarks.attacks --run=DIR

attacks every saved run in DIR (or the one DIR is) with --mia_attacks on the silos
rebuilt from the run's data recipe (checked against its fingerprint; --data_dir
replaces the recipe's folder), per silo and pooled, and adds the pooled
loss-threshold attack's TPR at 0.1% and 1% FPR (--lira_shadows=N adds the offline
likelihood-ratio attack); with --parts=inversion it inverts the update silo 0 would
send (one example's step) at round 0 and from the saved model, under the run's own
defense (its DP-SGD clip and silo 0's noise multiplier, or none).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import pandas as pd
from absl import flags

from attacks.choices import DEFENSES, METHODS, MIA_ATTACKS, OPTIMIZERS
from benchmarks import common, configs, datasets, plan, tables
from benchmarks.common import UsageError
from benchmarks.harness import spec

PARTS = ("inversion", "membership")
DATASETS = datasets.taking("images")
READ = datasets.reading("images")   # from --data_dir
MIA_ALGORITHMS = ("local", "fedavg", "mrmtl")
NON_PRIVATE = "inf"
# Columns every row of each CSV has: an existing file without them is refused.
INVERSION_SIGNATURE = ("run_key", "method", "psnr")
MEMBERSHIP_SIGNATURE = ("run_key", "algorithm", "auc")

SPEC = spec.Spec(
    parts=spec.strings(list(PARTS), "Comma-separated, of {choices}.", choices=PARTS),
    dataset=spec.string("digits", "Inversion images, one of {choices}.",
                        choices=DATASETS),
    data_dir=spec.string(None, "; ".join(
        f"{n}: folder holding {datasets.DATASETS[n].files}" for n in READ) + "."),
    image_size=spec.integer(32, "Images are resized to this square size (digits are "
                            "8x8: 8 keeps them as they are).", bounds=">= 1"),
    images=spec.integer(20, "Images attacked (each its own client step).",
                        bounds=">= 1"),
    methods=spec.strings(["idlg", "dlg"], "Comma-separated, of {choices}.",
                         choices=METHODS),
    optimizer=spec.string("lbfgs", "One of {choices}.", choices=OPTIMIZERS),
    iterations=spec.integer(300, "Optimizer iterations per attack.", bounds=">= 1"),
    attack_lr=spec.real(0.1, "Adam's step size (L-BFGS has a line search).",
                        bounds="> 0"),
    batch_size=spec.integer(1, "Examples in the attacked step (dlg only for > 1).",
                            bounds=">= 1"),
    defenses=spec.strings(list(DEFENSES), "Comma-separated, of {choices}.",
                          choices=DEFENSES),
    nus=spec.numbers(["0.001", "0.01", "0.1", "1", "3", "5", "10"], "laplace: "
                     "comma-separated noise multipliers nu.", bounds="> 0"),
    noise_multipliers=spec.numbers(["0.0001", "0.001", "0.003", "0.01", "0.1", "1"],
                                   "dp_sgd: comma-separated noise multipliers z.",
                                   bounds="> 0"),
    clip=spec.real(1.0, "dp_sgd and clip: the per-example L2 clip C.", bounds="> 0"),
    clip_aware=spec.boolean(True, "The attacker clips its dummy gradient to C too."),
    lr=spec.real(0.1, "The client's SGD step size (update = -lr * g).", bounds="> 0"),
    delta=spec.real(1e-5, "delta of the reported dp_sgd epsilon.", bounds="(0, 1)"),
    seed=spec.integer(0, "Seeds the model, the images, the dummies and the noise.",
                      bounds=">= 0"),
    figure_images=spec.integer(8, "Images shown in the reconstruction grids.",
                               bounds=">= 1"),
    mia_methods=spec.strings(list(MIA_ALGORITHMS), "Comma-separated, of {choices}.",
                             choices=MIA_ALGORITHMS),
    mia_epsilons=spec.strings([NON_PRIVATE, "1"], "Per-silo target epsilons of the "
                              f"attacked models; {NON_PRIVATE} = non-private.",
                              bounds="> 0"),
    mia_attacks=spec.strings(["threshold"], "Comma-separated, of {choices}; the best "
                             "AUC is reported.", choices=MIA_ATTACKS),
    mia_rounds=spec.integer(None, "Rounds (default: the digits preset).", bounds=">= 1"),
    mia_lam=spec.real(None, "MR-MTL lambda (default: the digits preset).",
                      bounds=">= 0"),
    mia_test_fraction=spec.real(0.5, "Each silo's held-out share (the non-members).",
                                bounds="(0, 1)"),
    mia_backend=spec.string("vectorized", "Backend training the membership targets: "
                            "vectorized (one TF program for all silos) or tff.",
                            choices=("tff", "vectorized")),
    resume=spec.boolean(True, "Skip runs whose row is already in the CSV."),
    run=spec.string(None, "Attack the saved runs in this folder (or the one it is) "
                    "instead of training new models: membership inference (the default "
                    "--parts here) and, with --parts=inversion, gradient inversion of "
                    "image runs."),
    lira_shadows=spec.integer(0, "Membership: also the offline likelihood-ratio attack "
                              "(attacks.lira) with this many shadow runs, trained as "
                              "the attacked run was on random halves of every silo (0: "
                              "off)."),
    **common.output_group(
        output=("attacks.csv", "Inversion CSV rows are appended to; reconstructions go "
                "to <output>_images/."),
        figures_dir=(".", "Folder for a fresh inversion's attacks_grid_<method>.png and "
                     "attacks_curves.png."),
        mia_output=("membership.csv", "Membership CSV."),
        mia_models=("mia_runs", "Where the fresh membership targets are saved "
                    "(tff_silo.runs) before they are attacked; `--run` attacks them "
                    "again.")),
)
SPEC.define()
common.define_renamed_flags(
    client_lr="lr", figures="figures_dir", method="methods", defense="defenses",
    nu="nus", noise_multiplier="noise_multipliers", mia_algorithm="mia_methods",
    mia_epsilon="mia_epsilons", mia_attack="mia_attacks")

FLAGS = flags.FLAGS


class Settings(SPEC.settings_class("_Fields", ("preset", object), module=__name__)):
  """`benchmarks.attacks`' settings (`SPEC`), checked (`from_flags`): the lists
  parsed (`mia_epsilons` with inf for non-private), `parts` resolved (--run alone:
  membership), `mia_rounds` and `mia_lam` filled from the digits `preset` (the
  membership targets' settings)."""

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags; a UsageError names the first bad one."""
    SPEC.check_choices()
    epsilons = [math.inf if e == NON_PRIVATE else
                spec.parse_items("mia_epsilons", [e], float)[0]
                for e in FLAGS.mia_epsilons]
    spec.check_unique("mia_epsilons", epsilons)
    values = dict(SPEC.values(), nus=SPEC.parsed("nus"), mia_epsilons=tuple(epsilons),
                  noise_multipliers=SPEC.parsed("noise_multipliers"))
    SPEC.check_ranges(values)
    parts = FLAGS.parts
    if FLAGS.run is not None and not FLAGS["parts"].present:
      parts = ["membership"]
    if FLAGS["figures_dir"].present and ("inversion" not in parts
                                        or FLAGS.run is not None):
      raise UsageError("--figures_dir applies to --parts=inversion without --run only: "
                       "membership and saved runs' inversion draw no figure")
    if FLAGS.run is not None:
      for name in ("dataset", "image_size", "defenses", "nus", "noise_multipliers",
                   "clip", "lr"):
        if FLAGS[name].present:
          raise UsageError(f"--{name} sets the inversion of a fresh model; --run attacks "
                           "saved runs with their own data, model, learning rate and "
                           "defense")
      for name in ("mia_methods", "mia_epsilons", "mia_rounds", "mia_lam",
                   "mia_test_fraction", "mia_backend", "mia_models"):
        if FLAGS[name].present:
          raise UsageError(f"--{name} sets how new targets are trained; --run attacks "
                           "saved ones")
      _saved_runs(FLAGS.run)   # a UsageError if there are none
    else:
      common.check_applies("data_dir", READ, [FLAGS.dataset], "--dataset")
      if FLAGS["lira_shadows"].present and "membership" not in parts:
        raise UsageError("--lira_shadows applies to --parts=membership only")
      if not FLAGS.mia_models or os.path.isfile(FLAGS.mia_models):
        raise UsageError(f"--mia_models must name a folder; got {FLAGS.mia_models!r}")
    if FLAGS.lira_shadows < 0 or FLAGS.lira_shadows == 1:
      raise UsageError(f"--lira_shadows must be 0 (off) or >= 2; got "
                       f"{FLAGS.lira_shadows}")
    if FLAGS.batch_size > 1 and "idlg" in FLAGS.methods:
      raise UsageError("--methods=idlg reads one example's label: use --batch_size=1 or "
                       "--methods=dlg")
    if FLAGS.images % FLAGS.batch_size:
      raise UsageError(f"--images ({FLAGS.images}) must be a multiple of --batch_size "
                       f"({FLAGS.batch_size})")
    preset = configs.PRESETS["digits"]
    rounds = preset.rounds if FLAGS.mia_rounds is None else FLAGS.mia_rounds
    lam = preset.lam if FLAGS.mia_lam is None else FLAGS.mia_lam
    if "inversion" in parts:
      common.check_output(FLAGS.output, INVERSION_SIGNATURE)
      if os.path.exists(FLAGS.figures_dir) and not os.path.isdir(FLAGS.figures_dir):
        raise UsageError(f"--figures_dir {FLAGS.figures_dir} is a file; give a folder")
      common.check_figure_path(os.path.join(FLAGS.figures_dir, "attacks_curves.png"),
                               "figures_dir")
    if "membership" in parts:
      common.check_output(FLAGS.mia_output, MEMBERSHIP_SIGNATURE, "mia_output")
    return cls(**dict(values, parts=tuple(parts), mia_rounds=rounds, mia_lam=lam),
               preset=preset)


# --- inversion ----------------------------------------------------------------------

def _images(s):
  """The attacked images and labels: a seeded choice from the dataset, resized."""
  import tensorflow as tf
  from tff_silo import data
  try:
    x, y = datasets.DATASETS[s.dataset].images(s.data_dir)
  except data.DataError as e:
    raise UsageError(str(e)) from None
  num_classes = int(y.max()) + 1
  if s.images > len(y):
    raise UsageError(f"--images must be at most {len(y)} for {s.dataset}")
  pick = np.random.default_rng(s.seed).choice(len(y), s.images, replace=False)
  x, y = x[pick], y[pick].astype(np.int64)
  if x.shape[1:3] != (s.image_size, s.image_size):
    x = tf.clip_by_value(tf.image.resize(x, [s.image_size] * 2), 0.0, 1.0).numpy()
  return x.astype(np.float32), y, num_classes


def _defenses(s):
  from attacks.defenses import Defense
  for name in s.defenses:
    if name == "none":
      yield Defense()
    elif name == "laplace":
      yield from (Defense("laplace", nu=nu) for nu in s.nus)
    elif name == "dp_sgd":
      yield from (Defense("dp_sgd", l2_norm_clip=s.clip, noise_multiplier=z)
                  for z in s.noise_multipliers)
    else:
      yield Defense("clip", l2_norm_clip=s.clip)


def _attack_key(method, defense, batch, s):
  return json.dumps(dict(
      dataset=s.dataset, image_size=s.image_size, images=s.images,
      seed=s.seed, method=method, optimizer=s.optimizer,
      iterations=s.iterations, attack_lr=s.attack_lr,
      batch_size=s.batch_size, batch=batch, defense=defense.name,
      parameter=defense.parameter, l2_norm_clip=defense.l2_norm_clip,
      clip_aware=s.clip_aware, client_lr=s.lr, **_noise(defense)), sort_keys=True)


def _noise(defense):
  """dp_sgd's noise (integer: `dp_sgd.privatize`), for its key and rows."""
  return dict(noise="integer") if defense.name == "dp_sgd" else {}


def _image_path(key, s):
  folder = os.path.splitext(s.output)[0] + "_images"
  return os.path.join(folder, hashlib.sha1(key.encode()).hexdigest()[:16] + ".npy")


def _attack_rows(s, model, x, y, method, defense, batch, learning_rate=None,
                 saved=None):
  """Attacks batch `batch` under `defense`: one row per image of the batch. `saved`
  (columns naming a saved run's model) replaces the dataset's columns in the key."""
  from attacks import defenses, dlg, metrics, models
  learning_rate = s.lr if learning_rate is None else learning_rate
  lo = batch * s.batch_size
  xb, yb = x[lo:lo + s.batch_size], y[lo:lo + s.batch_size]
  start = time.perf_counter()
  update = defenses.observed_update(model, xb, yb, learning_rate=learning_rate,
                                    defense=defense, seed=(s.seed, batch))
  clip = defense.l2_norm_clip if s.clip_aware else None
  result = dlg.reconstruct(
      model, models.gradients_from_update(update, learning_rate), method=method,
      optimizer=s.optimizer, iterations=s.iterations, seed=s.seed,
      batch_size=s.batch_size, learning_rate=s.attack_lr, l2_norm_clip=clip)
  seconds = time.perf_counter() - start
  scores = metrics.score(xb, yb, result.images, result.labels)
  images, labels = result.images[scores.order], result.labels[scores.order]
  key = _attack_key(method, defense, batch, s)
  if saved is not None:
    key = json.dumps(dict(json.loads(key), **saved, client_lr=learning_rate),
                     sort_keys=True)
  path = _image_path(key, s)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  np.save(path, images)
  common_columns = dict(
      dataset=s.dataset, image_size=s.image_size, method=method,
      optimizer=s.optimizer, iterations=s.iterations,
      iterations_run=len(result.loss_curve) - 1, batch_size=s.batch_size,
      defense=defense.name, parameter=defense.parameter,
      l2_norm_clip=defense.l2_norm_clip, noise_multiplier=defense.noise_multiplier,
      nu=defense.nu, clip_aware=s.clip_aware, client_lr=learning_rate,
      epsilon=defense.epsilon(s.delta, model), delta=s.delta, **_noise(defense),
      leakage=defense.leakage(model), final_matching_loss=float(result.loss_curve[-1]),
      seconds=seconds, seed=s.seed, batch=batch, images_file=path, run_key=key)
  common_columns.update(saved or {})
  return [dict(image=lo + i, true_label=int(yb[i]), inferred_label=int(labels[i]),
               label_correct=bool(labels[i] == yb[i]), mse=float(scores.mse[i]),
               psnr=float(scores.psnr[i]), ssim=float(scores.ssim[i]), **common_columns)
          for i in range(len(yb))]


def _run_inversion(s):
  from attacks import models
  x, y, num_classes = _images(s)
  model = models.sigmoid_lenet(x.shape[1:], num_classes, seed=s.seed)
  todo = plan.Plan(
      [plan.Run(_attack_key(m, d, b, s), f"{m} {d.name} {d.parameter:g} batch {b}",
                (m, d, b))
       for m in s.methods for d in _defenses(s)
       for b in range(s.images // s.batch_size)],
      output=s.output, signature=INVERSION_SIGNATURE, resume=s.resume)
  todo.execute(lambda batch, _: [_attack_rows(s, model, x, y, *run.spec)
                                 for run in batch],
               summary=lambda rows: f"PSNR {rows[0]['psnr']:.1f} SSIM "
               f"{rows[0]['ssim']:.3f} label "
               f"{'ok' if rows[0]['label_correct'] else 'wrong'} ({rows[0]['seconds']:.1f} s)")
  df = pd.read_csv(s.output)
  df = df[df.run_key.isin({run.key for run in todo.runs})]
  _print_inversion(df)
  from benchmarks import plots
  for method in s.methods:
    path = os.path.join(s.figures_dir, f"attacks_grid_{method}.png")
    plots.reconstruction_grid(df[df.method == method], x, y, s.figure_images,
                              f"{method.upper()} ({s.optimizer}, "
                              f"{s.iterations} iterations)", path)
    print(f"wrote {path}")
  path = os.path.join(s.figures_dir, "attacks_curves.png")
  if plots.inversion_curves(df, path):
    print(f"wrote {path}")


def _print_inversion(df):
  print("\nmedian over images:")
  tables.print_frame(tables.inversion_summary(df))


# --- membership inference -----------------------------------------------------------

def _mia_key(algorithm, epsilon, s):
  """The run key of a fresh membership target (what it was trained with)."""
  return json.dumps(dict(
      algorithm=algorithm, epsilon=str(epsilon), rounds=s.mia_rounds,
      lam=s.mia_lam if algorithm == "mrmtl" else None, seed=s.seed,
      test_fraction=s.mia_test_fraction,
      protocol="add_remove" if math.isfinite(epsilon) else None,
      assumed_silo_size=s.preset.assumed_silo_size if math.isfinite(epsilon) else None),
      sort_keys=True)


def _mia_recipe(s) -> dict:
  """The fresh targets' silos (`benchmarks.datasets`): the digits silos with
  --mia_test_fraction of each held out (the non-members)."""
  from tff_silo.data import digits
  return dict(dataset="digits", seed=s.seed,
              mask_probability=digits.MASK_PROBABILITY,
              test_fraction=s.mia_test_fraction)


def _mia_train(algorithm, epsilon, silos, s, progress, folder):
  """Trains a fresh membership target on the vectorized or TFF backend and saves
  it in `folder` (`tff_silo.runs`), as `benchmarks.run --save_models` would."""
  from tff_silo import algorithms, runs, simulation
  from tff_silo.models import model_for
  from tff_silo.privacy import PrivacyProtocol
  preset = s.preset
  private = math.isfinite(epsilon)
  model = model_for(silos)
  settings = dict(name=algorithm, client_learning_rate=preset.lr,
                  batch_size=preset.batch_size, rounds=s.mia_rounds,
                  lam=s.mia_lam if algorithm == "mrmtl" else 0.0,
                  l2_norm_clip=preset.clip if private else None)
  protocol = (PrivacyProtocol(assumed_silo_size=preset.assumed_silo_size)
              if private else None)
  definition = dict(settings)
  result = simulation.run_simulation(
      algorithms.silo_definition(definition.pop("name"), model, silos.feature_shape,
                                 **definition),
      silos, rounds=s.mia_rounds,
      seed=common.run_seed(s.seed, _mia_key(algorithm, epsilon, s)),
      target_epsilon=epsilon if private else None,
      target_delta=preset.delta if private else None, progress=progress,
      protocol=protocol, backend=s.mia_backend)
  runs.save(folder, run_key=_mia_key(algorithm, epsilon, s),
            silo_weights=result.silo_weights, server_weights=result.server_weights,
            model=runs.model_spec(model, silos), data=_mia_recipe(s), silos=silos,
            privacy=result.privacy,
            info=dict(binary="benchmarks.attacks", algorithm=algorithm,
                      lam=settings["lam"] if algorithm == "mrmtl" else None,
                      seed=s.seed, rounds=result.rounds,
                      epsilon=epsilon if private else None,
                      delta=preset.delta if private else None,
                      clip=settings["l2_norm_clip"], lr=preset.lr,
                      batch_size=preset.batch_size, metric=result.metric,
                      test_metric=result.test_metric,
                      training=runs.training_settings(
                          settings, target_epsilon=epsilon if private else None,
                          target_delta=preset.delta if private else None,
                          protocol=protocol)))


def _run_membership(s):
  """Trains each (--mia_methods, --mia_epsilons) target, saves it under
  --mia_models and attacks the saved run as --run does (train, save, attack)."""
  from tff_silo import runs as runs_lib
  silos, _ = datasets.load(_mia_recipe(s))
  todo = plan.Plan(
      [plan.Run(_membership_key(_mia_key(a, e, s), s), f"{a} epsilon={e:g}", (a, e))
       for a in s.mia_methods for e in s.mia_epsilons],
      output=s.mia_output, signature=MEMBERSHIP_SIGNATURE, resume=s.resume,
      flag="mia_output")

  def run_batch(batch, progress):
    (run,) = batch
    algorithm, epsilon = run.spec
    run_key = _mia_key(algorithm, epsilon, s)
    folder = runs_lib.run_folder(s.mia_models, f"{algorithm}-eps{epsilon:g}", run_key)
    if not os.path.isfile(os.path.join(folder, "run.json")):   # else saved, unattacked
      _mia_train(algorithm, epsilon, silos, s, progress, folder)
    saved = runs_lib.load(folder)
    saved.check_data(silos)
    return [_saved_rows(saved, silos, s)]

  todo.execute(run_batch, rounds=s.mia_rounds, summary=lambda rows: f"AUC "
               f"{rows[-1]['auc']:.3f} advantage {rows[-1]['advantage']:.3f}, saved in "
               f"{rows[-1]['saved_run']}")
  df = pd.read_csv(s.mia_output, dtype={"silo": str})
  df = df[df.run_key.isin({run.key for run in todo.runs})]
  per_silo = df[df.silo != "all"].groupby("run_key").auc.agg(
      silo_auc_median="median", silo_auc_max="max")
  overall = df[df.silo == "all"].set_index("run_key").join(per_silo)
  print("\nmembership inference (all: silos pooled, each example scored by its "
        "silo's model):")
  columns = ["algorithm", "target_epsilon", "epsilon_spent", "test_accuracy",
             "train_accuracy", "train_accuracy_outside_guarantee", "auc", "advantage",
             "silo_auc_median", "silo_auc_max", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01",
             "lira_auc", "lira_tpr_at_fpr_0.001", "lira_tpr_at_fpr_0.01"]
  tables.print_frame(overall, columns, number=".3f")


def _saved_runs(path) -> list:
  """The saved run folders --run names (itself, or those directly inside it)."""
  if os.path.isfile(os.path.join(path, "run.json")):
    return [path]
  found = (sorted(os.path.join(path, name) for name in os.listdir(path)
                  if os.path.isfile(os.path.join(path, name, "run.json")))
           if os.path.isdir(path) else [])
  if not found:
    raise UsageError(f"--run {path} holds no saved run (no run.json in it or its "
                     "folders; write them with benchmarks.run --save_models)")
  return found


def _load_saved(folder, s):
  """(the saved run, its silos rebuilt from the recipe and checked)."""
  from tff_silo import runs
  try:
    saved = runs.load(folder)
    recipe = dict(saved.meta["data"])
    if s.data_dir is not None:
      recipe["data_dir"] = s.data_dir
    silos, _ = datasets.load(recipe)
    saved.check_data(silos)
  except ValueError as e:   # DataError too: a file moved, another version
    raise UsageError(f"--run {folder}: {e}") from None
  return saved, silos


def _saved_inversion(s):
  """iDLG / DLG against the update silo 0 would send from a saved run's model, at
  round 0 (the initial weights every silo of the MR-MTL family starts from) and
  after the run's rounds (its saved model), under the run's own defense: DP-SGD with
  its clip and silo 0's noise multiplier (one example's step: the per-example
  signal-to-noise of any batch), or none. Attacked: the first --images training
  images of silo 0 (members)."""
  from attacks.defenses import Defense
  done = common.done_rows(s.output, s.resume, INVERSION_SIGNATURE)
  rows = []
  for folder in _saved_runs(s.run):
    saved, silos = _load_saved(folder, s)
    if saved.meta["model"]["name"] not in ("small_cnn", "lenet"):
      print(f"{folder}: not an image model; no inversion", file=sys.stderr)
      continue
    from tff_silo.models import cnn
    info, privacy = saved.meta["info"], saved.meta["privacy"]
    if privacy and privacy.get("unit") == "user":
      print(f"{folder}: user-level DP noises the aggregate, not one user's update; no "
            "inversion under its defense", file=sys.stderr)
      continue
    x = silos.x_train[0][:s.images]
    y = silos.y_train[0][:s.images].astype(np.int64)
    if len(y) < s.images:
      raise UsageError(f"--images must be at most {len(y)} (silo 0's training images)")
    defense = (Defense("dp_sgd", l2_norm_clip=info["clip"],
                       noise_multiplier=privacy["noise_multipliers"][0])
               if privacy else Defense())
    shape = saved.meta["model"]["feature_shape"]
    stages = [(f"round {info['rounds']}", saved.silo_weights[0])]
    if saved.hypernetwork_weights is None:   # the MR-MTL family starts from init_fn(0)
      stages.insert(0, ("round 0", saved.model().init_fn(0)))
    for stage, weights in stages:
      keras = cnn.to_keras(weights, shape)
      for method in s.methods:
        for batch in range(s.images // s.batch_size):
          columns = dict(saved_run=folder, saved_run_key=saved.meta["run_key"],
                         stage=stage, dataset=saved.meta["data"]["dataset"],
                         image_size=shape[0], epsilon=info["epsilon"],
                         delta=info["delta"])
          key = json.dumps(dict(json.loads(_attack_key(method, defense, batch, s)),
                                **columns, client_lr=info["lr"]), sort_keys=True)
          if key in done:
            rows.append(done[key])
            continue
          part = _attack_rows(s, keras, x, y, method, defense, batch,
                              learning_rate=info["lr"], saved=columns)
          common.append_rows(s.output, part)
          rows += part
          print(f"{folder} {stage} {method} image {batch}: PSNR {part[0]['psnr']:.1f} "
                f"SSIM {part[0]['ssim']:.3f}", file=sys.stderr, flush=True)
  if rows:
    df = pd.DataFrame(rows)
    print("\ngradient inversion of saved runs (mean over images):")
    print(df.groupby(["saved_run", "stage", "method", "defense"], sort=False)[
        ["psnr", "ssim", "label_correct"]].mean().to_string(
            float_format=lambda v: f"{v:.3f}"))


def _membership_key(run_key: str, s) -> str:
  """The membership rows' key of a saved run: its run key and the attack
  settings."""
  return json.dumps(dict(saved_run=run_key,
                         attacks=sorted(s.mia_attacks),
                         lira_shadows=s.lira_shadows, seed=s.seed),
                    sort_keys=True)


def _saved_rows(saved, silos, s):
  """Membership rows of one saved run: per silo, pooled, and TPR at low FPR."""
  from attacks import membership
  from tff_silo.evaluation import SiloEvaluator
  folder = saved.directory
  model = saved.model()
  table = membership.attack_silo_models(model, saved.silo_weights, silos,
                                        attacks=s.mia_attacks)
  pooled = membership.loss_threshold_tpr(model, saved.silo_weights, silos)
  if s.lira_shadows:
    try:
      pooled.update(_lira(saved, model, silos, s))
    except ValueError as e:   # a run that cannot be retrained from its settings
      raise UsageError(f"--lira_shadows: {e}") from None
  info, privacy = saved.meta["info"], saved.meta["privacy"]
  spent = (np.asarray(privacy["epsilon_spent"]) if privacy
           else np.full(silos.num_silos, math.inf))
  key = _membership_key(saved.meta["run_key"], s)
  evaluate = SiloEvaluator(model)
  train, silo_train = evaluate(list(saved.silo_weights), silos.x_train, silos.y_train)
  test, silo_test = evaluate(list(saved.silo_weights), silos.x_test, silos.y_test)
  # the un-noised metric on the members is outside any DP guarantee: named so
  train_column = f"train_{model.metric}" + ("_outside_guarantee" if privacy else "")
  rows = []
  for row in table.to_dict("records"):
    whole = row["silo"] == membership.ALL_SILOS
    silo = None if whole else int(row["silo"])
    rows.append(dict(
        **{f"test_{model.metric}": test if whole else float(silo_test[silo]),
           train_column: train if whole else float(silo_train[silo])},
        algorithm=info.get("algorithm"), saved_run=folder,
        target_epsilon=info.get("epsilon") or math.inf,
        epsilon_spent=float(spent.max() if whole else spent[silo]),
        delta=(privacy["target_delta"][0] if privacy else math.nan),
        privacy_unit=privacy.get("unit", "example") if privacy else None,
        lam=info.get("lam"), seed=info.get("seed"), run_key=key, **row,
        **({(f"tpr_at_fpr_{k:g}" if isinstance(k, float) else k): v
            for k, v in pooled.items()} if whole else {})))
  return rows


def _lira(saved, model, silos, s) -> dict:
  """The offline LiRA figures of a saved run, from --lira_shadows shadow runs."""
  from attacks import lira
  from tff_silo import simulation
  masks = lira.splits(silos, s.lira_shadows, seed=s.seed)
  runs = [saved.training_run(lira.shadow_silos(silos, m), seed=10_000 + j)
          for j, m in enumerate(masks)]
  rounds = saved.meta["info"]["training"]["definition"]["rounds"]
  print(f"{saved.directory}: training {len(runs)} shadow runs ({rounds} rounds each)",
        file=sys.stderr, flush=True)
  results = simulation.run_simulations(runs, rounds=rounds,
                                       backend=common.backend_for("auto"))
  scores, members = lira.offline_scores(model, saved.silo_weights, silos,
                                        [r.silo_weights for r in results], masks)
  return {f"lira_{k}": v for k, v in lira.summary(scores, members).items()} | dict(
      lira_shadows=s.lira_shadows)


def _run_saved(s):
  done = common.done_rows(s.mia_output, s.resume, MEMBERSHIP_SIGNATURE,
                          "mia_output")
  folders = _saved_runs(s.run)
  rows = []
  for k, folder in enumerate(folders, 1):
    saved, silos = _load_saved(folder, s)
    key = _membership_key(saved.meta["run_key"], s)
    if key in done:   # its pooled row (the last of its rows): not attacked again
      rows.append(done[key])
      continue
    part = _saved_rows(saved, silos, s)
    common.append_rows(s.mia_output, part)
    rows.append(part[-1])
    print(f"[{k}/{len(folders)}] {folder}: AUC {part[-1]['auc']:.3f}, TPR at 0.1% / 1% "
          f"FPR {part[-1]['tpr_at_fpr_0.001']:.4f} / {part[-1]['tpr_at_fpr_0.01']:.4f}",
          file=sys.stderr, flush=True)
  print("\nmembership inference against saved runs (silos pooled, each example "
        "scored by its silo's model):")
  columns = ["saved_run", "algorithm", "target_epsilon", "epsilon_spent", "auc",
             "advantage", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "lira_auc",
             "lira_tpr_at_fpr_0.001", "lira_tpr_at_fpr_0.01"]
  tables.print_frame(pd.DataFrame(rows), columns, number=".4f")


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = Settings.from_flags()
  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()
  if "inversion" in s.parts and s.run is None:
    _run_inversion(s)
  if s.run is not None:
    if "inversion" in s.parts:
      _saved_inversion(s)
    if "membership" in s.parts:
      _run_saved(s)
  elif "membership" in s.parts:
    _run_membership(s)
  sys.stdout.flush()


if __name__ == "__main__":
  common.run_main(main, check_first=Settings.from_flags)
