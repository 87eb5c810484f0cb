r"""HyperNetFL with user-level DP (UDP-Alg, Nemala et al. CIKM'23) against FedAvg.

    uv run python -m benchmarks.hypernet                   # digits: pFedHN vs FedAvg
    uv run python -m benchmarks.hypernet --methods=hypernet --clips=0.05,0.1,0.2 \
        --noise_multipliers=5,10 --sampling_rates=0.05,0.1,0.2 --delta=1e-5

Users are label-skewed partitions (`--classes_per_user` classes each, unequal sizes)
of the offline digits, of Fashion-MNIST (`--data_dir` holding its IDX files, e.g.
/usr/share/datasets/fashion-mnist from `apt-get install dataset-fashion-mnist`), of
CIFAR-10 (`--data_dir` holding cifar-10-batches-py) or the FEMNIST writers
(`--cache_dir` holding TFF's emnist_all.sqlite). `hypernet` runs one process per
(q, S, z) of the grid; `--noise_multipliers=0` without `--clips` is
the noiseless pFedHN. `fedavg` trains one global model of the same target CNN on all
users every round. Both run on the vectorized backend by default (`--backend=tff`:
TFF's runtime, the same numbers). One CSV row per run (accuracy per user, mean
accuracy, user-level epsilon at --delta, backend, device, wall time, peak memory;
`history` lists [round, pooled test accuracy] every --eval_every rounds) is appended
to --output; a table of means is printed.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import sys
import time

from absl import flags

from benchmarks import common, datasets, executors, plan
from benchmarks.common import UsageError
from benchmarks.harness import spec

ALGORITHMS = ("hypernet", "fedavg")
DATASETS = datasets.taking("hypernet")
DATA_DIR_DATASETS = datasets.reading("hypernet")

FLAGS = flags.FLAGS
_HYPERNET = dict(applies_to=("hypernet",))
_HYPERNET_KEY = dict(applies_to=("hypernet",), key="only_where_applies")

# The settings, in the order a row's `flags` record lists them. Their run key: those
# marked `key`, and `_run_key`'s (the user-level DP settings, delta where noised).
SPEC = spec.Spec(
    methods=spec.strings(["hypernet", "fedavg"], "Comma-separated, of {choices}.",
                         choices=ALGORITHMS),
    dataset=spec.string("digits", "One of {choices}.", choices=DATASETS, key="always"),
    data_dir=spec.string(None, "fmnist: folder holding Fashion-MNIST's IDX files; "
                         "cifar10: folder holding cifar-10-batches-py.",
                         datasets=DATA_DIR_DATASETS, key="always"),
    cache_dir=spec.string(None, "femnist: folder holding emnist_all.sqlite.",
                          datasets=("femnist",), key="always"),
    num_users=spec.integer(50, "Users N.", bounds=">= 1", key="always"),
    classes_per_user=spec.integer(2, "digits/fmnist/cifar10: classes of each user.",
                                  bounds=">= 1", datasets=("digits", "fmnist", "cifar10"),
                                  key="always"),
    sampling_rates=spec.numbers(["0.1"], "Comma-separated user sampling rates q.",
                                bounds="(0, 1]", **_HYPERNET),
    clips=spec.numbers([], "Comma-separated clips S of a user's contribution (empty: "
                       "no clipping).", bounds="> 0", **_HYPERNET),
    noise_multipliers=spec.numbers(["0"], "Comma-separated noise multipliers z (0: no "
                                   "noise).", bounds=">= 0", **_HYPERNET),
    weight_cap=spec.real(None, "w_hat in w_u = min(|D_u| / w_hat, 1); unset: every "
                         "w_u = 1.", **_HYPERNET),
    public_user_sizes=spec.boolean(False, "With --weight_cap: the mean's W = sum w_u "
                                   "from the users' sizes, declared public (the "
                                   "paper's assumption; rows say so). Without it W = N, "
                                   "the number of users.", **_HYPERNET),
    public_user_count=spec.integer(None, "W of the mean's fixed denominator q W, a user "
                                   "count fixed before training and public (e.g. "
                                   "--num_users as declared). Unset (and without "
                                   "--public_user_sizes): W = N, read from the users "
                                   "present; rows then say the guarantee does not "
                                   "hold.", **_HYPERNET),
    delta=spec.real(1e-5, "delta of the reported user-level epsilon.", bounds="(0, 1)"),
    rounds=spec.integer(200, "Rounds T.", bounds=">= 1", key="always"),
    local_steps=spec.integer(20, "K, local SGD steps per sampled user and round.",
                             bounds=">= 1", **_HYPERNET_KEY),
    batch_size=spec.integer(16, "Local mini-batch size.", bounds=">= 1", key="always"),
    lr=spec.real(0.05, "eta, the users' SGD step size (FedAvg's too).", bounds="> 0",
                 key="always", key_as="client_lr"),
    hypernet_lr=spec.real(0.1, "lambda, the step size of phi.", bounds="> 0",
                          **_HYPERNET_KEY),
    embedding_lr=spec.real(0.1, "zeta, the step size of the embeddings.", bounds="> 0",
                           **_HYPERNET_KEY),
    hidden_width=spec.integer(100, "Width of the hypernetwork's hidden layers.",
                              bounds=">= 1", **_HYPERNET_KEY),
    embedding_dim=spec.integer(None, "Embedding size (default 1 + N / 4).",
                               bounds=">= 1", **_HYPERNET_KEY),
    channels=spec.numbers(["16", "32"], "Target CNN: channels of the two convs.",
                          item=int, unique=False, key="always"),
    dense=spec.integer(64, "Target CNN: width of the hidden dense layer.", bounds=">= 1",
                       key="always"),
    fedavg_local_epochs=spec.integer(1, "FedAvg: local epochs per round.", bounds=">= 1",
                                     applies_to=("fedavg",), key="only_where_applies"),
    seeds=spec.numbers(["0"], "Comma-separated seeds (partition, init, sampling, "
                       "noise).", item=int),
    eval_every=spec.integer(0, "Also evaluate every this many rounds (0: end).",
                            bounds=">= 0"),
    plot=spec.string(None, "Also write a PNG here of mean user accuracy against epsilon "
                     "and against a round's signal-to-noise bound, for every row in "
                     "--output of this --dataset and --num_users (a study's commands "
                     "share one --output)."),
    **common.backend_group("both algorithms; the user-level DP mean"),
    **spec.options(common.save_models_group(
        "every run (and a hypernetwork run's phi and embeddings; FedAvg's global "
        "model)"), given=True),
    # Not in the `flags` record:
    **common.DEVICE_MEMORY_GROUP,
    **common.BUNDLE_GROUP,
    **common.output_group(output=("hypernet.csv", "CSV rows are appended to.")),
    resume=spec.boolean(True, "Skip runs whose row is already in --output.",
                        given=False),
)
SPEC.define()
common.define_renamed_flags(algorithm="methods", client_lr="lr",
                             sampling_rate="sampling_rates", l2_norm_clip="clips",
                             noise_multiplier="noise_multipliers")
# Columns every row of this binary has: an existing --output without them is refused.
SIGNATURE = ("run_key", "algorithm", "mean_user_accuracy")


class Settings(SPEC.settings_class("_Fields", ("grid", tuple), ("given", str),
                                   module=__name__)):
  """`benchmarks.hypernet`'s settings (`SPEC`), checked (`from_flags`), lists
  parsed; `grid` holds the `UserDPSettings` of every (q, S, z) asked for, `given`
  a row's `flags`."""

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags; raises UsageError."""
    SPEC.check_choices()
    common.check_backend(FLAGS.backend, FLAGS.device, FLAGS.xla)
    SPEC.check_applies(FLAGS.methods, FLAGS.dataset)
    entry = datasets.DATASETS[FLAGS.dataset]
    if entry.files and not entry.files_optional and not FLAGS.data_dir:
      raise UsageError(f"--dataset={FLAGS.dataset} needs --data_dir (the folder with "
                       f"{entry.files})")
    if (FLAGS.dataset in DATA_DIR_DATASETS and FLAGS.data_dir
        and not os.path.isdir(FLAGS.data_dir)):
      raise UsageError(f"--data_dir {FLAGS.data_dir} is not a directory")
    if FLAGS.dataset == "femnist" and FLAGS.cache_dir and not os.path.isdir(
        FLAGS.cache_dir):
      raise UsageError(f"--cache_dir {FLAGS.cache_dir} is not a directory")
    channels = SPEC.parsed("channels")
    if len(channels) != 2 or min(channels) < 1:
      raise UsageError(f"--channels must be two positive integers; got "
                       f"{FLAGS.channels}")
    values = dict(SPEC.values(), channels=channels,
                  seeds=tuple(common.parse_seeds(FLAGS.seeds)),
                  **{name: SPEC.parsed(name) for name in
                     ("sampling_rates", "clips", "noise_multipliers")})
    SPEC.check_ranges(values)
    clips = values["clips"] or [None]
    noises = values["noise_multipliers"]
    if FLAGS.public_user_sizes and FLAGS.weight_cap is None:
      raise UsageError("--public_user_sizes applies with --weight_cap only (without it "
                       "every w_u = 1 and W = N)")
    if clips == [None] and any(z > 0 for z in noises):
      raise UsageError("--noise_multipliers > 0 needs --clips (S, the clip of a user's "
                       "contribution)")
    if FLAGS["delta"].present and not any(z > 0 for z in noises):
      raise UsageError("--delta applies to noised runs only: give --noise_multipliers "
                       "> 0, or drop --delta")
    from tff_silo.privacy.user_level import UserDPSettings
    grid = []
    for q, clip, z in itertools.product(values["sampling_rates"], clips, noises):
      try:
        grid.append(UserDPSettings(
            sampling_rate=q, l2_norm_clip=clip, noise_multiplier=z,
            weight_cap=FLAGS.weight_cap, public_sizes=FLAGS.public_user_sizes,
            public_user_count=FLAGS.public_user_count))
      except ValueError as e:
        raise UsageError(str(e)) from None
    common.check_output(FLAGS.output, SIGNATURE)
    common.check_save_models()
    if FLAGS.plot:
      common.check_figure_path(FLAGS.plot)
    return cls(**values, grid=tuple(grid), given=SPEC.given())


def _recipe(seed, s) -> dict:
  """The users' recipe (`benchmarks.datasets.hypernet_users`): how the binary loads
  them, saved with a run's models instead of the data."""
  return dict(hypernet_dataset=s.dataset, seed=seed, num_users=s.num_users,
              classes_per_user=s.classes_per_user, data_dir=s.data_dir,
              cache_dir=s.cache_dir)


