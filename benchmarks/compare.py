"""Compare personalization methods across privacy levels, each tuned on validation
(thesis Fig. 1.3 and G.3; app. B.4).

    uv run python -m benchmarks.compare                      # the `quick` preset
    uv run python -m benchmarks.compare --preset=school --data_dir=../shared/data

For every (method, epsilon, seed) cell the binary trains each configuration of the
grid (--lrs x --lams; lambda only for mrmtl, ditto and ifca_mrmtl) on each silo's
training examples less a validation part carved from them
(`tff_silo.data.validation_split`; the test split is never used to choose), selects
the configuration with the best pooled validation metric and reports the test metric
of that same model. Every method runs silo-specific example-level DP except
`hypernet` (image presets: HyperNetFL's UDP-Alg, each silo a user, one
configuration, `configs.HypernetSettings`), whose epsilon is user-level: the
`privacy_unit` column says which.

--tuning=free (the default) searches the grid in full and selects by the exact
validation metric, as papers report it: the scores are queries of private training
data, so a selected row's epsilon is that of one training run, not of the tuning,
and every row says so (`tuning`); every trial's row is written too. --tuning=private
runs random-repeat tuning (thesis sec. 1.7, app. E; Papernot & Steinke Thm. 2) in
every private cell: h ~ TNB(--tuning_eta, E[h] = --mean_trials) trials, each a grid
configuration drawn at random, trained with its own keys, and scored by each silo's
sum of per-example validation metrics clipped to [0, --score_clip] with Gaussian
noise (multiplier calibrated so that one score alone would spend
--score_budget_share of epsilon); the training noise is calibrated so that
releasing the best trial is (epsilon, delta)-DP for every silo
(`tff_silo.privacy.tuning.calibrate_noise`), and the selected row's `epsilon_spent`
is that total, recomputed from what the trials ran. The theorem covers the best
trial alone, with h hidden: so under private tuning the output, the table, the
figures and --save_models hold the selected trial of each cell and nothing else
(not h, not the trial's index or seed, not the cell's summed time). Each cell's
plan (h and the configurations drawn) comes from 128 bits of OS entropy kept in
`<trials store>.plan_secret` (outside the guarantee, with the trials), not from
the published seeds; the selected rows are written together once every cell is
done, in (method, epsilon, seed) order, not as cells finish, and progress counts
batches, not cells.
--trials_output=PATH also writes every trial's row there, each marked
`outside_guarantee` with `epsilon_if_released`, the epsilon of releasing every
trial of its cell (their composition, h public); without it, finished trials wait
in `<output>.trials.partial.csv` (outside the guarantee as well) only until their
cell is selected, so that a killed run resumes, and the file and the plan secret
go when its cells are done. Non-private cells search the grid in full either way,
and a method with one configuration (local and FedAvg at one learning rate) runs
once, untuned.

--export_xla=DIR writes the pending trials' rounds as a portable bundle instead of
running them, `python -m tff_silo.xla_bundle DIR --platform=gpu` replays it where
jaxlib runs, and the same command with --import_xla=DIR scores, selects and writes
the rows from the replay's models (the rows of --device=xla_cpu; benchmarks/README.md).

--membership also attacks every trial's silo models (`attacks.membership`), so the
selected rows, a second table and a figure show leakage beside utility; the attack
reads the silos' training examples without noise, so its figures lie outside every
guarantee (`mia_inside_guarantee=False`): an evaluator's measurement.

--aggregator (`tff_silo.aggregators`, as in benchmarks.run) replaces the server's
weighted mean in every method but hypernet and mocha (which have none); a DP
aggregator's silo-level epsilon is per trial, in its own columns (not with
--tuning=private, whose accounting does not cover it).

Output: one CSV row per selected cell and, under free tuning, one per trial
(--output, resumable: a rerun skips finished trials and cells), a markdown table
(method x epsilon, mean +- sd over seeds, the selected lambdas) and figures in
--figures_dir (`_private` added under private tuning): `privacy_utility_<preset>.png`
(test metric against epsilon, one line per method, a band over seeds),
`lambda_<preset>.png` (free tuning: the lambda methods' test metric against lambda;
private tuning: the selected models' test metric against the lambda selected; one
panel per epsilon, local and FedAvg as lines) and `leakage_<preset>.png` (membership
AUC against epsilon, with --membership). A row's epsilon covers that row; rows on
the same silos (one seed) compose. On the vectorized backend a method's trials
(every configuration, epsilon and seed) run stacked as one program, in stacks of
`tff_silo.simulation.runs_per_stack` (the hypernetwork's, and any on the TFF
backend, one configuration's trials after another), --concurrent_batches of those
batches at once (threads; rows written in order, the same numbers).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import os
import secrets
import shutil
import sys
import time
from typing import NamedTuple, Optional

from absl import flags
import numpy as np

from benchmarks import common, configs, datasets, executors, grid, plan, tables
from benchmarks.grid import (LAMBDA_METHODS, METHODS, TUNING, TUNING_MODES,
                             TUNING_PRIVATE, UNTUNED)
from benchmarks.common import UsageError
from benchmarks.harness import spec
from tff_silo.algorithms import methods   # no TensorFlow imported
from tff_silo.privacy.pld import ACCOUNTANTS

PRESETS = tuple(configs.COMPARE_PRESETS)
SIGNATURE = ("row_type", "run_key", "method", "test_metric")
# Private tuning: where finished trials wait for their cell's selection (beside
# --output) when --trials_output is not given
PARTIAL_TRIALS = ".trials.partial.csv"
PLAN_SECRET = ".plan_secret"   # beside the trial store (`_plan_secret`)
# ... and their saved models, under --save_models
STAGED_MODELS = ".trials.partial"

MASKED_DATASETS = datasets.taking("compare", masked=True)   # --mask_probability

FLAGS = flags.FLAGS
SPEC = spec.Spec(
    preset=spec.string("quick", "One of {choices}: the grid and settings.",
                       choices=PRESETS),
    data_dir=spec.string(None, "Folder with the preset's files (school.mat; vehicle.mat "
                         "or the Vehicle JSON; Fashion-MNIST's IDX files)."),
    methods=spec.strings(None, "Methods, of {choices} (default: the preset's).",
                         choices=METHODS),
    epsilons=spec.strings(None, "Per-silo epsilons; inf = non-private (default: the "
                          "preset's)."),
    seeds=spec.numbers(None, "Seeds (data split, sampling, noise).", item=int),
    lrs=spec.numbers(None, "Client learning rates tuned over.", bounds="> 0"),
    lams=spec.numbers(None, "Lambdas tuned over (mrmtl, ditto).", bounds="> 0"),
    rounds=spec.integer(None, "Rounds T.", bounds=">= 1"),
    batch_size=spec.integer(None, "Local batch size B.", bounds=">= 1"),
    clip=spec.real(None, "Per-example L2 clip under DP.", bounds="> 0"),
    delta=spec.real(None, "Per-silo delta.", bounds="(0, 1)"),
    validation_fraction=spec.real(None, "Share of each silo's training examples held "
                                  "out to tune on.", bounds="(0, 1)"),
    mask_probability=spec.real(None, "digits, fmnist: the probability of each of a "
                               "silo's white patches (thesis Fig. 1.6: 0, 0.2, 0.4; "
                               "default: the dataset's 0.1).", bounds="[0, 1)"),
    tuning=spec.string("free", "One of {choices} (see the module doc).",
                       choices=TUNING_MODES),
    accountant=spec.string("rdp", "Private cells' accountant: rdp, or pld (privacy loss "
                           "distributions where they express every query of a silo, the "
                           "smaller bound; --tuning=free only, the hypernetwork stays on "
                           "rdp). Rows say which.", choices=ACCOUNTANTS),
    membership=spec.boolean(False, "Also attack every trial's silo models with "
                            "membership inference (attacks.membership, threshold "
                            "attack: each silo's training vs test examples); the "
                            "selected rows and a table and figure of leakage report it "
                            "beside utility."),
    tuning_eta=spec.real(1.0, "--tuning=private: shape eta (> -1) of the truncated "
                         "negative binomial number of trials.", bounds="> -1"),
    mean_trials=spec.real(10.0, "--tuning=private: E[h], trials per cell (> 1).",
                          bounds="(1, 1000]"),
    score_budget_share=spec.real(0.1, "--tuning=private: the share of epsilon one "
                                 "validation score alone would spend (sets its noise).",
                                 bounds="(0, 1)"),
    score_clip=spec.real(None, "--tuning=private: per-example validation metrics are "
                         "clipped to [0, score_clip] (default: the preset's).",
                         bounds="> 0"),
    output=spec.string(None, "CSV rows are appended to (default: "
                       "--output_dir/compare_<preset>.csv)."),
    trials_output=spec.string(None, "--tuning=private: also write every trial's row to "
                              "this CSV, outside the guarantee (each row's "
                              "epsilon_if_released: releasing every trial of its "
                              "cell)."),
    table=spec.string(None, "Markdown table path (default: "
                      "--output_dir/compare_<preset>[_private].md)."),
    concurrent_batches=spec.integer(2, "With --executor=local, on the vectorized "
                                    "backend, how many batches of stacked trials run at "
                                    "once, each in its own thread (rows written in "
                                    "order; the same numbers as one at a time). A round "
                                    "keeps about one core busy, so 2 uses a 2-core "
                                    "machine (1.1x on School's grid, 1.6x on the quick "
                                    "preset) at up to twice the memory. TFF's runtime, "
                                    "and a bundle's export and import, run one batch at "
                                    "a time.", bounds="[1, 64]"),
    **common.backend_group("every method here"),
    **common.aggregator_group(),   # the server step of every method but hypernet
    **common.BUNDLE_GROUP,
    **common.output_group(figures_dir=(".", "Folder of the figures.")),
    **common.save_models_group("every trial (private tuning: every selected trial)"),
)
SPEC.define()


def _settings() -> grid.Settings:
  """The preset with the flags over it, checked; a UsageError in one line."""
  SPEC.check_choices()
  preset = configs.COMPARE_PRESETS[FLAGS.preset]
  s = dict(preset=FLAGS.preset, dataset=preset.dataset)
  s["methods"] = tuple(FLAGS.methods or preset.methods)
  for method in s["methods"]:
    if method in grid.IMAGE_METHODS and not datasets.DATASETS[preset.dataset].image:
      images = ",".join(name for name, p in configs.COMPARE_PRESETS.items()
                        if datasets.DATASETS[p.dataset].image)
      raise UsageError(f"--methods={method} runs on image silos only (--preset="
                       f"{images}); --preset={FLAGS.preset} is not one")
  s["hypernet"] = preset.hypernet
  if FLAGS.epsilons is None:
    s["epsilons"] = preset.epsilons
  else:
    try:
      s["epsilons"] = tuple(float(e) for e in FLAGS.epsilons)
    except ValueError:
      raise UsageError(f"--epsilons must be numbers or inf; got "
                       f"{','.join(FLAGS.epsilons)}") from None
    if not s["epsilons"]:
      raise UsageError("--epsilons must list at least one epsilon (inf: non-private)")
    for epsilon in s["epsilons"]:
      if epsilon != math.inf:
        common.check_epsilon("epsilons", epsilon, "inf runs without DP")
    spec.check_unique("epsilons", s["epsilons"])
  s["seeds"] = tuple(common.parse_seeds(FLAGS.seeds) if FLAGS.seeds else preset.seeds)
  for name in ("lrs", "lams"):
    s[name] = SPEC.parsed(name) or getattr(preset, name)
  for name in ("rounds", "batch_size", "clip", "delta", "validation_fraction"):
    value = FLAGS[name].value
    s[name] = getattr(preset, name) if value is None else value
  SPEC.check_ranges({name: s[name] for name in (
      "lrs", "lams", "rounds", "batch_size", "clip", "delta", "validation_fraction")})
  if FLAGS.mask_probability is not None and preset.dataset not in MASKED_DATASETS:
    raise UsageError(f"--mask_probability applies to the {'/'.join(MASKED_DATASETS)} "
                     f"presets only; --preset={FLAGS.preset} has no masks")
  s["mask_probability"] = FLAGS.mask_probability
  s["assumed_silo_size"] = preset.assumed_silo_size
  s["num_clusters"] = preset.num_clusters
  s["tuning"] = FLAGS.tuning
  s["membership"] = FLAGS.membership
  if FLAGS.accountant == "pld" and FLAGS.tuning == "private":
    raise UsageError("--accountant=pld with --tuning=private: the tuning's bound "
                     "(Papernot & Steinke) is accounted in RDP; use --tuning=free")
  s["accountant"] = FLAGS.accountant
  if FLAGS.tuning == "private":
    if all(epsilon == math.inf for epsilon in s["epsilons"]):
      given = ",".join(FLAGS.epsilons or ["inf"])
      raise UsageError(f"--tuning=private pays for tuning private cells, and --epsilons="
                       f"{given} has none: use --tuning=free")
    s.update(tuning_eta=FLAGS.tuning_eta, mean_trials=FLAGS.mean_trials,
             score_budget_share=FLAGS.score_budget_share,
             score_clip=preset.score_clip if FLAGS.score_clip is None else FLAGS.score_clip)
  else:
    for name in ("tuning_eta", "mean_trials", "score_budget_share", "score_clip"):
      if FLAGS[name].present:
        raise UsageError(f"--{name} applies to --tuning=private only")
  needs = datasets.DATASETS[preset.dataset].files
  if needs and not FLAGS.data_dir:
    raise UsageError(f"--preset={FLAGS.preset} needs --data_dir (the folder with "
                     f"{needs})")
  if not needs and FLAGS.data_dir:
    readers = ",".join(name for name, p in configs.COMPARE_PRESETS.items()
                       if datasets.DATASETS[p.dataset].files)
    raise UsageError(f"--data_dir applies to --preset={readers} only; --preset="
                     f"{FLAGS.preset} makes its data")
  common.check_backend(FLAGS.backend, FLAGS.device, FLAGS.xla)
  common.check_aggregator_flags()
  # (hypernet has no server mean either: it trains without the aggregator, and its
  # rows have no aggregator columns)
  unaggregated = sorted(set(s["methods"]) & set(
      methods.names(kind=methods.SILO_KINDS, aggregated=False)))
  if unaggregated and FLAGS.aggregator != "mean":
    raise UsageError(f"--aggregator={FLAGS.aggregator}: {','.join(unaggregated)} has no "
                     "server mean; run it apart (without --aggregator)")
  if FLAGS.silo_epsilon is not None and FLAGS.tuning == "private":
    raise UsageError(f"--aggregator={FLAGS.aggregator} with --tuning=private: the "
                     "silo-level cost of tuning is not accounted; use --tuning=free")
  # the default mean adds nothing to the run keys (rows written before it existed)
  s["aggregator_key"] = common.aggregator_key(
      FLAGS.aggregator, FLAGS.silo_epsilon, FLAGS.silo_delta, FLAGS.aggregator_clip
  ) if FLAGS.aggregator != "mean" else {}
  s.update(data_dir=FLAGS.data_dir, save_models=FLAGS.save_models,
           figures_dir=FLAGS.figures_dir, trials_output=FLAGS.trials_output,
           backend=FLAGS.backend, device=FLAGS.device, xla=FLAGS.xla,
           concurrent_batches=FLAGS.concurrent_batches, export_xla=FLAGS.export_xla)
  out = common.output_dir()
  s["output"] = FLAGS.output or os.path.join(out, f"compare_{FLAGS.preset}.csv")
  suffix = "" if s["tuning"] == "free" else f"_{s['tuning']}"
  s["table"] = FLAGS.table or os.path.join(out, f"compare_{FLAGS.preset}{suffix}.md")
  common.check_output(s["output"], SIGNATURE)
  common.check_writable(s["table"], "table")
  if FLAGS.trials_output is not None and s["tuning"] != "private":
    raise UsageError("--trials_output applies to --tuning=private only (free tuning "
                     "writes every trial to --output)")
  # where trial rows go: free tuning releases them; private tuning keeps them apart
  s["trials_store"] = (s["output"] if s["tuning"] == "free" else FLAGS.trials_output
                       or os.path.splitext(s["output"])[0] + PARTIAL_TRIALS)
  if s["tuning"] == "private" and (os.path.abspath(s["trials_store"])
                                   == os.path.abspath(s["output"])):
    raise UsageError("--trials_output must differ from --output")
  common.check_output(s["trials_store"], SIGNATURE, "trials_output")
  common.check_save_models()
  s = grid.Settings(**s)
  for name in ("privacy_utility", "lambda", "leakage"):
    common.check_figure_path(_figure(s, name), "figures_dir")
  return s


def _data(s, seed):
  """(the silos a trial trains on, with their test split; validation features and
  labels per silo), loaded once per process (on a Ray worker: from the recipe)."""
  return datasets.cached(datasets.compare_split, grid.recipe(s, seed))


_TRIAL_PRIVACY = {}


def _trial_privacy(s, definition, silos, epsilon):
  """(training epsilon, score noise multiplier) of a private-tuning trial of a cell
  at `epsilon`: the score's noise is what one score release alone would need for
  share x epsilon; the training's epsilon e is the largest with which the best of
  h ~ TNB trials, each the run calibrated to e (`silo_accounts.calibrate_silos`: DP-SGD
  and, for IFCA, its private selections at their share of e) and its score, is
  (epsilon, delta)-DP. Every silo samples with the protocol's public size, so one
  silo's calibration holds for all."""
  import dp_accounting
  from tff_silo.privacy import silo_accounts, tuning
  selections = definition.num_selections(s.rounds)
  # everything the calibration reads: the run's settings (a second run in the same
  # process, with other settings, must not reuse this one's), the method's, epsilon
  key = (repr(sorted(grid.settings_key(s).items())), int(silos.train_sizes[0]),
         definition.epochs_per_round, selections, definition.selection_budget_share,
         epsilon)
  if key not in _TRIAL_PRIVACY:
    protocol = _protocol(s)
    score_z = tuning.calibrate_noise(s.score_budget_share * epsilon, s.delta,
                                     dp_accounting.GaussianDpEvent)

    def event_for(e):
      privacy = silo_accounts.calibrate_silos(
          silos.train_sizes[:1], batch_size=s.batch_size,
          epochs_per_round=definition.epochs_per_round, rounds=s.rounds,
          target_epsilon=e, target_delta=s.delta, num_selections=selections,
          selection_budget_share=definition.selection_budget_share, protocol=protocol)
      return _scored(privacy.silo_event(0), score_z)

    _TRIAL_PRIVACY[key] = (tuning.calibrate_trial_epsilon(
        epsilon, s.delta, event_for, grid.tnb(s), protocol.neighbouring), score_z)
  return _TRIAL_PRIVACY[key]


