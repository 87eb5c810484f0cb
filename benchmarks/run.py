r"""Compare personalization methods under silo-specific example-level DP.

    uv run python -m benchmarks.run                        # digits: local, FedAvg, MR-MTL
    uv run python -m benchmarks.run --dataset=school --data_dir=../shared/data \
        --methods=mrmtl,fedavg,local --epsilon=6 --seeds=0,1,2,3,4

    uv run python -m benchmarks.run --dataset=two_cluster --methods=dprivate_clustering \
        --nu=5 --clients_per_round=7 --patience=6
    uv run python -m benchmarks.run --dataset=fmnist_rotated --data_dir=DIR \
        --methods=dprivate_clustering --nu=5   # Galli et al. sec. 5.3 on Fashion-MNIST
    uv run python -m benchmarks.run --dataset=school --data_dir=../shared/data \
        --methods=mrmtl --aggregator=dp_fixed --silo_epsilon=4

Appends one CSV row per (algorithm, lambda, seed) to --output and prints a table of
means over seeds. Unset --epsilon trains without privacy. `dprivate_clustering`
(Galli et al.) protects updates with d-privacy (--nu) instead and reports leakage.

Under DP a row's epsilon holds for the protocol the row records (`protocol`,
`neighbouring`, `sampling`, `public_silo_sizes`, `assumed_silo_size`; see
`tff_silo.privacy.protocol`): by default add/remove-one with Poisson sampling and
private silo sizes (every silo samples with the preset's public size and the server
mean is unweighted); `--protocol=paper` runs the paper's protocol (n_k-weighted mean,
q_k = B / n_k), whose epsilon assumes the sizes are public. Figures computed on
training data without noise are not written under DP unless
--outside_guarantee_metrics (then under names that say so); shuffled batches get no
epsilon (only `epsilon_if_poisson_max`).

--aggregator picks the server's aggregator (`tff_silo.aggregators`): the weighted
mean (default), unweighted_mean, robust, compressed, central Gaussian DP over silos
(dp_fixed, dp_adaptive: silo-level DP, its own guarantee in its own columns
`silo_epsilon_spent` / `silo_delta`, beside the silos' example-level epsilon) or a
user's factory as module.path:callable. Rows record it (`aggregator`,
`aggregator_params`) and the last round's `aggregator_measurements`; any but the
plain means runs on TFF's runtime.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time

from absl import flags

from benchmarks import common, configs, datasets, executors, plan
from benchmarks.common import UsageError
from benchmarks.harness import spec
from tff_silo.algorithms import methods   # no TensorFlow imported
from tff_silo.privacy.accounting import NEIGHBOURING   # no TensorFlow: dp_accounting
from tff_silo.privacy.integer_law import NOISE_MECHANISMS   # no TensorFlow
from tff_silo.privacy.pld import ACCOUNTANTS

IFCA_ALGORITHMS = methods.IFCA_NAMES
ALGORITHMS = methods.names(kind=(*methods.SILO_KINDS, "dprivate_clustering"))
DATASETS = datasets.taking("run")
SAMPLING = ("poisson", "without_replacement", "shuffle")
TABULAR = datasets.taking("run", tabular=True)
REGRESSION = datasets.taking("run", task="regression")   # --corrupt_silos scales y
READ = datasets.reading("run")   # from --data_dir
STANDARDIZE = ("none", "public", "dp", "silo")
PROTOCOLS = ("custom", "paper")
LAMBDA_ALGORITHMS = methods.LAMBDA_NAMES
# Those with a server mean: what --aggregator and its settings apply to.
AGGREGATED = methods.names(kind=(*methods.SILO_KINDS, "dprivate_clustering"),
                           aggregated=True)
FLAGS = flags.FLAGS
# Validation users of `dprivate_clustering` on two_cluster (Galli et al. 5.1).
VALIDATION_USERS = 30
# Columns every row of this binary has: an existing --output without them is refused.
SIGNATURE = ("run_key", "algorithm", "test_metric")


def _standardized(s) -> bool:
  return s.standardize == "dp"


_IFCA = dict(applies_to=IFCA_ALGORITHMS, key="only_where_applies")
_DPRIVATE = dict(applies_to=("dprivate_clustering",), key="only_where_applies")

# The settings, in the order a row's `flags` record lists them. Their run key: those
# marked `key`, and `_run_key`'s (the protocol, the aggregator, the misbehaving silos).
SPEC = spec.Spec(
    methods=spec.strings(["local", "fedavg", "mrmtl"], "Comma-separated algorithms, of "
                         "{choices}.", choices=ALGORITHMS),
    dataset=spec.string("digits", "One of {choices}.", choices=DATASETS, key="always"),
    data_dir=spec.string(None, "Folder with the dataset's files (" + "; ".join(
        f"{n}: {datasets.DATASETS[n].files}" for n in READ) + ").", key="always"),
    rounds=spec.integer(None, "Rounds T (default: the dataset's preset).", bounds=">= 1",
                        key="always"),
    epsilon=spec.real(None, "Per-silo target epsilon; unset = non-private.",
                      key="always"),
    delta=spec.real(None, "Per-silo target delta (default: preset).", bounds="(0, 1)",
                    private=True, key="always"),
    lams=spec.numbers(None, "Comma-separated lambdas for mrmtl and ditto (default: the "
                      "dataset's preset).", bounds=">= 0", applies_to=LAMBDA_ALGORITHMS),
    lr=spec.real(None, "Client learning rate (default: preset).", bounds="> 0",
                 key="always"),
    batch_size=spec.integer(None, "Local batch size B (default: preset).", bounds=">= 1",
                            key="always"),
    clip=spec.real(None, "Per-example L2 clip under DP (default: preset).", bounds="> 0",
                   private=True, key="always"),
    local_epochs=spec.integer(1, "Local epochs per round.", bounds=">= 1", key="always"),
    sampling=spec.string(None, "DP batch sampling, one of {choices} (default: poisson "
                         "under add_remove, without_replacement under replace_one); "
                         "'shuffle' has no epsilon bound.", choices=SAMPLING,
                         private=True, key="always"),
    neighbouring=spec.string("add_remove", "DP neighbouring relation, one of {choices}.",
                             choices=NEIGHBOURING),
    public_silo_sizes=spec.boolean(False, "add_remove: declare the silos' sizes public "
                                   "(they set q_k = B / n_k and weigh the server mean)."),
    assumed_silo_size=spec.integer(None, "add_remove with private sizes: the public "
                                   "size m every silo samples with (default: the "
                                   "preset's)."),
    protocol=spec.string("custom", "One of {choices}: 'paper' runs the paper's protocol "
                         "(add_remove accounting, public sizes setting q_k and weighing "
                         "the mean; Poisson batches, or --sampling=shuffle as its code) "
                         "and labels the rows so; 'custom' follows the flags above.",
                         choices=PROTOCOLS),
    accountant=spec.string("rdp", "Under DP, how epsilon is computed and the noise "
                           "calibrated: rdp (Renyi DP), or pld (privacy loss "
                           "distributions, add_remove only: PLD where it expresses every "
                           "query of a silo, RDP elsewhere; the smaller bound). Rows say "
                           "which.", choices=ACCOUNTANTS, private=True),
    noise=spec.string("integer", "Under DP, DP-SGD's noise: integer (each clipped "
                      "gradient rounded to an integer grid, integer sums, "
                      "rounded-Gaussian noise: the guarantee holds for the numbers "
                      "computed), or idealized (float32 Gaussian noise, whose guarantee "
                      "holds for real numbers only). Rows say which.",
                      choices=NOISE_MECHANISMS, private=True),
    standardize=spec.string(None, "Feature standardization of the tabular datasets "
                            "(school, vehicle, gleam): none, public (documented ranges; "
                            "school only), dp (each silo's DP estimate, charged to its "
                            "ledger) or silo (each silo's exact statistics, outside the "
                            "DP guarantee). Default: silo without DP and under "
                            "--protocol=paper; otherwise public where the dataset has "
                            "documented ranges, else none.", choices=STANDARDIZE,
                            key="always"),
    standardize_clip=spec.real(None, "--standardize=dp: L2 clip R of a feature vector "
                               "(required).", bounds="> 0", when=_standardized,
                               key="where_applies"),
    standardize_budget_share=spec.real(0.05, "--standardize=dp: the share of each "
                                       "silo's epsilon its statistics spend on their "
                                       "own.", bounds="(0, 1)", when=_standardized,
                                       key="where_applies"),
    finetune_fraction=spec.real(0.5, "Fraction of rounds finetune runs FedAvg.",
                                bounds="[0, 1]", applies_to=("finetune", "ifca_finetune"),
                                key="where_applies"),
    **spec.options(common.aggregator_group(), applies_to=AGGREGATED),
    seeds=spec.numbers(["0"], "Comma-separated seeds (data split, sampling, noise).",
                       item=int),
    mask_probability=spec.real(0.1, "digits: probability of each white patch.",
                               datasets=("digits",), key="where_applies"),
    test_fraction=spec.real(None, "Tabular datasets: each silo's held-out test share "
                            "(thesis Fig. G.7: 0.2, 0.5, 0.8). Default: the dataset's "
                            "(school 0.2, vehicle and gleam 0.25). Rows add the column.",
                            bounds="(0, 1)", datasets=TABULAR),
    corrupt_silos=spec.integer(0, "Robustness: this many silos (the first) misbehave, "
                               "their training targets multiplied by --corruption "
                               "(regression datasets); rows add the honest silos' test "
                               "metric.", bounds=">= 0", datasets=REGRESSION),
    corruption=spec.real(-10.0, "--corrupt_silos: the factor on their targets (< 0: "
                         "updates the opposite way)."),
    **common.backend_group("every algorithm here"),
    num_clusters=spec.integer(None, "Clusters G (IFCA) / hypotheses k "
                              "(dprivate_clustering); default: the dataset's preset.",
                              bounds=">= 1", applies_to=(*IFCA_ALGORITHMS,
                                                         "dprivate_clustering"),
                              key="only_where_applies"),
    selection_fraction=spec.real(0.1, "IFCA: fraction of the first rounds that select "
                                 "a cluster (1 = every round).", bounds="(0, 1]",
                                 **_IFCA),
    selection_budget_share=spec.real(0.03, "IFCA under DP: epsilon of one selection as "
                                     "a share of --epsilon.", bounds="(0, 1)", **_IFCA),
    nu=spec.real(None, "dprivate_clustering: the Euclidean Laplace noise multiplier; "
                 "unset sends unsanitized models.", bounds="> 0", **_DPRIVATE),
    clients_per_round=spec.integer(None, "dprivate_clustering: users sampled per round "
                                   "U (default: the preset's, else all).", bounds=">= 1",
                                   **_DPRIVATE),
    leakage_cap=spec.real(None, "dprivate_clustering: a user declines a round that "
                          "would take its leakage above this.", **_DPRIVATE),
    patience=spec.integer(None, "dprivate_clustering on two_cluster: stop after this "
                          "many rounds without validation improvement.", bounds=">= 1",
                          **_DPRIVATE),
    kmeans_iterations=spec.integer(10, "dprivate_clustering: Lloyd iterations.",
                                   bounds=">= 1", **_DPRIVATE),
    hypothesis_init_std=spec.real(None, "dprivate_clustering: hypothesis j starts at the "
                                  "model's initialization for seed + j plus N(0, std^2) "
                                  "noise (default: the preset's; two_cluster 1, else "
                                  "0.01).", bounds=">= 0", **_DPRIVATE),
    # Not in the `flags` record:
    ledger_csv=spec.string(None, "Under DP, append every silo's epsilon after every "
                           "round to this CSV.", private=True, given=False),
    outside_guarantee_metrics=spec.boolean(False, "Under DP, also write the un-noised "
                                           "training metric (as "
                                           "train_metric_outside_guarantee).",
                                           private=True, given=False),
    eval_every=spec.integer(0, "Also evaluate every this many rounds (0: end), in the "
                            "row's history: [[round, pooled test metric], ...].",
                            bounds=">= 0", given=False),
    resume=spec.boolean(True, "Skip runs whose row (same settings, algorithm, lambda "
                        "and seed) is already in --output.", given=False),
    **common.shards_group("silos"),
    **common.BUNDLE_GROUP,
    **common.DEVICE_MEMORY_GROUP,
    **common.output_group(output=("run.csv", "CSV file rows are appended to.")),
    **common.save_models_group("every run"),
)
SPEC.define()
common.define_renamed_flags(algorithm="methods", lam="lams")


class Settings(SPEC.settings_class("_Fields", ("aggregator_key", dict), ("given", str),
                                   module=__name__)):
  """`benchmarks.run`'s settings (`SPEC`), checked (`from_flags`), the dataset's
  preset filled in, lists parsed; `protocol` a `tff_silo.privacy.protocol.
  PrivacyProtocol`; `aggregator` None until `main` chooses the
  `tff_silo.aggregators.AggregatorChoice` once the silos are loaded (DP aggregators
  need their number), `aggregator_key` the flags' part of a run key
  (`common.aggregator_key`); `given` a row's `flags`."""

  @property
  def private(self) -> bool:
    return self.epsilon is not None

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags and fills the dataset's preset; raises UsageError."""
    SPEC.check_choices()
    common.check_backend(FLAGS.backend, FLAGS.device, FLAGS.xla)
    common.check_aggregator_flags()
    SPEC.check_applies(FLAGS.methods, FLAGS.dataset, FLAGS.epsilon is not None)
    unaggregated = sorted(m for m in FLAGS.methods if m not in AGGREGATED)
    if unaggregated and FLAGS["aggregator"].present and FLAGS.aggregator != "mean":
      raise UsageError(f"--aggregator applies to --methods={','.join(AGGREGATED)} only; "
                       f"{','.join(unaggregated)} has no server mean: run it apart")
    if FLAGS.epsilon is not None:
      common.check_epsilon("epsilon", FLAGS.epsilon, "unset it for a non-private run")
    preset = configs.PRESETS[FLAGS.dataset]
    values = SPEC.values()
    for name in ("rounds", "batch_size", "clip", "lr", "delta", "num_clusters",
                 "clients_per_round", "hypothesis_init_std"):
      if values[name] is None:
        values[name] = getattr(preset, name)
    values["lams"] = SPEC.parsed("lams") or (preset.lam,)
    values["seeds"] = tuple(common.parse_seeds(FLAGS.seeds))
    SPEC.check_ranges(values)
    values["protocol"], values["sampling"] = _protocol_and_sampling(preset)
    values["standardize"] = _standardize()
    _check_clustering()
    _check_data_flags()
    common.check_output(FLAGS.output, SIGNATURE)
    if FLAGS.ledger_csv is not None:
      common.check_writable(FLAGS.ledger_csv, "ledger_csv")
    common.check_save_models()
    common.check_shards_flag(common.backend_for(FLAGS.backend))
    key = common.aggregator_key(FLAGS.aggregator, FLAGS.silo_epsilon, FLAGS.silo_delta,
                                FLAGS.aggregator_clip)
    values["aggregator"] = None   # (chosen in main)
    return cls(**values, aggregator_key=key, given=SPEC.given())