def _users(seed, s):
  """The users of seed `seed`, loaded once per process (on a Ray worker: from the
  recipe)."""
  return datasets.cached(datasets.hypernet_users, _recipe(seed, s))


def _check_noise(users, s) -> None:
  """Refuses, before any run trains, a noise multiplier the integer noise cannot
  draw over the hypernetwork's P weights (`integer_law.grid_noise_multiplier`)."""
  noised = sorted({g.noise_multiplier for g in s.grid if g.noise_multiplier > 0})
  if "hypernet" not in s.methods or not noised:
    return
  from hypernet.training import hypernetwork
  from tff_silo.privacy import integer_law
  size = hypernetwork(_target(users, s), users, s.hidden_width,
                      s.embedding_dim).num_parameters
  for z in noised:
    try:
      integer_law.grid_noise_multiplier(z, size)
    except ValueError as e:
      raise UsageError(f"--noise_multipliers: {e}; the hypernetwork has P = {size:,} "
                       "weights (--hidden_width, --channels, --dense set it)") from None


def _run_rows(s, batch, progress, replay=None):
  """The row of a run (a batch of one), its models saved under --save_models: the
  plan's work, in this process or on a Ray worker; with --import_xla, its rounds'
  results and seconds those of the bundle's `replay` (`tff_silo.bundles.Replay`)."""
  (run,) = batch
  seed, algorithm, settings = run.spec
  backend = common.backend_for(s.backend)
  device = common.device_scope(s.device, backend, s.xla, replay)[1]
  users = _users(seed, s)
  first_call = replay.calls if replay is not None else 0
  with common.executables_called(s) as called:
    measured, trained = _train(users, seed, algorithm, settings, s, progress, backend)
  if replay is not None:
    measured.update(common.replayed_seconds(replay, first_call, s.rounds))
  row = _row(seed, algorithm, settings, s, users, measured, backend, device)
  memory = common.device_memory_mb(called, replay, first_call)
  if memory is not None:
    row["device_memory_mb"] = memory
  if s.save_models:
    row["saved_to"] = common.saved_or_reported(
        lambda: _save(seed, algorithm, users, row, trained, s),
        f"{algorithm} seed={seed}")
  return [row]