def _scored(event, score_z):
  """A trial's release: its training's queries and its noisy validation score (one
  coordinate of integer noise: its `IntegerNoiseTail`)."""
  import dp_accounting
  from tff_silo.privacy import events
  return dp_accounting.ComposedDpEvent([event, dp_accounting.GaussianDpEvent(score_z),
                                        events.IntegerNoiseTail(1)])


def _protocol(s):
  from tff_silo.privacy import PrivacyProtocol
  return PrivacyProtocol(assumed_silo_size=s.assumed_silo_size, accountant=s.accountant)


def _tuned_epsilons(s, privacy, score_z, num_trials=None) -> np.ndarray:
  """Per silo, the epsilon of releasing the best of h ~ TNB trials of what this
  trial ran (its silos' queries as recorded in `privacy`) and its noisy score; with
  `num_trials`, of releasing every one of that many such trials (h public)."""
  from tff_silo.privacy import tuning
  neighbouring = privacy.protocol.neighbouring
  cache, out = {}, []
  for k in range(len(privacy.noise_multipliers)):
    event = _scored(privacy.silo_event(k), score_z)
    delta = float(privacy.target_delta[k])
    key = (repr(event), delta)
    if key not in cache:
      cache[key] = (tuning.tuned_epsilon(event, grid.tnb(s), delta, neighbouring)
                    if num_trials is None else
                    tuning.all_trials_epsilon(event, num_trials, delta, neighbouring))
    out.append(cache[key])
  return np.array(out)