def _protocol_and_sampling(preset):
  """The privacy protocol and batch sampling the flags name; raises UsageError."""
  from tff_silo.privacy import protocol as protocol_lib
  if FLAGS.accountant == "pld" and FLAGS.neighbouring != "add_remove":
    raise UsageError("--accountant=pld accounts add_remove (Poisson) DP-SGD only; use "
                     f"--accountant=rdp with --neighbouring={FLAGS.neighbouring}")
  if FLAGS.protocol == "paper":
    if FLAGS.epsilon is None:
      raise UsageError("--protocol=paper is a protocol of private runs: give --epsilon, "
                       "or drop --protocol")
    if FLAGS["public_silo_sizes"].present and not FLAGS.public_silo_sizes:
      raise UsageError("--protocol=paper takes the silo sizes as public: drop "
                       "--nopublic_silo_sizes, or use --protocol=custom")
    if FLAGS.neighbouring != "add_remove" or FLAGS.sampling not in (None, "poisson",
                                                                    "shuffle"):
      raise UsageError("--protocol=paper is add_remove with poisson (or, as the paper's "
                       "code runs, shuffle) sampling; drop --neighbouring or use "
                       "--protocol=custom")
    protocol = dataclasses.replace(protocol_lib.PAPER, accountant=FLAGS.accountant)
    sampling = FLAGS.sampling or "poisson"
  else:
    sampling = FLAGS.sampling or protocol_lib.SAMPLING_FOR[FLAGS.neighbouring][0]
    public = FLAGS.public_silo_sizes or FLAGS.neighbouring == "replace_one"
    size = (FLAGS.assumed_silo_size if FLAGS.assumed_silo_size is not None
            else None if public else preset.assumed_silo_size)
    if FLAGS.epsilon is not None and not public and size is None:
      raise UsageError(f"--dataset={FLAGS.dataset} has no preset public silo size: "
                       "give --assumed_silo_size or --public_silo_sizes")
    try:
      protocol = protocol_lib.PrivacyProtocol(FLAGS.neighbouring, FLAGS.public_silo_sizes,
                                              size, accountant=FLAGS.accountant)
    except ValueError as e:
      raise UsageError(str(e)) from None
  if FLAGS.epsilon is not None:
    try:
      protocol.check_sampling(sampling)
    except ValueError as e:
      raise UsageError(f"--sampling: {e}") from None
  return protocol, sampling