def _train(users, seed, algorithm, settings, s, progress, backend):
  """(the row's measured columns, what --save_models keeps) of one run."""
  return (_run_hypernet(users, settings, seed, s, progress, backend)
          if algorithm == "hypernet" else _run_fedavg(users, seed, s, progress, backend))


def _target(users, s):
  from tff_silo.models import small_cnn
  return small_cnn(users.feature_shape, users.num_classes, channels=s.channels,
                   hidden=s.dense)


def _run_hypernet(users, settings, seed, s, progress, backend):
  """(the row's measured columns, what --save_models keeps). The noise and user
  sampling take the run's own seed (`common.run_seed`); the initialization, which
  reads no data, takes `seed`."""
  import hypernet
  from tff_silo import runs
  run_seed = common.run_seed(seed, _run_key(seed, "hypernet", settings, s))
  target = _target(users, s)
  result, hn = hypernet.train(
      target, users, settings, rounds=s.rounds, client_lr=s.lr,
      batch_size=s.batch_size, local_steps=s.local_steps,
      hypernet_lr=s.hypernet_lr, embedding_lr=s.embedding_lr,
      hidden_width=s.hidden_width, embedding_dim=s.embedding_dim,
      delta=s.delta, init_seed=seed, noise_seed=run_seed,
      eval_every=s.eval_every, progress=progress, backend=backend)
  measured = _measured(result, settings, epsilon=result.epsilon, sigma=result.sigma,
                       mean_users_per_round=float(result.users_per_round.mean()),
                       hypernet_parameters=hn.num_parameters)
  model = _model_spec(target, users, s)
  model["hypernetwork"] = dict(num_users=hn.num_users, embedding_dim=hn.embedding_dim,
                               hidden_width=hn.hidden_width)
  return measured, dict(
      silo_weights=result.silo_weights, model=model,
      hypernetwork=(result.phi, result.embeddings),
      privacy=runs.user_level_privacy(settings, result.epsilon, s.delta,
                                      users.num_silos) if settings.private else None)