def _validation_metric(model, weights, x_val, y_val) -> float:
  """The exact metric pooled over every validation example (silos without one add
  nothing): free tuning's score, not released under private tuning."""
  from tff_silo import evaluation
  kept = [k for k, y in enumerate(y_val) if len(y)]
  return evaluation.SiloEvaluator(model)([weights[k] for k in kept],
                                         [x_val[k] for k in kept],
                                         [y_val[k] for k in kept])[0]


def _noisy_score(s, model, weights, x_val, y_val, run_seed, score_z) -> float:
  """Each silo's sum of per-example validation metrics clipped to [0, score_clip],
  released by the integer Gaussian mechanism at multiplier score_z
  (`integer_gaussian.sum_release`), fresh for every trial and silo; their mean over
  silos (a sum per silo, not a per-example mean: no silo's private count enters it;
  a silo without validation examples releases its noise)."""
  from tff_silo import keys
  from tff_silo.privacy import integer_gaussian
  total = 0.0
  for k, (x, y) in enumerate(zip(x_val, y_val)):
    values = model.metric_values([np.asarray(w) for w in weights[k]], x, y).numpy()
    key = keys.derive(keys.root_key(run_seed), keys.VALIDATION_SCORE, k)
    total += float(integer_gaussian.sum_release(
        np.clip(values, 0.0, s.score_clip)[:, None], s.score_clip, score_z, key)[0])
  return total / len(y_val)