def _standardize():
  """The tabular datasets' feature standardization; raises UsageError."""
  mode = FLAGS.standardize   # (one of STANDARDIZE or None: `SPEC`)
  if FLAGS.dataset not in TABULAR:
    if mode not in (None, "none"):
      raise UsageError(f"--standardize applies to {', '.join(TABULAR)}; "
                       f"{FLAGS.dataset} comes in a fixed scale")
    return None
  public_ranges = datasets.DATASETS[FLAGS.dataset].public_ranges
  if mode is None:
    mode = ("silo" if FLAGS.epsilon is None or FLAGS.protocol == "paper"
            else "public" if public_ranges else "none")
  if mode == "public" and not public_ranges:
    raise UsageError(f"--standardize=public needs documented feature ranges, which "
                     f"{FLAGS.dataset} lacks: use none, dp or silo")
  if mode == "dp":
    if FLAGS.epsilon is None:
      raise UsageError("--standardize=dp needs --epsilon (it spends a share of it)")
    if FLAGS.standardize_clip is None:
      raise UsageError("--standardize=dp needs --standardize_clip > 0 (the L2 clip of "
                       "a feature vector)")
  return mode


def _check_clustering():
  if "dprivate_clustering" not in FLAGS.methods:
    return
  if FLAGS.epsilon is not None:
    raise UsageError("dprivate_clustering is protected by d-privacy (--nu), not "
                     "DP-SGD: run it without --epsilon")
  if FLAGS.leakage_cap is not None and FLAGS.nu is None:
    raise UsageError("--leakage_cap needs --nu (without sanitization leakage is unbounded)")
  if FLAGS.patience is not None and FLAGS.dataset != "two_cluster":
    raise UsageError("--patience needs validation users, which only --dataset="
                     "two_cluster provides")