def _run_fedavg(users, seed, s, progress, backend):
  """(the row's measured columns, what --save_models keeps)."""
  from tff_silo import algorithms, simulation
  target = _target(users, s)
  algorithm = algorithms.fedavg_algorithm(
      target, users.feature_shape, client_learning_rate=s.lr,
      batch_size=s.batch_size, local_epochs=s.fedavg_local_epochs,
      init_seed=seed)
  result = simulation.run_simulation(algorithm, users, rounds=s.rounds, seed=seed,
                                     eval_every=s.eval_every, progress=progress,
                                     backend=backend)
  measured = _measured(result, epsilon=math.inf, sigma=0.0,
                       mean_users_per_round=float(users.num_silos))
  return measured, dict(silo_weights=result.silo_weights,
                        server_weights=result.server_weights,
                        model=_model_spec(target, users, s), privacy=None)


def _model_spec(target, users, s) -> dict:
  from tff_silo import runs
  return runs.model_spec(target, users, name="small_cnn", channels=list(s.channels),
                         hidden=s.dense)


def _measured(result, settings=None, **extra):
  """A row's measured columns from a run's result (`tff_silo.driver.RunResult`: the
  hypernetwork's or FedAvg's); its history as (round, pooled test accuracy). With
  user-level noise the un-noised training accuracy is outside the guarantee and is
  named so; so are the test accuracies, each from a user's own embedding
  (`UserDPSettings.covers`, which also says when W is not public), which the row
  says."""
  import numpy as np
  private = settings is not None and settings.private
  covers = (dict(accuracy_inside_guarantee=False, guarantee_covers=settings.covers)
            if private else {})
  per_user = result.silo_test_metric
  return dict(test_accuracy=result.test_metric,
              mean_user_accuracy=float(np.mean(per_user)),
              user_accuracy=json.dumps([round(float(a), 4) for a in per_user]),
              **covers,
              **{"train_accuracy_outside_guarantee" if private else "train_accuracy":
                 result.train_metric}, **extra,
              history=json.dumps([[r, round(test, 4)] for r, _, test in result.history]),
              wall_seconds=result.wall_seconds,
              seconds_per_round_median=float(np.median(result.round_seconds)))