def _definition_settings(s, trial) -> dict:
  """`algorithms.silo_definition`'s name and keyword arguments for `trial` but its
  seed and data: what `_definition` builds, and what a saved trial retrains with
  (`_save`; a plain mean's factory is its name)."""
  return dict(name=trial["method"], client_learning_rate=trial["lr"],
              batch_size=s.batch_size, rounds=s.rounds, lam=trial["lam"],
              l2_norm_clip=None if math.isinf(trial["epsilon"]) else s.clip,
              aggregator=s.aggregator.factory, num_clusters=s.num_clusters,
              noise=grid.TRIAL_NOISE)


def _definition(s, trial, silos):
  from tff_silo import algorithms, models
  settings = _definition_settings(s, trial)
  return algorithms.silo_definition(
      settings.pop("name"), models.model_for(silos), silos.feature_shape,
      cluster_init_seed=trial["seed"], num_silos=silos.num_silos, **settings)


class _Outcome(NamedTuple):
  """What a trial trained, whichever method: the silos' final models and figures."""
  model: object
  silo_weights: list
  data: object                 # the SiloData trained on
  rounds: int
  metric: str
  test_metric: float
  privacy: object              # SiloPrivacy (example-level methods) or None
  epsilon_spent: float         # nan without DP
  noise_multiplier: float      # nan without DP
  wall_seconds: float
  runs_stacked: int
  aggregator_measurements: Optional[dict] = None   # None: no server aggregator
  run_epsilon: Optional[float] = None   # the epsilon the run was calibrated to
  server_weights: tuple = ()            # the server's models (global, clusters)
  hypernetwork: Optional[tuple] = None  # (phi, embeddings) of a hypernetwork
  saved_privacy: Optional[dict] = None  # a user-level run's privacy (tff_silo.runs)


def _simulate(s, batch, loaded, backend) -> list:
  """(outcome, score noise multiplier or None) of each trial of `batch`."""
  if batch[0]["method"] == "hypernet":
    return [(_hypernet(s, trial, loaded[trial["seed"]][0], backend), None)
            for trial in batch]
  from tff_silo import simulation
  runs, scores = [], []
  for trial in batch:
    silos = loaded[trial["seed"]][0]
    definition = _definition(s, trial, silos)
    private = not math.isinf(trial["epsilon"])
    epsilon, score_z = ((_trial_privacy(s, definition, silos, trial["epsilon"])
                         if trial["trial"] >= 0 else (trial["epsilon"], None)))
    scores.append(score_z)
    runs.append(simulation.Run(
        definition, silos, target_epsilon=epsilon if private else None,
        target_delta=s.delta if private else None, seed=trial["run_seed"],
        protocol=_protocol(s) if private else None))
  results = simulation.run_simulations(runs, rounds=s.rounds, backend=backend)
  nan = float("nan")
  return [(_Outcome(
      run.process.model, result.silo_weights, run.data, result.rounds, result.metric,
      result.test_metric, result.privacy,
      float(np.max(result.privacy.epsilon_spent)) if result.privacy else nan,
      float(np.min(result.privacy.noise_multipliers)) if result.privacy else nan,
      result.wall_seconds, result.runs_stacked, result.aggregator_measurements,
      run.target_epsilon, result.server_weights), score_z)
          for run, result, score_z in zip(runs, results, scores)]