def _check_data_flags():
  if FLAGS.dataset in READ:
    if not FLAGS.data_dir:
      raise UsageError(f"--data_dir is required for --dataset={FLAGS.dataset}")
    if not os.path.isdir(FLAGS.data_dir):
      raise UsageError(f"--data_dir {FLAGS.data_dir} is not a directory")
  else:
    common.check_applies("data_dir", READ, [FLAGS.dataset], "--dataset")
  if FLAGS["corruption"].present and not FLAGS.corrupt_silos:
    raise UsageError("--corruption applies with --corrupt_silos >= 1 only")


def _recipe(seed, s) -> dict:
  """What the run's data is made of (`benchmarks.datasets`): saved with a run's
  models instead of the data."""
  recipe = dict(dataset=s.dataset, seed=seed, data_dir=s.data_dir,
                standardize=s.standardize)
  if s.standardize == "dp":
    from tff_silo.data import preprocessing
    neighbouring = s.protocol.neighbouring
    recipe.update(
        standardize_clip=s.standardize_clip, neighbouring=neighbouring,
        standardize_noise_multiplier=preprocessing.dp_noise_multiplier(
            s.epsilon, s.delta, s.standardize_budget_share, neighbouring))
  if s.dataset == "digits":
    recipe["mask_probability"] = s.mask_probability
  return dict(recipe, **_split(s), **_corruption(s))


def _load(seed, s):
  """(silos, per-silo preprocessing DpEvents or None), the first --corrupt_silos
  misbehaving; loaded once per process (on a Ray worker: from the recipe)."""
  return datasets.cached(datasets.load, _recipe(seed, s))


def _model_builder(algorithm, s) -> dict:
  """Keyword arguments of `models.linear_regression` where the run does not use
  `models.model_for` (two_cluster: Galli et al.'s y = x^T theta, no bias)."""
  if s.dataset != "two_cluster":
    return {}
  return dict(name="linear_regression", bias=False,
              objective="rmse" if algorithm == "dprivate_clustering" else "squared")


def _model(silos, algorithm, s):
  from tff_silo import models
  builder = _model_builder(algorithm, s)
  if builder:
    builder.pop("name")
    return models.linear_regression(silos.feature_shape[0], **builder)
  return models.model_for(silos)


