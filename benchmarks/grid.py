"""What `benchmarks.compare` runs and selects, without its flags (so that tests and
other code import it freely): the methods, the trials of a grid (full or drawn by
private tuning), the keys that make a run resumable, and the selection of each
cell's configuration on validation. Its data: `benchmarks.datasets`."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from benchmarks import configs, datasets, paired
from tff_silo.algorithms import methods   # no TensorFlow imported

# compare's methods, in its tables' order (the library's registry's).
METHODS = methods.names(compare=True)
IFCA_METHODS = methods.names(compare=True, kind="ifca")   # selection: first 10% of rounds
LAMBDA_METHODS = methods.names(compare=True, lam=True)
IMAGE_METHODS = methods.names(compare=True, images_only=True)   # on image silos only


@dataclasses.dataclass(frozen=True)
class Settings:
  """A `benchmarks.compare` run: its preset with the flags over it (checked by
  `compare._settings`). The private-tuning fields are None under free
  tuning; `aggregator` (a `tff_silo.aggregators.AggregatorChoice`) is set once the
  silos are loaded."""
  preset: str
  dataset: str
  methods: tuple
  epsilons: tuple   # inf: non-private
  seeds: tuple
  lrs: tuple
  lams: tuple
  rounds: int
  batch_size: int
  clip: float
  delta: float
  validation_fraction: float
  assumed_silo_size: int
  num_clusters: int
  tuning: str = "free"
  membership: bool = False
  hypernet: configs.HypernetSettings | None = None
  tuning_eta: float | None = None
  mean_trials: float | None = None
  score_budget_share: float | None = None
  score_clip: float | None = None
  # the aggregator flags a run key holds (empty for the default mean)
  aggregator_key: dict = dataclasses.field(default_factory=dict)
  mask_probability: float | None = None   # digits, fmnist; None: the dataset's
  data_dir: str | None = None
  output: str | None = None
  table: str | None = None
  trials_store: str | None = None   # where trial rows go (`compare`'s docstring)
  trials_output: str | None = None
  figures_dir: str | None = None
  save_models: str | None = None
  backend: str = "auto"
  device: str = "auto"
  xla: bool = False
  concurrent_batches: int = 1   # the vectorized backend's batches running at once
  export_xla: str | None = None   # a bundle's folder (`common.BUNDLE_GROUP`)
  accountant: str = "rdp"   # private cells' (`tff_silo.privacy.pld`)
  # private tuning: the plans' seed, OS entropy kept beside the trial store
  # (`compare._plan_secret`), so that h is not a function of the published seeds
  plan_secret: int | None = None
  aggregator: object = None


def privacy_unit(method: str) -> str:
  """What a row's epsilon protects: one example of a silo (silo-specific
  example-level DP, the thesis' granularity) or a user's whole data (HyperNetFL's
  user-level DP, each silo a user: a stronger guarantee at the same epsilon)."""
  return methods.REGISTRY[method].privacy_unit


# The columns of a selected row under private tuning: what the best trial's release
# is (its model's test metric and noisy score, its hyperparameters), the tuning's
# total epsilon, and the settings; nothing that counts or indexes the trials.
RELEASED_COLUMNS = (
    "row_type", "run_key", "preset", "method", "epsilon", "seed", "lam", "lr",
    "privacy_unit", "test_metric_inside_guarantee", "rounds", "metric",
    "validation_metric", "noisy_validation_score",
    "test_metric", "epsilon_spent", "noise_multiplier", "score_noise_multiplier",
    "delta", "tuning", "backend", "device", "mia_auc", "mia_advantage",
    "mia_inside_guarantee", "saved_to", "noise", "noise_mechanism")

TUNING_MODES = ("free", "private")
TUNING = "free: best validation metric of the grid; validation and tuning not accounted"
UNTUNED = "none: one configuration, nothing tuned; validation not accounted"
TUNING_PRIVATE = ("private: best noisy validation score of h ~ TNB(eta={eta:g}, "
                  "E[h]={mean:g}) random grid draws; accounted (Papernot & Steinke Thm. 2)")


def configurations(s, method) -> list:
  """The (lam, lr) configurations of `method`, in grid order (the hypernetwork: its
  one configuration, at its client learning rate)."""
  if method == "hypernet":
    return [(0.0, s.hypernet.client_lr)]
  return [(lam, lr) for lam in (s.lams if method in LAMBDA_METHODS else (0.0,))
          for lr in s.lrs]


def trials(s) -> list:
  """Every trial (method, epsilon, seed, lam, lr, trial, run_seed), sorted so that a
  configuration's trials (epsilons, seeds, draws) are consecutive.
  A cell of the full grid (free tuning, a non-private cell, a method with one
  configuration) has trial -1; a cell of private tuning has trials 0..h-1, the plan
  (h and each trial's configuration) drawn from `plan_secret` and the cell. The
  seed is the data split's; each trial's keys come from its own `run_seed`
  (`_run_seed`)."""
  from tff_silo.privacy import tuning
  out = []
  for method in s.methods:
    options = configurations(s, method)
    for epsilon in s.epsilons:
      for seed in s.seeds:
        if s.tuning == "free" or math.isinf(epsilon) or len(options) == 1:
          cell = [dict(method=method, epsilon=epsilon, seed=seed, lam=lam, lr=lr,
                       trial=-1) for lam, lr in options]
        else:
          plan = tuning.draw_trials(tnb(s), len(options),
                                    _plan_generator(s, method, epsilon, seed))
          cell = [dict(method=method, epsilon=epsilon, seed=seed, lam=options[i][0],
                       lr=options[i][1], trial=j) for j, i in enumerate(plan)]
        out += [dict(t, run_seed=_run_seed(s, t)) for t in cell]
  return sorted(out, key=lambda t: (METHODS.index(t["method"]), t["lam"], t["lr"]))


def _plan_generator(s, method, epsilon, seed):
  """The generator of a private-tuning cell's plan: from the run's `plan_secret` (OS
  entropy) and the cell, so that h and the configurations drawn are hidden from
  whoever knows the seeds the rows publish (Papernot & Steinke's bound needs h
  hidden)."""
  from tff_silo import keys
  if s.plan_secret is None:
    raise ValueError("private tuning draws its plans from a plan_secret; none given")
  return np.random.default_rng([s.plan_secret, keys.TUNING, _name_salt(method),
                                round(epsilon * 1000), seed])


def _name_salt(method: str) -> int:
  """A method's own number in its plan's seed: from its name, so that a method added
  to (or moved in) `METHODS` changes no other method's plans."""
  import hashlib
  return int.from_bytes(hashlib.sha256(method.encode()).digest()[:8], "little")


def _run_seed(s, trial) -> int:
  """A trial's keys' seed: from its cell's seed and everything it trains with (the
  settings, method, epsilon, lambda, lr, its draw under private tuning), so that no
  two trials share batches or noise (`tff_silo.keys.run_seed`)."""
  from tff_silo import keys
  return keys.run_seed(trial["seed"], dict(settings_key(s), **trial,
                                           **_method_settings(s, trial["method"])))


def tnb(s):
  """The distribution of private tuning's number of trials."""
  from tff_silo.privacy import tuning
  return tuning.TruncatedNegativeBinomial.with_mean(s.tuning_eta, s.mean_trials)


def setting_columns(s) -> dict:
  """Row columns of the data settings a comparison across runs tells apart (thesis
  Fig. 1.6's mask probability: the flag's, else the masked dataset's own; no column
  for a dataset without masks), which `benchmarks.summarize` groups by."""
  default = datasets.DATASETS[s.dataset].mask_probability
  if default is None:
    return {}
  return dict(mask_probability=(default if s.mask_probability is None
                                else s.mask_probability))


def recipe(s, seed) -> dict:
  """What a trial's silos are made of (`benchmarks.datasets`)."""
  out = dict(preset_dataset=s.dataset, seed=seed, data_dir=s.data_dir,
             validation_fraction=s.validation_fraction)
  if s.mask_probability is not None:   # (the recipes of the default have no key)
    out["mask_probability"] = s.mask_probability
  return out


# The noise of every private trial: DP-SGD's (`local_training.LocalTrainingConfig.
# noise`) and HyperNetFL's user-level mean's (`user_level.integer_mean`).
TRIAL_NOISE = "integer"


def trial_noise(epsilon):
  """The noise a trial at `epsilon` draws: TRIAL_NOISE for a private trial, None
  otherwise (no noise)."""
  return None if math.isinf(epsilon) else TRIAL_NOISE


def _noise_settings(epsilon) -> dict:
  """A key's noise: only where a trial draws noise (keys of private trials without
  it: float noise, a hypernet trial's until integer user-level noise)."""
  noise = trial_noise(epsilon)
  return {} if noise is None else dict(noise=noise)


def settings_key(s) -> dict:
  """What every trial of the run `s` shares and its results depend on."""
  key = dict(preset=s.preset, rounds=s.rounds, batch_size=s.batch_size,
             clip=s.clip, delta=s.delta, validation_fraction=s.validation_fraction,
             assumed_silo_size=s.assumed_silo_size,
             data=configs.QUICK_DATA if s.dataset == "quick" else s.dataset)
  if s.tuning == "private":
    key.update(tuning="private", **{name: getattr(s, name) for name in (
        "tuning_eta", "mean_trials", "score_budget_share", "score_clip")})
  if s.membership:
    key.update(membership=True)
  if s.accountant != "rdp":   # (the keys of rdp runs have none)
    key.update(accountant=s.accountant)
  if s.mask_probability is not None:   # (the keys of the default have none)
    key.update(mask_probability=s.mask_probability)
  key.update(s.aggregator_key)   # empty for the default mean
  return key


def _method_settings(s, method) -> dict:
  """Settings only some methods' results depend on."""
  if method in IFCA_METHODS:
    return dict(num_clusters=s.num_clusters)
  if method == "hypernet":
    return dict(hypernet=dataclasses.asdict(s.hypernet))
  return {}


def trial_key(s, trial) -> str:
  """A trial's row key: a rerun finding it skips the trial."""
  return json.dumps(dict(settings_key(s), row_type="trial", **trial,
                         **_method_settings(s, trial["method"]),
                         **_noise_settings(trial["epsilon"])),
                    sort_keys=True)


def cell_key(s, method, epsilon, seed) -> str:
  """A selected row's key (the grid searched is part of it)."""
  return json.dumps(dict(settings_key(s), row_type="selected", method=method,
                         epsilon=epsilon, seed=seed,
                         lrs=([s.hypernet.client_lr] if method == "hypernet"
                              else s.lrs),
                         lams=s.lams if method in LAMBDA_METHODS else None,
                         **_method_settings(s, method),
                         **_noise_settings(epsilon)), sort_keys=True)


# The trial rows' yes/no columns (None where they do not apply).
BOOLEAN_COLUMNS = ("test_metric_inside_guarantee", "outside_guarantee",
                   "mia_inside_guarantee")


def selected(s, trials, planned):
  """One row per (method, epsilon, seed) whose `planned` trials are all done: the
  trial with the best validation metric (noisy under private tuning; the first in
  order on a tie; a diverged trial, NaN or inf, never wins unless all did). Under
  private tuning its epsilon_spent is the tuning's total."""
  import pandas as pd
  expected = {}
  for t in planned:
    cell = (t["method"], t["epsilon"], t["seed"])
    expected[cell] = expected.get(cell, 0) + 1
  rows = []
  for (method, epsilon, seed), cell in trials.groupby(["method", "epsilon", "seed"],
                                                      sort=False):
    if len(cell) < expected.get((method, epsilon, seed), math.inf):
      continue
    cell = cell.sort_values(["trial", "lam", "lr"], kind="stable")
    best = dict(cell.loc[score(cell).idxmin()])
    if "epsilon_tuned" in cell and cell.epsilon_tuned.notna().any():
      best["epsilon_spent"] = float(cell.epsilon_tuned.max())
    rows.append(dict(best, row_type="selected",
                     run_key=cell_key(s, method, float(epsilon), int(seed)),
                     num_trials=len(cell), wall_seconds=float(cell.wall_seconds.sum())))
  table = pd.DataFrame(rows, columns=None if rows else trials.columns)   # (none done yet)
  for column in BOOLEAN_COLUMNS:   # read back as 1.0 when the store held no other value
    if column in table:
      table[column] = table[column].map(lambda v: None if pd.isna(v) else bool(v)
                                        ).astype(object)
  return table


def score(trials):
  """Lower is better: the validation metric, or under private tuning the noisy
  score (negated where higher is better: `paired.lower_is_better`), NaN as inf."""
  sign = 1.0 if paired.lower_is_better(trials.metric.iloc[0]) else -1.0
  values = trials.validation_metric
  if "noisy_validation_score" in trials:
    values = values.where(trials.noisy_validation_score.isna(),
                          trials.noisy_validation_score)
  return (sign * values).fillna(np.inf).replace(-np.inf, np.inf)