def _hypernet_noise(s, epsilon: float) -> float:
  """The hypernetwork's z at `epsilon`: T Poisson-sampled (q) Gaussian rounds
  (epsilon, delta)-DP at the user level; 0 without DP."""
  from tff_silo.privacy import accounting
  return (0.0 if math.isinf(epsilon) else accounting.calibrate_noise_multiplier(
      epsilon, s.delta, s.hypernet.sampling_rate, s.rounds))


def _check_hypernet_noise(s, silos) -> None:
  """Refuses, before any trial runs, an epsilon whose z the integer noise cannot
  draw over the hypernetwork's weights (`integer_law.grid_noise_multiplier`)."""
  if "hypernet" not in s.methods:
    return
  from hypernet.training import hypernetwork
  from tff_silo import models
  from tff_silo.privacy import integer_law
  size = hypernetwork(models.model_for(silos), silos,
                      s.hypernet.hidden_width).num_parameters
  for epsilon in s.epsilons:
    z = _hypernet_noise(s, epsilon)
    if z > 0:
      try:
        integer_law.grid_noise_multiplier(z, size)
      except ValueError as e:
        raise UsageError(f"--epsilons: the hypernetwork at epsilon {epsilon:g} needs "
                         f"z = {z:.3g}, beyond integer noise over its {size:,} weights "
                         f"({e}); give a larger epsilon or fewer --rounds, or drop "
                         "hypernet from --methods") from None


def _hypernet(s, trial, silos, backend) -> _Outcome:
  """HyperNetFL (UDP-Alg), each silo a user: under DP the noise multiplier z that
  makes T Poisson-sampled (q) Gaussian rounds (trial epsilon, delta)-DP at the
  user level (add/remove one user's whole data)."""
  import hypernet
  from tff_silo import models
  from tff_silo.privacy import user_level
  h = s.hypernet
  private = not math.isinf(trial["epsilon"])
  z = _hypernet_noise(s, trial["epsilon"])
  # W: the preset's number of users, fixed by its recipe before training (public)
  settings = user_level.UserDPSettings(
      h.sampling_rate, h.l2_norm_clip if private else None, z,
      public_user_count=silos.num_silos)
  target = models.model_for(silos)
  result, _ = hypernet.train(
      target, silos, settings, rounds=s.rounds, client_lr=h.client_lr,
      batch_size=h.batch_size, local_steps=h.local_steps, hypernet_lr=h.hypernet_lr,
      embedding_lr=h.embedding_lr, hidden_width=h.hidden_width, delta=s.delta,
      init_seed=trial["run_seed"], noise_seed=trial["run_seed"], backend=backend)
  if result.epsilon > trial["epsilon"]:
    raise RuntimeError(f"the hypernetwork spent epsilon {result.epsilon} > "
                       f"{trial['epsilon']}: a calibration error; nothing reported")
  nan = float("nan")
  from tff_silo import runs
  return _Outcome(target, list(result.silo_weights), silos, result.rounds, "accuracy",
                  result.test_metric, None, result.epsilon if private else nan,
                  z if private else nan, result.wall_seconds, 1,
                  hypernetwork=(result.phi, result.embeddings),
                  saved_privacy=runs.user_level_privacy(
                      settings, result.epsilon, s.delta, silos.num_silos)
                  if private else None)


def _batches(s, pending, loaded, backend) -> list:
  """The pending trials in batches that run together: on the vectorized backend the
  trials of one method and privacy (every configuration, epsilon and seed: their
  programs take the learning rate and lambda as tensors) in stacks of
  `simulation.runs_per_stack`; a method whose runs do not stack (the hypernetwork,
  the TFF backend) one configuration's trials at a time."""
  from tff_silo import runner, simulation
  silos = [loaded[seed][0] for seed in s.seeds]
  most = simulation.runs_per_stack(silos)
  stacks = {}

  def key(trial):
    private = not math.isinf(trial["epsilon"])
    if (trial["method"], private) not in stacks:
      stacks[trial["method"], private] = trial["method"] != "hypernet" and (
          runner.stack_key(_definition(s, trial, silos[0]), backend) is not None)
    if stacks[trial["method"], private]:
      return trial["method"], private
    return trial["method"], trial["lam"], trial["lr"]

  ordered = sorted(pending, key=lambda t: (METHODS.index(t["method"]),
                                           math.isinf(t["epsilon"])))
  return [group[i:i + most] for group in plan.consecutive(ordered, key)
          for i in range(0, len(group), most)]


def _cell_trials(s, trials=None) -> collections.Counter:
  """h of each cell, (method, epsilon, seed): the trials `grid.trials` plans in it."""
  return collections.Counter((t["method"], t["epsilon"], t["seed"])
                             for t in (grid.trials(s) if trials is None else trials))


def _batch_rows(s, batch, progress=None, replay=None):
  """Trial rows of `batch` (`_batches`): the plan's work, in this process or on a
  Ray worker (`benchmarks.executors`; no round progress: `progress` is unused); with
  --import_xla, its rounds' results and seconds those of the bundle's `replay`."""
  del progress
  backend = common.backend_for(s.backend, s.aggregator)
  loaded = {seed: _data(s, seed) for seed in {trial["seed"] for trial in batch}}
  first_call = replay.calls if replay is not None else 0
  outcomes = _simulate(s, batch, loaded, backend)
  if replay is not None:   # a stack's trials share its calls, as their wall time
    seconds = common.replayed_seconds(replay, first_call, s.rounds)["wall_seconds"]
    outcomes = [(o._replace(wall_seconds=seconds), z) for o, z in outcomes]
  return _run_batch(s, batch, loaded, backend,
                    common.device_scope(s.device, backend, s.xla, replay)[1],
                    _cell_trials(s), outcomes)