def _save(result, seed, algorithm, lam, s, silos, row) -> str:
  """Saves the run under --save_models (`tff_silo.runs`); its folder."""
  from tff_silo import runs
  key = row["run_key"]
  folder = runs.run_folder(s.save_models, f"{algorithm}-lam{lam:g}-seed{seed}", key)
  if algorithm == "dprivate_clustering":   # each user's hypothesis
    weights = [result.hypotheses[g] for g in result.assignments]
    server = result.hypotheses
  else:
    weights, server = result.silo_weights, result.server_weights
  runs.save(folder, run_key=key, silo_weights=weights, server_weights=server,
            model=runs.model_spec(_model(silos, algorithm, s), silos,
                                  **_model_builder(algorithm, s)),
            data=_recipe(seed, s), silos=silos, privacy=getattr(result, "privacy", None),
            info=dict(binary="benchmarks.run", algorithm=algorithm, lam=lam, seed=seed,
                      rounds=row["rounds"], epsilon=row["epsilon"], delta=row["delta"],
                      clip=row["clip"], lr=row["lr"], batch_size=row["batch_size"],
                      metric=row["metric"], test_metric=row["test_metric"],
                      aggregator=row.get("aggregator"), flags=json.loads(row["flags"]),
                      training=_training(algorithm, lam, s)))
  return folder


def _training(algorithm, lam, s):
  """How to train the same way again (`tff_silo.runs.SavedRun.training_run`, for
  shadow models), or None where it cannot be redone from settings alone."""
  from tff_silo import runs
  if (algorithm == "dprivate_clustering" or not s.aggregator.plain
      or s.dataset == "two_cluster"):
    return None
  private = s.private
  return runs.training_settings(
      _definition_settings(algorithm, lam, s), target_epsilon=s.epsilon,
      target_delta=s.delta if private else None,
      protocol=s.protocol if private else None)


def _definition_settings(algorithm, lam, s) -> dict:
  """`algorithms.silo_definition`'s name and keyword arguments for a run of the
  MR-MTL family, IFCA or Mocha but its seed and data: what `_build` builds, and
  what a saved run retrains with (`_training`; a plain mean's factory is its name)."""
  return dict(name=algorithm, client_learning_rate=s.lr, batch_size=s.batch_size,
              rounds=s.rounds, lam=lam, local_epochs=s.local_epochs,
              l2_norm_clip=s.clip if s.private else None, sampling=s.sampling,
              aggregator=s.aggregator.factory, finetune_fraction=s.finetune_fraction,
              num_clusters=s.num_clusters, selection_fraction=s.selection_fraction,
              selection_budget_share=s.selection_budget_share, noise=s.noise)


def _build(algorithm, lam, seed, silos, s):
  """The run's TF-only definition, which the drivers run on either backend."""
  from tff_silo import algorithms
  model = _model(silos, algorithm, s)
  if algorithm == "dprivate_clustering":
    return algorithms.dprivate_clustering_algorithm(
        model, silos.feature_shape, client_learning_rate=s.lr,
        batch_size=s.batch_size, num_clusters=s.num_clusters, nu=s.nu,
        local_epochs=s.local_epochs, kmeans_iterations=s.kmeans_iterations,
        init_std=s.hypothesis_init_std, init_seed=seed)
  settings = _definition_settings(algorithm, lam, s)
  return algorithms.silo_definition(
      settings.pop("name"), model, silos.feature_shape, cluster_init_seed=seed,
      num_silos=silos.num_silos, **settings)


def _runs(s):
  """(seed, algorithm, lambda) of every run, a method's seeds one after another (on
  the vectorized backend they run stacked: `_batches`)."""
  for algorithm in s.methods:
    for lam in (s.lams if algorithm in LAMBDA_ALGORITHMS else [0.0]):
      for seed in s.seeds:
        yield seed, algorithm, lam


def _run_seed(seed, algorithm, lam, s) -> int:
  """The run's keys' seed: from --seeds' `seed` and everything the run trains with
  (its run key), so that no two runs share batches or noise."""
  return common.run_seed(seed, _run_key(seed, algorithm, lam, s))


def _algorithm_flags(algorithm, s):
  """The clustering settings a run of `algorithm` depends on, and finetuning's
  share of FedAvg rounds (row columns)."""
  return {name: getattr(s, name) for name, param in SPEC.params.items()
          if (param.key == "only_where_applies" or name == "finetune_fraction")
          and SPEC.applies(name, s, algorithm)}


def _run_key(seed, algorithm, lam, s):
  """Identifies a run by everything that determines its result: the settings
  `SPEC` marks, and what it does not hold."""
  key = SPEC.key(s, algorithm)
  if key.get("hypothesis_init_std") == 1.0:   # every run's before the flag:
    del key["hypothesis_init_std"]            # their keys stay the same
  return json.dumps(dict(
      key, algorithm=algorithm, lam=lam, seed=seed,
      **s.aggregator_key,
      **_protocol_columns(s, private=s.private),
      # pld runs only: the keys (and noise) of rdp runs stay those of before
      **({"accountant": "pld"} if s.private and s.protocol.accountant == "pld" else {}),
      # private runs only: the keys of runs without DP stay those of before
      **({"noise": s.noise} if s.private else {}),
      **_split(s), **_corruption(s)), sort_keys=True)


def _split(s) -> dict:
  """A test share other than the dataset's (nothing when --test_fraction is unset:
  the recipes and keys of runs before the flag stay the same)."""
  return {} if s.test_fraction is None else dict(test_fraction=s.test_fraction)


def _corruption(s) -> dict:
  """The misbehaving silos' settings (nothing when every silo is honest)."""
  return (dict(corrupt_silos=s.corrupt_silos, corruption=s.corruption)
          if s.corrupt_silos else {})