def _runs(s):
  for seed in s.seeds:
    for algorithm in s.methods:
      for settings in (s.grid if algorithm == "hypernet" else [None]):
        yield seed, algorithm, settings


def _privacy_columns(settings):
  """The run's user-level DP columns (in its key too), with `noise` (integer, the
  user-level mean's: `user_level.integer_mean`) where it adds noise."""
  if settings is None:
    return dict(sampling_rate=None, l2_norm_clip=None, noise_multiplier=None,
                weight_cap=None, public_user_sizes=None, public_user_count=None)
  return dict(sampling_rate=settings.sampling_rate, l2_norm_clip=settings.l2_norm_clip,
              noise_multiplier=settings.noise_multiplier, weight_cap=settings.weight_cap,
              public_user_sizes=(settings.public_sizes if settings.weight_cap is not None
                                 else None),
              public_user_count=settings.public_user_count,
              **(dict(noise="integer") if settings.private else {}))


def _run_key(seed, algorithm, settings, s):
  """Identifies a run: the settings `SPEC` marks, its user-level DP settings (of
  the grid) and delta where it is noised."""
  return json.dumps(dict(
      SPEC.key(s, algorithm), algorithm=algorithm, seed=seed,
      delta=s.delta if settings is not None and settings.private else None,
      **{name: value for name, value in _privacy_columns(settings).items()
         if name != "public_user_count" or value is not None}), sort_keys=True)


def _row(seed, algorithm, settings, s, users, measured, backend, device):
  from importlib import metadata
  import tensorflow as tf
  return dict(
      algorithm=algorithm, dataset=s.dataset, seed=seed, num_users=users.num_silos,
      rounds=s.rounds, **_privacy_columns(settings),
      delta=s.delta if settings is not None and settings.private else None,
      local_steps=s.local_steps if algorithm == "hypernet" else None,
      local_epochs=s.fedavg_local_epochs if algorithm == "fedavg" else None,
      batch_size=s.batch_size, client_lr=s.lr,
      hypernet_lr=s.hypernet_lr if algorithm == "hypernet" else None,
      embedding_lr=s.embedding_lr if algorithm == "hypernet" else None,
      **measured, backend=backend, device=device,
      peak_memory_mb=common.peak_memory_mb(),
      tff_version=metadata.version("tensorflow-federated"), tf_version=tf.__version__,
      run_key=_run_key(seed, algorithm, settings, s),
      flags=s.given,
      finished=time.strftime("%Y-%m-%dT%H:%M:%S"))


def _save(seed, algorithm, users, row, trained, s) -> str:
  """Saves the run under --save_models (`tff_silo.runs`); its folder."""
  from tff_silo import runs
  key = row["run_key"]
  label = f"{algorithm}-seed{seed}" + ("" if algorithm == "fedavg" else "-" + "-".join(
      f"{name}{row[column]:g}" for name, column in (
          ("q", "sampling_rate"), ("S", "l2_norm_clip"), ("z", "noise_multiplier"))
      if row[column] is not None))
  folder = runs.run_folder(s.save_models, label, key)
  private = trained["privacy"] is not None
  runs.save(folder, run_key=key, silo_weights=trained["silo_weights"],
            server_weights=trained.get("server_weights", ()),
            hypernetwork=trained.get("hypernetwork"), model=trained["model"],
            data=_recipe(seed, s), silos=users, privacy=trained["privacy"],
            info=dict(binary="benchmarks.hypernet", algorithm=algorithm, seed=seed,
                      rounds=s.rounds, epsilon=row["epsilon"] if private else None,
                      delta=s.delta if private else None,
                      clip=row["l2_norm_clip"], lr=s.lr,
                      batch_size=s.batch_size, metric="accuracy",
                      test_metric=row["test_accuracy"], privacy_unit="user",
                      flags=json.loads(row["flags"]), training=None))
  return folder