def _run_batch(s, batch, loaded, backend, device, cell_trials, outcomes):
  """Trial rows of `batch` (trials that run together: `_batches`) from their
  `outcomes` (`_simulate`); `cell_trials[(method, epsilon, seed)]` is h, the trials
  of each cell."""
  rows = []
  for trial, (outcome, score_z) in zip(batch, outcomes):
    _, x_val, y_val = loaded[trial["seed"]]
    model = outcome.model
    tuned = trial["trial"] >= 0   # a draw of private tuning
    private = not math.isinf(trial["epsilon"])
    # under private tuning only the noisy score is released, not the exact metric
    noisy_score, epsilon_tuned, tuned_per_silo = math.nan, math.nan, None
    if_released = outcome.epsilon_spent if private else math.nan
    if tuned:
      validation_metric = math.nan
      noisy_score = _noisy_score(s, model, outcome.silo_weights, x_val, y_val,
                                 trial["run_seed"], score_z)
      tuned_per_silo = _tuned_epsilons(s, outcome.privacy, score_z)
      epsilon_tuned = float(tuned_per_silo.max())
      if epsilon_tuned > trial["epsilon"]:
        raise RuntimeError(f"tuning would spend epsilon {epsilon_tuned} > "
                           f"{trial['epsilon']}: a calibration error; nothing reported")
      if_released = float(_tuned_epsilons(s, outcome.privacy, score_z, cell_trials[
          (trial["method"], trial["epsilon"], trial["seed"])]).max())
    else:
      validation_metric = _validation_metric(model, outcome.silo_weights, x_val, y_val)
    leakage = {}
    if s.membership:
      from attacks import membership
      pooled = membership.attack_silo_models(model, outcome.silo_weights, outcome.data)
      pooled = pooled[pooled.silo == membership.ALL_SILOS].iloc[0]
      # an evaluator's measurement on the silos' training examples, un-noised: no
      # guarantee covers it (it says how much the models leak, it is not released)
      leakage = dict(mia_auc=float(pooled.auc), mia_advantage=float(pooled.advantage),
                     mia_inside_guarantee=False)
    outside = ({} if s.tuning == "free" else
               dict(outside_guarantee=True, epsilon_if_released=if_released))
    rows.append(dict(
        row_type="trial", run_key=grid.trial_key(s, trial), preset=s.preset, **trial,
        **grid.setting_columns(s),
        privacy_unit=grid.privacy_unit(trial["method"]) if private else None,
        accountant=(("rdp" if trial["method"] == "hypernet" else s.accountant)
                    if private else None),
        noise=grid.trial_noise(trial["epsilon"]),
        test_metric_inside_guarantee=(grid.privacy_unit(trial["method"]) != "user"
                                      if private else None),
        rounds=outcome.rounds, metric=outcome.metric,
        validation_metric=validation_metric, noisy_validation_score=noisy_score,
        test_metric=outcome.test_metric, epsilon_spent=outcome.epsilon_spent,
        noise_multiplier=outcome.noise_multiplier,
        epsilon_tuned=epsilon_tuned, score_noise_multiplier=score_z,
        delta=s.delta if private else float("nan"),
        tuning=(TUNING_PRIVATE.format(eta=s.tuning_eta, mean=s.mean_trials)
                if tuned else UNTUNED
                if len(grid.configurations(s, trial["method"])) == 1 else TUNING),
        num_trials=1, wall_seconds=outcome.wall_seconds,
        runs_stacked=outcome.runs_stacked, backend=backend, device=device,
        peak_memory_mb=common.peak_memory_mb(), **leakage, **outside,
        **({} if outcome.aggregator_measurements is None else common.aggregator_columns(
            s.aggregator, outcome.rounds, outcome.aggregator_measurements,
            sum(np.size(w) for w in outcome.silo_weights[0])))))
    if s.save_models:   # (a disk that refuses the save keeps the row: saved_to empty)
      rows[-1]["saved_to"] = common.saved_or_reported(
          lambda: _save(s, trial, outcome, rows[-1], tuned_per_silo),
          f"{trial['method']} epsilon={trial['epsilon']:g} lam={trial['lam']:g} "
          f"lr={trial['lr']:g} seed={trial['seed']}")
  return rows


def _save(s, trial, outcome, row, tuned_per_silo=None) -> str:
  """Saves a trial's silo models under --save_models (`tff_silo.runs`); its folder.
  Under private tuning it is staged until its cell is selected (`_publish`), its
  privacy block the tuning's per-silo epsilon (`tuned_per_silo`) where drawn."""
  from tff_silo import runs
  key = row["run_key"]
  parent = s.save_models
  if s.tuning == "private":
    parent = os.path.join(s.save_models, STAGED_MODELS)
  folder = runs.run_folder(parent, "-".join([
      trial["method"], f"eps{trial['epsilon']:g}", f"lam{trial['lam']:g}",
      f"lr{trial['lr']:g}", f"seed{trial['seed']}", f"t{trial['trial']}"]), key)
  private = not math.isinf(trial["epsilon"])
  privacy = outcome.privacy or outcome.saved_privacy
  if tuned_per_silo is not None:
    privacy = dict(runs.privacy_summary(privacy),
                   epsilon_spent=[float(e) for e in tuned_per_silo],
                   training_epsilon_spent=[float(e) for e in privacy.epsilon_spent],
                   covers=row["tuning"])
  training = None
  if trial["method"] != "hypernet" and s.aggregator.plain:
    training = runs.training_settings(
        _definition_settings(s, trial),
        target_epsilon=outcome.run_epsilon if private else None,
        target_delta=s.delta if private else None,
        protocol=_protocol(s) if private else None)
  model = runs.model_spec(outcome.model, outcome.data)
  if outcome.hypernetwork is not None:
    embeddings = outcome.hypernetwork[1]
    model["hypernetwork"] = dict(num_users=embeddings.shape[0],
                                 embedding_dim=embeddings.shape[1],
                                 hidden_width=s.hypernet.hidden_width)
  runs.save(folder, run_key=key, silo_weights=outcome.silo_weights,
            server_weights=outcome.server_weights, hypernetwork=outcome.hypernetwork,
            model=model, data=grid.recipe(s, trial["seed"]), silos=outcome.data,
            privacy=privacy,
            info=dict(binary="benchmarks.compare", algorithm=trial["method"],
                      lam=trial["lam"], lr=trial["lr"], seed=trial["seed"],
                      trial=trial["trial"], rounds=outcome.rounds,
                      epsilon=None if not private else trial["epsilon"],
                      delta=s.delta if private else None,
                      clip=s.clip if private else None,
                      privacy_unit=row["privacy_unit"], metric=outcome.metric,
                      test_metric=outcome.test_metric, training=training))
  return folder