def _honest_columns(result, silos, s) -> dict:
  """With misbehaving silos: the pooled test metric of the honest ones."""
  import numpy as np
  if not s.corrupt_silos:
    return {}
  honest = slice(s.corrupt_silos, None)
  sizes = np.array([len(y) for y in silos.y_test])[honest]
  metric = np.asarray(result.silo_test_metric)[honest]
  return dict(**_corruption(s),
              honest_test_metric=float(np.sum(metric * sizes) / sizes.sum()))


def _clustering_columns(result, silos, algorithm, s):
  """ARI against the true clusters (where known), selection and leakage figures."""
  import numpy as np
  from sklearn.metrics import adjusted_rand_score
  dprivate = algorithm == "dprivate_clustering"
  assigned = result.assignments if dprivate else result.clusters
  if assigned is None:   # not a clustering method
    return {}
  ari = (float(adjusted_rand_score(silos.groups, assigned))
         if silos.groups is not None else None)
  # d-private clustering's final assignment is each user's lowest-loss hypothesis on
  # its training data, never released: under sanitization that figure is outside
  # the guarantee. IFCA's assignments under DP are its private selections.
  outside = dprivate and s.nu is not None
  columns = {"ari_outside_guarantee" if outside else "ari": ari}
  if not dprivate:
    privacy = result.privacy
    columns.update(
        num_selections=privacy.num_selections if privacy else None,
        selection_epsilon=float(np.max(privacy.selection_epsilon)) if privacy else None)
    return columns
  losses = [loss for _, loss in result.validation_history]
  small = sum(w.size for w in result.hypotheses[0]) <= 16
  columns.update(
      rounds_run=result.rounds, best_round=result.best_round,
      stopped_because=result.stopped_because,
      validation_loss=min(losses) if losses else None,
      leakage_per_participation=result.leakage_per_participation,
      leakage_max=float(result.leakage.max()), leakage_mean=float(result.leakage.mean()),
      participations_max=int(result.participations.max()), declined=result.declined,
      hypotheses=json.dumps([[np.round(w, 4).tolist() for w in h]
                             for h in result.hypotheses]) if small else None)
  return columns


def _protocol_columns(s, private=True):
  """What a DP row's guarantee is about (None for non-private runs)."""
  if not private:
    return dict(protocol=None, neighbouring=None, public_silo_sizes=None,
                assumed_silo_size=None)
  protocol = s.protocol
  return dict(protocol=protocol.name, neighbouring=protocol.neighbouring,
              public_silo_sizes=protocol.sizes_public,
              assumed_silo_size=protocol.assumed_silo_size)


def _aggregator_columns(s, result, algorithm):
  import numpy as np
  if algorithm == "dprivate_clustering":   # no server mean
    return {}
  return common.aggregator_columns(s.aggregator, result.rounds,
                                   result.aggregator_measurements,
                                   sum(np.size(w) for w in result.silo_weights[0]))


def _server_weights(s, privacy):
  """What weighs the server mean: n_k, the same public size for all, or nothing."""
  if not s.aggregator.weighted:
    return "unweighted"
  if privacy is not None and not s.protocol.sizes_public:
    return "equal (sizes private)"
  return "n_k"


def _privacy_columns(result):
  """The ledgers' epsilon (a bound only for sampling with an accounting)."""
  import numpy as np
  privacy = getattr(result, "privacy", None)
  if privacy is None:
    return dict(epsilon_spent_max=None, epsilon_spent_mean=None,
                epsilon_if_poisson_max=None, noise_multiplier_mean=0.0)
  spent = privacy.epsilon_spent
  bound = privacy.bounded
  return dict(epsilon_spent_max=float(np.max(spent)) if bound else None,
              epsilon_spent_mean=float(np.mean(spent)) if bound else None,
              epsilon_if_poisson_max=None if bound else float(np.max(spent)),
              noise_multiplier_mean=float(np.mean(privacy.noise_multipliers)),
              stopped_because=privacy.stopped_because, rounds_run=result.rounds)


def _train_columns(result, s):
  """The training metric: un-noised, so outside the guarantee under DP."""
  if getattr(result, "privacy", None) is None:
    return dict(train_metric=result.train_metric)
  if s.outside_guarantee_metrics:
    return dict(train_metric=None, train_metric_outside_guarantee=result.train_metric)
  return dict(train_metric=None)


def _row(result, seed, algorithm, lam, s, silos, backend, device):
  from importlib import metadata
  import numpy as np
  import tensorflow as tf
  from tff_silo.data import preprocessing
  privacy = getattr(result, "privacy", None)
  return dict(
      algorithm=algorithm, dataset=s.dataset, seed=seed, rounds=s.rounds,
      epsilon=s.epsilon, delta=s.delta if privacy is not None else None,
      lam=lam, lr=s.lr, batch_size=s.batch_size,
      clip=s.clip if privacy is not None else None, local_epochs=s.local_epochs,
      sampling=s.sampling if privacy is not None else None,
      **_protocol_columns(s, private=privacy is not None),
      accountant=s.protocol.accountant if privacy is not None else None,
      noise=s.noise if privacy is not None and algorithm != "dprivate_clustering"
      else None,
      standardize=s.standardize, **_split(s),
      standardize_inside_guarantee=(preprocessing.inside_guarantee(s.standardize)
                                    if privacy is not None and s.standardize else None),
      **_aggregator_columns(s, result, algorithm), **_honest_columns(result, silos, s),
      server_weights=_server_weights(s, privacy),
      num_silos=silos.num_silos, metric=result.metric,
      **_train_columns(result, s), test_metric=result.test_metric,
      **({} if not s.eval_every else dict(history=json.dumps(
          [[r, round(test, 6)] for r, _, test in result.history]))),
      **_privacy_columns(result),
      **_algorithm_flags(algorithm, s), **_clustering_columns(result, silos, algorithm, s),
      backend=backend, device=device, wall_seconds=result.wall_seconds,
      runs_stacked=getattr(result, "runs_stacked", 1),
      seconds_per_round_median=float(np.median(result.round_seconds)),
      peak_memory_mb=common.peak_memory_mb(),
      tff_version=metadata.version("tensorflow-federated"), tf_version=tf.__version__,
      run_key=_run_key(seed, algorithm, lam, s),
      flags=s.given,
      finished=time.strftime("%Y-%m-%dT%H:%M:%S"))