def _majority_accuracy(users) -> float:
  """The mean over users of the test accuracy of predicting the user's most
  frequent training class: what a model that knows its user's labels but not the
  images scores (above 1 / classes on label-skewed users)."""
  import numpy as np
  return float(np.mean([np.mean(test == np.bincount(train.astype(int)).argmax())
                        for train, test in zip(users.y_train, users.y_test)]))


def _print_table(rows, s, majority):
  import pandas as pd
  from benchmarks import tables
  print(f"\n{s.dataset}: {s.num_users} users, {s.rounds} rounds, "
        f"epsilon at delta={s.delta}, user-level: it covers phi and the noised "
        "aggregates; the accuracies come from each user's un-noised embedding, "
        "outside it")
  tables.print_frame(tables.hypernet_summary(pd.DataFrame(rows)), number=".4f")
  print(f"Predicting each user's most frequent training class scores {majority:.4f} "
        "(mean over the seeds' users; it reads their labels without noise)")


def _plot(s, majority):
  """--plot: every row in --output of this dataset and number of users."""
  import pandas as pd
  from benchmarks import plots
  every = pd.read_csv(s.output)
  study = every[(every.dataset == s.dataset) & (every.num_users == s.num_users)]
  plots.hypernet_accuracy(study, delta=s.delta,
                          num_classes=datasets.DATASETS[s.dataset].num_classes,
                          majority=majority, path=s.plot)


def _export(todo, s, recording) -> None:
  """--export_xla: the pending runs' rounds recorded, not run (no row), and written
  as a bundle."""
  from tff_silo import bundles
  with common.usage_errors(), common.placement(s, recording):
    for run in todo.pending:
      seed, algorithm, settings = run.spec
      _train(_users(seed, s), seed, algorithm, settings, s, None,
             common.backend_for(s.backend))
    manifest = recording.write(s.export_xla, about=dict(
        binary="benchmarks.hypernet", command=" ".join(sys.argv[1:]),
        runs=[run.tag for run in todo.pending], privacy=bundles.OUTSIDE_GUARANTEE))
  common.print_exported(s.export_xla, f"{len(todo.pending)} run(s)", manifest)


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = Settings.from_flags()
  common.check_device_memory()
  bundle = common.bundle_from_flags()
  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()
  todo = plan.Plan(
      [plan.Run(_run_key(seed, algorithm, settings, s),
                f"{algorithm} seed={seed}" + ("" if settings is None else
                f" q={settings.sampling_rate} S={settings.l2_norm_clip} "
                f"z={settings.noise_multiplier}"), (seed, algorithm, settings))
       for seed, algorithm, settings in _runs(s)],
      output=s.output, signature=SIGNATURE, resume=s.resume,
      skipped_note="; its models are not saved again" if s.save_models else "")
  executor = executors.from_flags()
  seeds = list(dict.fromkeys(run.spec[0] for run in todo.pending))
  with common.usage_errors():   # every file read and every z checked before any run
    for seed in seeds:
      _check_noise(_users(seed, s), s)
  if s.export_xla:
    _export(todo, s, bundle)
    return
  work = executors.Work(_run_rows, s, "benchmarks.hypernet", data=tuple(
      datasets.travelling(datasets.hypernet_users, _recipe(seed, s))
      for seed in seeds) if executor.name == "ray" else ())
  if bundle is not None:
    work = work._replace(function=functools.partial(_run_rows, replay=bundle))
  pending = bool(todo.pending)
  rows = todo.execute(work, rounds=s.rounds, scope=common.placement(s, bundle),
                      executor=executor)
  if bundle is not None and pending:
    with common.usage_errors():
      bundle.finish()
  with common.usage_errors():
    majority = sum(_majority_accuracy(_users(seed, s)) for seed in s.seeds) / len(s.seeds)
  _print_table(rows, s, majority)
  if s.plot:
    _plot(s, majority)
    print(f"plot written to {s.plot}")


if __name__ == "__main__":
  common.run_main(main)