def _select_ready(s, planned, released: set, loaded) -> None:
  """Writes to --output the selected row of every cell whose planned trials are all
  in the trial store and whose row is not there yet (`released`: the cell keys
  written; under private tuning only the released columns, and its saved models
  published)."""
  if not os.path.exists(s.trials_store):
    return
  table = common.read_rows(s.trials_store, SIGNATURE, "trials_output")
  keys = {grid.trial_key(s, t) for t in planned}
  ours = table[(table.row_type == "trial") & table.run_key.isin(keys)]
  if ours.empty:
    return
  rows = []
  chosen = grid.selected(s, ours, planned).sort_values(
      ["method", "epsilon", "seed"], kind="stable",
      key=lambda c: c.map(METHODS.index) if c.name == "method" else c)
  for row in chosen.to_dict("records"):
    if row["run_key"] in released:
      continue
    if s.tuning == "private":
      row = _released_row(s, row, ours, loaded)
    rows.append(row)
    released.add(row["run_key"])
  if rows:
    common.append_rows(s.output, rows)


def _released_row(s, row, trials, loaded) -> dict:
  """A cell's selected row under private tuning: the released columns only; under
  --save_models the selected trial's staged run saved as the cell's, and every
  staged trial of the cell removed."""
  out = {name: row[name] for name in grid.RELEASED_COLUMNS if name in row}
  out.pop("saved_to", None)
  if math.isfinite(row["epsilon"]):   # an exact validation metric is not accounted
    out.pop("validation_metric", None)
  if s.save_models:
    staged = row.get("saved_to")
    out["saved_to"] = (common.saved_or_reported(
        lambda: _publish(s, row, staged, loaded),
        f"the selected {row['method']} epsilon={row['epsilon']:g} seed={row['seed']}")
                       if isinstance(staged, str) and os.path.isdir(staged) else None)
    cell = trials[(trials.method == row["method"]) & (trials.epsilon == row["epsilon"])
                  & (trials.seed == row["seed"])]
    if "saved_to" in cell:
      for path in cell.saved_to.dropna():
        shutil.rmtree(path, ignore_errors=True)
  return out


def _publish(s, row, staged: str, loaded) -> str:
  """The selected trial's staged run saved under --save_models as its cell's run:
  the cell's key, no trial index; its folder."""
  from tff_silo import runs
  run = runs.load(staged)
  info = {name: value for name, value in run.meta["info"].items() if name != "trial"}
  folder = runs.run_folder(s.save_models, "-".join([
      row["method"], f"eps{row['epsilon']:g}", f"lam{row['lam']:g}", f"lr{row['lr']:g}",
      f"seed{row['seed']}"]), row["run_key"])
  runs.save(folder, run_key=row["run_key"], silo_weights=run.silo_weights,
            server_weights=run.server_weights, hypernetwork=run.hypernetwork_weights,
            model=run.meta["model"], data=run.meta["data"],
            silos=loaded[int(row["seed"])][0], privacy=run.meta["privacy"], info=info)
  return folder


def _plan_secret(s) -> int:
  """Private tuning's plans' seed (`grid.Settings.plan_secret`): 128 bits of OS
  entropy, written beside the trial store on the first run (outside the guarantee,
  as the trials are) and read back by a rerun, so that it resumes the same plans.
  UsageError in one line for a file that is not such a number."""
  path = s.trials_store + PLAN_SECRET
  if os.path.exists(path):
    with open(path) as f:
      text = f.read().strip()
    if not text.isdigit():
      raise UsageError(f"{path} is not a plan secret (a decimal integer); remove it to "
                       f"draw new plans (the trials in {s.trials_store} then rerun)")
    return int(text)
  secret = secrets.randbits(128)
  common.write_atomically(path, f"{secret}\n".encode())
  os.chmod(path, 0o600)   # the operator's alone
  return secret


def _forget_partial_trials(s, planned) -> None:
  """Private tuning without --trials_output: once every cell is selected, its trials
  leave the partial store (and their staged models the save folder), and the plan
  secret goes."""
  if s.tuning != "private" or s.trials_output is not None:
    return
  common.drop_rows(s.trials_store, {grid.trial_key(s, t) for t in planned})
  with contextlib.suppress(FileNotFoundError):
    os.remove(s.trials_store + PLAN_SECRET)
  if s.save_models:
    with contextlib.suppress(OSError):
      os.rmdir(os.path.join(s.save_models, STAGED_MODELS))


def _figure(s, name) -> str:
  """Figure `name` of this preset (and tuning mode, unless free)."""
  suffix = "" if s.tuning == "free" else f"_{s.tuning}"
  return os.path.join(s.figures_dir, f"{name}_{s.preset}{suffix}.png")


def _plots(s, trials, selected, chance):
  """The privacy-utility, leakage (with --membership) and lambda figures; `trials`
  None (private tuning) draws every figure from the selected rows alone; `chance`
  the accuracy of a uniform guess (None for regression)."""
  from benchmarks import plots
  figure = configs.COMPARE_PRESETS[s.preset].paper_figure
  untuned = "tuning" in selected and selected.tuning.fillna("").str.startswith(
      UNTUNED.split(":")[0] + ":").all()
  title = (s.preset + (f" ({figure})" if figure else "") + (
      ": one configuration a method, nothing tuned" if untuned else
      f": tuning {s.tuning}" + (" (not accounted)" if s.tuning == "free"
                                else " (accounted)")))
  plots.privacy_utility(selected, title, _figure(s, "privacy_utility"), chance,
                        tuned=not untuned)
  if "mia_auc" in selected and selected.mia_auc.notna().any():
    plots.leakage(selected, f"{s.preset}: leakage of the selected models",
                  _figure(s, "leakage"))
  # free tuning: per (method, lambda, seed) the trial with the best validation metric;
  # private tuning: the selected models alone, at the lambda each selected
  lam_rows = (selected if trials is None else trials)
  lam_rows = lam_rows[lam_rows.method.isin(LAMBDA_METHODS)]
  if not lam_rows.empty:
    plots.lambda_panels(lam_rows, selected, _figure(s, "lambda"),
                        every_trial=trials is not None, chance=chance)


def _batch_done(s, trials, released, loaded, batch, i, batches, start):
  """After the i-th finished batch's rows are written (of `batches`): the cells now
  complete selected (free tuning; private tuning selects all at the end), progress
  (private tuning: no trial or cell counts, which would tell h)."""
  first = batch[0]
  elapsed = time.perf_counter() - start
  left = elapsed / i * (batches - i)
  if s.tuning == "private":
    print(f"[{i}/{batches}] {elapsed:.0f} s, ~{left:.0f} s left", file=sys.stderr,
          flush=True)
    return
  _select_ready(s, trials, released, loaded)
  counts = f"{len(batch)} trials"
  configs_run = {(t["lam"], t["lr"]) for t in batch}
  what = (f"lam={first['lam']:g} lr={first['lr']:g}" if len(configs_run) == 1
          else f"{len(configs_run)} configurations stacked")
  print(f"[{i}/{batches}] {first['method']} {what}: {counts}, {elapsed:.0f} s, "
        f"~{left:.0f} s left", file=sys.stderr, flush=True)