def _print_table(rows, s):
  import pandas as pd
  from benchmarks import tables
  df = pd.DataFrame(rows)
  print(f"\n{s.dataset}: {rows[0]['metric']} over {len(set(df.seed))} seed(s), "
        f"epsilon={s.epsilon}, rounds={rows[0]['rounds']} (a row's epsilon covers "
        "that run; runs on the same silos compose)")
  tables.print_frame(tables.summary_table(df), number=".4f")


def _stack_key(run, s, backend):
  """Runs stacked into one program (`simulation.run_simulations`): on the
  vectorized backend, consecutive seeds of one (algorithm, lambda) of the MR-MTL
  family (not with --ledger_csv, whose rows name no seed, nor --shards); every
  other run alone."""
  _, algorithm, lam = run.spec
  if (backend == "vectorized" and s.ledger_csv is None and not s.shards
      and algorithm not in IFCA_ALGORITHMS and algorithm != "dprivate_clustering"):
    return algorithm, lam
  return None


def _batch_rows(s, batch, progress, shards_on=None, replay=None):
  """The rows of a batch of runs (stacked by `_stack_key`), its models saved under
  --save_models: the plan's work, in this process or on a Ray worker; with
  --shards, in this process with each run's silos on shards of the executor
  `shards_on` (`_sharded`); with --import_xla, its rounds' results and seconds
  those of the bundle's `replay` (`tff_silo.bundles.Replay`)."""
  backend = common.backend_for(s.backend, s.aggregator)
  device = common.device_scope(s.device, backend, s.xla, replay)[1]
  rows = []
  first_call = replay.calls if replay is not None else 0
  with common.executables_called(s) as called:
    results = (_sharded(batch, s, progress, shards_on) if s.shards
               else _simulate(batch, s, progress, backend))
  memory = common.device_memory_mb(called, replay, first_call)
  if replay is not None:
    seconds = replay.call_seconds(first_call, replay.calls)
    wall = float(replay.call_seconds(first_call, replay.calls, evaluations=True).sum())
    results = [dataclasses.replace(r, round_seconds=seconds, wall_seconds=wall)
               for r in results]
  for run, result in zip(batch, results):
    seed, algorithm, lam = run.spec
    silos = _load(seed, s)[0]
    row = _row(result, seed, algorithm, lam, s, silos, backend, device)
    if s.shards:
      row["shards"] = s.shards
    if memory is not None:
      row["device_memory_mb"] = memory
    if s.save_models:
      row["saved_to"] = common.saved_or_reported(
          lambda: _save(result, seed, algorithm, lam, s, silos, row),
          f"{algorithm} lam={lam} seed={seed}")
    rows.append(row)
  return rows


def _simulate(batch, s, progress, backend):
  """The results of a batch of runs (stacked by `_stack_key`), one per run."""
  from tff_silo import data, simulation
  seed, algorithm, lam = batch[0].spec
  process = lambda run: _build(run.spec[1], run.spec[2], run.spec[0],
                               _load(run.spec[0], s)[0], s)
  if algorithm == "dprivate_clustering":
    from tff_silo import dprivate_simulation
    silos = _load(seed, s)[0]
    validation = (data.two_cluster_linear_silos(num_users=VALIDATION_USERS,
                                                seed=[seed, 1])
                  if s.dataset == "two_cluster" else None)
    return [dprivate_simulation.run_dprivate_clustering(
        process(batch[0]), silos, rounds=s.rounds,
        clients_per_round=s.clients_per_round or silos.num_silos,
        seed=_run_seed(seed, algorithm, lam, s),
        leakage_cap=s.leakage_cap, validation=validation, patience=s.patience,
        progress=progress, backend=backend)]
  runs = [simulation.Run(process(run), _load(run.spec[0], s)[0],
                         **_run_options(run, s, _load(run.spec[0], s)[1]))
          for run in batch]
  return simulation.run_simulations(runs, rounds=s.rounds,
                                    eval_every=s.eval_every, progress=progress,
                                    backend=backend)


def _run_options(run, s, preprocessing_events) -> dict:
  """What `simulation.Run` takes of a run besides its process and silos."""
  seed, algorithm, lam = run.spec
  private = s.private
  return dict(target_epsilon=s.epsilon, target_delta=s.delta if private else None,
              seed=_run_seed(seed, algorithm, lam, s),
              protocol=s.protocol if private else None, ledger_csv=s.ledger_csv,
              preprocessing_events=preprocessing_events)


def _sharded(batch, s, progress, executor):
  """The results of a batch of one run with its silos on `s.shards` shards of
  `executor` (`tff_silo.sharding`), each loading its share of the data from the
  recipe where it runs (`_shard_problem`)."""
  from tff_silo import sharding
  (run,) = batch
  seed, algorithm, lam = run.spec
  silos, events = _load(seed, s)
  work = executors.Work(_shard_problem, s, "benchmarks.run", data=(
      datasets.travelling(datasets.load, _recipe(seed, s)),)
      if executor.name == "ray" else ())
  shards = executor.shards([executor.recipe(work, (run.spec, lo, hi)) for lo, hi in
                            sharding.bounds(silos.num_silos, s.shards)])
  return [sharding.run_sharded(
      _build(algorithm, lam, seed, silos, s), shards, rounds=s.rounds,
      eval_every=s.eval_every, progress=progress, name=silos.name,
      **_run_options(run, s, events))]


def _shard_problem(s, shard, progress):
  """A shard's recipe (`executors.recipe`), run where the shard is: (the run's
  definition, its silos lo..hi)."""
  del progress
  from tff_silo import sharding
  (seed, algorithm, lam), lo, hi = shard
  silos = _load(seed, s)[0]
  return _build(algorithm, lam, seed, silos, s), sharding.silo_data(silos, lo, hi)


def _aggregator(s, silos):
  """The server's aggregator the flags name (DP factories need the number of
  silos); raises UsageError."""
  choice = common.aggregator_choice(silos.num_silos, s.rounds)
  if not choice.weighted and any(a in IFCA_ALGORITHMS for a in s.methods):
    raise UsageError(f"--aggregator={choice.name} is unweighted; the ifca "
                     "algorithms need a weighted one (mean, robust, compressed; "
                     "their per-cluster means weigh non-members 0)")
  return choice


def _check(run, silos, s):
  """The run's process, raising the one-line errors of settings the data cannot
  take, before any run trains."""
  _, algorithm, lam = run.spec
  with common.usage_errors():
    process = _build(algorithm, lam, run.spec[0], silos, s)
  if s.batch_size > max(silos.train_sizes):
    raise UsageError(f"--batch_size={s.batch_size} is larger than every silo "
                     f"(the largest has {max(silos.train_sizes)} training examples)")
  if ((algorithm in IFCA_ALGORITHMS or algorithm == "dprivate_clustering")
      and s.num_clusters > silos.num_silos):
    raise UsageError(f"--num_clusters={s.num_clusters} is more than the "
                     f"{silos.num_silos} silos")
  if s.shards:
    if s.shards > silos.num_silos:
      raise UsageError(f"--shards={s.shards} is more than the {silos.num_silos} silos")
    from tff_silo import sharding
    with common.usage_errors():
      sharding.shard_runner(process)
  return process


def _export(todo, s, recording, backend) -> None:
  """--export_xla: the pending runs' rounds recorded, not run (no row), and written
  as a bundle."""
  from tff_silo import bundles
  with common.usage_errors(), common.placement(s, recording):
    for batch in plan.consecutive(todo.pending, lambda run: _stack_key(run, s, backend)):
      _simulate(batch, s, None, backend)
    manifest = recording.write(s.export_xla, about=dict(
        binary="benchmarks.run", command=" ".join(sys.argv[1:]),
        runs=[run.tag for run in todo.pending], privacy=bundles.OUTSIDE_GUARANTEE))
  common.print_exported(s.export_xla, f"{len(todo.pending)} run(s)", manifest)


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = Settings.from_flags()
  common.check_device_memory()
  bundle = common.bundle_from_flags(dict(
      dprivate_clustering="--patience stops on the validation loss, which a bundle's "
      "rounds cannot know before they are replayed: drop --patience (the run then "
      "keeps its best round by validation)") if s.patience is not None else {})
  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()
  todo = plan.Plan(
      [plan.Run(_run_key(seed, algorithm, lam, s),
                f"{algorithm} lam={lam} seed={seed}", (seed, algorithm, lam))
       for seed, algorithm, lam in _runs(s)],
      output=s.output, signature=SIGNATURE, resume=s.resume,
      skipped_note="; its models are not saved again" if s.save_models else "")
  executor = executors.from_flags()
  loaded = {}
  with common.usage_errors():   # includes DataError: a bad file or setting
    for seed in dict.fromkeys(run.spec[0] for run in todo.pending):
      loaded[seed] = _load(seed, s)
    if loaded:   # (else every run is done: nothing to choose)
      s = dataclasses.replace(s, aggregator=_aggregator(s, loaded[seed][0]))
  for run in todo.pending:
    _check(run, loaded[run.spec[0]][0], s)
  backend = common.backend_for(s.backend, s.aggregator)
  if s.export_xla:
    _export(todo, s, bundle, backend)
    return
  work = executors.Work(_batch_rows, s, "benchmarks.run", data=tuple(
      datasets.travelling(datasets.load, _recipe(seed, s))
      for seed in loaded) if executor.name == "ray" and not s.shards else ())
  if s.shards:   # the runs one by one here, each with its shards on the executor
    executor.check_shards(s.shards)
    work = work._replace(function=functools.partial(_batch_rows, shards_on=executor))
    executor = executors.Local()
  if bundle is not None:
    work = work._replace(function=functools.partial(_batch_rows, replay=bundle))
  pending = bool(todo.pending)
  rows = todo.execute(
      work, rounds=s.rounds, stack_key=lambda run: _stack_key(run, s, backend),
      batch_tag=lambda batch: f"{batch[0].spec[1]} lam={batch[0].spec[2]} seeds="
      f"{','.join(str(run.spec[0]) for run in batch)} (stacked)",
      scope=common.placement(s, bundle), executor=executor)
  if bundle is not None and pending:
    with common.usage_errors():
      bundle.finish()
  _print_table(rows, s)


def run():
  common.run_main(main)


if __name__ == "__main__":
  run()