def _export(s, batches, loaded, backend, recording) -> None:
  """--export_xla: the pending trials' rounds recorded, not run (no row), and
  written as a bundle. Under private tuning the message counts cells, not trials
  (h stays out of what the binary prints; the bundle, outside the guarantee, has
  every call)."""
  from tff_silo import bundles
  with common.usage_errors(), common.placement(s, recording):
    for batch in batches:
      _simulate(s, batch, loaded, backend)
    manifest = recording.write(s.export_xla, about=dict(
        binary="benchmarks.compare", command=" ".join(sys.argv[1:]),
        privacy=bundles.OUTSIDE_GUARANTEE))
  cells = len({(t["method"], t["epsilon"], t["seed"]) for b in batches for t in b})
  common.print_exported(s.export_xla, f"the pending trials of {cells} cell(s)",
                        None if s.tuning == "private" else manifest)


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = _settings()
  bundle = common.bundle_from_flags()
  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()
  private = s.tuning == "private"
  if private:
    s = dataclasses.replace(s, plan_secret=_plan_secret(s))
  trials = grid.trials(s)
  cell_trials = _cell_trials(s, trials)
  cell_keys = {grid.cell_key(s, *cell): cell for cell in cell_trials}
  released = {key for key, row in common.done_rows(s.output, True, SIGNATURE).items()
              if row["row_type"] == "selected" and key in cell_keys}
  done = common.done_rows(s.trials_store, True, SIGNATURE, "trials_output")
  finished_cells = {cell_keys[key] for key in released}
  pending = [t for t in trials if grid.trial_key(s, t) not in done
             and (t["method"], t["epsilon"], t["seed"]) not in finished_cells]
  executor = executors.from_flags()
  try:
    loaded = {seed: _data(s, seed) for seed in s.seeds}
  except ValueError as e:   # DataError: a missing or bad file, a silo too small
    raise UsageError(str(e)) from None
  silos = loaded[s.seeds[0]][0]
  _check_hypernet_noise(s, silos)
  s = dataclasses.replace(
      s, aggregator=common.aggregator_choice(silos.num_silos, s.rounds))
  if not s.aggregator.weighted and any(m in grid.IFCA_METHODS for m in s.methods):
    raise UsageError(f"--aggregator={s.aggregator.name} is unweighted; the ifca methods "
                     "need a weighted one (mean, robust, compressed)")
  backend = common.backend_for(s.backend, s.aggregator)
  scope, device = common.device_scope(s.device, backend, s.xla)
  batches = _batches(s, pending, loaded, backend)
  if private:   # how many trials ran would tell h: counted in cells only
    print(f"{len(cell_trials)} cells, {len(released)} already in {s.output}; the "
          f"rest in {len(batches)} batches (finished trials wait in "
          f"{s.trials_store}, outside the guarantee)", file=sys.stderr)
  else:
    print(f"{len(trials)} trials, {len(trials) - len(pending)} already in "
          f"{s.output}; running {len(pending)} in {len(batches)} batches",
          file=sys.stderr)
  if s.export_xla:
    _export(s, batches, loaded, backend, bundle)
    return
  start = time.perf_counter()
  if executor.name == "local" and backend == "vectorized":
    executor = executors.Local(   # TensorFlow's device scope is per thread; a
        1 if bundle else s.concurrent_batches,   # bundle's calls come in its order
        lambda: common.device_scope(s.device, backend)[0])
  work = executors.Work(_batch_rows, s, "benchmarks.compare", data=tuple(
      datasets.travelling(datasets.compare_split, grid.recipe(s, seed))
      for seed in s.seeds) if executor.name == "ray" else ())
  if bundle is not None:
    work = work._replace(function=functools.partial(_batch_rows, replay=bundle))
    scope = common.placement(s, bundle)
  failed = 0
  # a ValueError (a budget too small for any noise, say) ends the binary in one line
  with scope, common.usage_errors():
    for done, (i, rows) in enumerate(executor.run(work, batches), 1):
      if isinstance(rows, executors.Failed):
        print(f"[{done}/{len(batches)}] {batches[i][0]['method']}: a batch of "
              f"{len(batches[i])} trials failed after {rows.attempts} attempt(s): "
              f"{rows.error}; a rerun retries it", file=sys.stderr, flush=True)
        failed += 1
        continue
      common.append_rows(s.trials_store, rows)
      _batch_done(s, trials, released, loaded, batches[i], done, len(batches), start)
  _select_ready(s, trials, released, loaded)   # cells finished before
  if bundle is not None and batches and not failed:
    with common.usage_errors():
      bundle.finish()
  if failed:
    raise UsageError(f"{failed} of {len(batches)} batches failed (above); the others' "
                     f"trials are in {s.trials_store}; a rerun retries the rest")
  table = common.read_rows(s.output, SIGNATURE)
  selected = table[(table.row_type == "selected") & table.run_key.isin(set(cell_keys))]
  in_order = lambda c: c.map(METHODS.index) if c.name == "method" else c
  selected = selected.sort_values(["method", "epsilon", "seed"], kind="stable",
                                  key=in_order)
  ours = None
  if not private:   # the lambda figure of free tuning shows every trial
    ours = table[(table.row_type == "trial")
                 & table.run_key.isin({grid.trial_key(s, t) for t in trials})]
  _forget_partial_trials(s, trials)
  markdown = tables.compare_report(selected)
  os.makedirs(os.path.dirname(os.path.abspath(s.table)), exist_ok=True)
  with open(s.table, "w") as f:
    f.write(markdown)
  _plots(s, ours, selected, datasets.DATASETS[s.dataset].chance)
  print(markdown)
  figures = [_figure(s, name) for name in ("privacy_utility", "lambda")
             + (("leakage",) if s.membership else ())]
  print(f"rows: {s.output}; table: {s.table}; figures: {', '.join(figures)}"
        + (f"; every trial (outside the guarantee): {s.trials_output}"
           if s.trials_output else ""))


if __name__ == "__main__":
  common.run_main(main)
