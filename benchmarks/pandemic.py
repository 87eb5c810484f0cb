r"""Pandemic forecasting (thesis ch. 2, the PETs Prize pandemic track): MR-MTL with
node-level DP-SGD across regional silos, scored by pooled average precision.

    uv run python -m benchmarks.pandemic      # generates the `small` profile (50,000
                                       # persons) and runs the default grid

With `--data_dir` it reads the challenge's own layout (real files or a generated
set); otherwise it generates `--profile` with `--seed` into `--generated_dir`
(reused when already there). Every combination of --modes, --sample_sizes,
--methods, --noise_multipliers, --lams, --losses x --alphas, --architectures,
--feature_sets (Table 2.3's ablation) and --seeds is one run and one CSV row
(profile, mode, S1, feature set, sigma, clip, lambda, rounds, epsilon by Theorem
2.4.4's exponent for replacing a node (S = 2 S1 + 1 examples) and by the authors'
code with what it guarantees, delta 1/(10 n) per silo, AP, lift over the positive
rate and recall at 0.5 on the held-out households, load / train time, peak
memory); finished runs are skipped on a rerun. Figures: AP against epsilon (one
curve per setting), and time and peak memory against persons over every profile
in --output.

After the rows it prints the paired AP differences of MR-MTL, local training and
FedAvg by seed, or says why the rows cannot tell them apart (one seed, as by
default; or intervals that all include 0). Regions that differ and a larger
outbreak show the thesis' effect, personalization over one model, in 3-5 minutes
(benchmarks/RESULTS.md, "The binary's own comparison"):

    uv run python -m benchmarks.pandemic --region_transmission=0.5,1,2 \
        --region_home_weight=0.3,1,3 --final_week_rate=0.01 \
        --methods=mrmtl,local,fedavg --seeds=0,1,2
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

from benchmarks import common, executors, plan
from benchmarks.common import UsageError
from benchmarks.harness import spec
from tff_silo.pandemic import choices   # no TensorFlow

FLAGS = flags.FLAGS
SIGNATURE = ("run_key", "average_precision", "mode")
PROFILE_NAMES = ("tiny", "small", "medium", "large", "smoke")

# The settings; a run's key is `_run_key`'s (its grid point and the data's key).
SPEC = spec.Spec(
    data_dir=spec.string(None, "A folder in the challenge's layout (scenarios.txt, "
                         "centralized/, scenarioNN/); unset: generate --profile."),
    profile=spec.string("small", "Generated profile: tiny, small, medium, large or smoke "
                        "(2,000 to 2,600,000 persons).", choices=PROFILE_NAMES),
    seed=spec.integer(0, "Seed of the generated data."),
    final_week_rate=spec.real(0.003, "Generated data: the share of persons newly "
                              "infected in days 57..63 the outbreak is calibrated to.",
                              bounds="(0, 0.5)"),
    region_transmission=spec.numbers([], "Generated data, heterogeneous regions: one "
                                     "factor per region of the official partition (3; "
                                     "empty: one disease everywhere) scaling a "
                                     "susceptible's infection pressure.",
                                     bounds="(0, 100]", unique=False),
    region_home_weight=spec.numbers([], "Generated data, heterogeneous regions: one "
                                    "factor per region (3; empty: the same everywhere) "
                                    "scaling the weight of household contact-hours.",
                                    bounds="(0, 100]", unique=False),
    scenario=spec.string("scenario01", "The federated scenario (its clients are the "
                         "silos)."),
    methods=spec.strings(["mrmtl", "local", "fedavg", "centralized"], "Of mrmtl, local, "
                         "fedavg, centralized (one silo of everyone, two epochs).",
                         choices=choices.METHODS),
    modes=spec.strings(["honest"], "Of honest (degree cap, uniform batches: the epsilon "
                       "holds) and faithful (the authors' pipeline).",
                       choices=choices.MODES),
    sample_sizes=spec.numbers(["20"], "S1, the neighbours sampled per person.", item=int,
                              bounds=">= 1"),
    noise_multipliers=spec.numbers(["0", "1"], "DP-SGD noise multipliers sigma (0: no "
                                   "DP).", bounds=">= 0"),
    clip=spec.real(15.0, "Per-example clip C.", bounds="> 0"),
    lams=spec.numbers(["0.0003"], "MR-MTL lambdas.", bounds=">= 0"),
    rounds=spec.integer(2, "Rounds T (one local epoch each).", bounds=">= 1"),
    batch_size=spec.integer(512, "Batch size.", bounds=">= 1"),
    lr=spec.real(0.2, "Learning rate.", bounds="> 0"),
    losses=spec.strings(["focal"], "Of focal, bce.", choices=choices.LOSSES),
    alphas=spec.numbers(["0.75"], "Focal loss alphas.", bounds="(0, 1)"),
    architectures=spec.strings(["logistic"], "Of logistic, mlp.",
                               choices=choices.ARCHITECTURES),
    feature_sets=spec.strings(["node+contact+location"], "Thesis Table 2.3's ablation, "
                              "of node+contact+location, node+contact, node+location, "
                              "node, self: the groups of each neighbour's features an "
                              "example keeps (node: its 73 node features; contact: "
                              "start and duration; location: the place's coordinates "
                              "and type flags; self: no neighbour, the person's own 11 "
                              "features).", choices=choices.FEATURE_SETS),
    seeds=spec.numbers(["0"], "Training seeds (windows, batches, noise).", item=int),
    **common.shards_group("clients"),
    **common.backend_group("every method"),
    **common.BUNDLE_GROUP,
    **common.output_group(
        output=("pandemic.csv", "CSV rows are appended to."),
        generated_dir=("pandemic_data", "Where generated data sets are kept (one folder "
                       "per profile and seed)."),
        figures_dir=(".", "Folder of pandemic_ap_epsilon.png and pandemic_time.png.")),
    resume=spec.boolean(True, "Skip runs whose row is already in --output."),
    epsilon_table=spec.boolean(False, "Only print Table 2.6's epsilons recomputed by "
                               "the accountant (Smoke: n = 2,609,976, b = 512, two "
                               "epochs, the thesis' delta = 1/n), with both exponents; "
                               "no data is read."),
    degree_figure=spec.boolean(False, "Only draw Fig. 2.8 from the accountant: epsilon "
                               "against the examples a node lies in, S, for several "
                               "sigma, with both exponents (Smoke: n = 2,609,976, "
                               "b = 512, one epoch, delta = 1/n); writes --figures_dir/"
                               "pandemic_degree.png and its CSV beside it; no data is "
                               "read."),
    generate_only=spec.boolean(False, "Only generate --profile into --generated_dir "
                               "(found there: nothing to do) and print its folder; no "
                               "run, no row (a profile's generation timed alone, as "
                               "for Fig. 2.10)."),
    gradient_norms=spec.boolean(False, "Instead of rows, thesis Fig. 2.9: every training "
                                "example's gradient norm (the first method, mode, S1, "
                                "lambda, loss, alpha, architecture and seed; no DP) at "
                                "the initial and the trained model, and one batch's; "
                                "writes --figures_dir/pandemic_gradient_norms.png and a "
                                "CSV of shares below --clip / 5 and --clip beside it. "
                                "Reads private data without noise."),
)
SPEC.define()
# The settings that are lists of a grid or of factors: parsed into the settings.
LISTS = tuple(name for name, param in SPEC.params.items()
              if param.kind == "list" and name != "seeds")


class Settings(SPEC.settings_class("_Fields", module=__name__)):
  """`benchmarks.pandemic`'s settings (`SPEC`), checked (`from_flags`), the lists
  parsed."""

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags; raises UsageError."""
    SPEC.check_choices()
    common.check_backend(FLAGS.backend, FLAGS.device, FLAGS.xla)
    common.check_shards_flag(common.backend_for(FLAGS.backend))
    if FLAGS.shards and FLAGS.gradient_norms:
      raise UsageError("--gradient_norms reads every silo in this process: leave "
                       "out --shards")
    if FLAGS.gradient_norms and FLAGS["noise_multipliers"].present:
      raise UsageError("--gradient_norms trains without DP (thesis Fig. 2.9): drop "
                       "--noise_multipliers")
    if FLAGS.data_dir is not None:
      if not os.path.isdir(FLAGS.data_dir):
        raise UsageError(f"--data_dir {FLAGS.data_dir} is not a directory")
      for name in ("profile", "seed", "final_week_rate", "region_transmission",
                   "region_home_weight"):
        if FLAGS[name].present:
          raise UsageError(f"--{name} sets generated data; --data_dir reads given files")
    else:   # generated there (it was a traceback after the work: P19, P20)
      common.check_folder(FLAGS.generated_dir, "generated_dir")
    values = dict(SPEC.values(), seeds=tuple(common.parse_seeds(FLAGS.seeds)),
                  **{name: SPEC.parsed(name) for name in LISTS})
    SPEC.check_ranges(values)
    from tff_silo.pandemic import epidemic   # no TensorFlow
    for name in ("region_transmission", "region_home_weight"):
      if values[name] and len(values[name]) != epidemic.REGIONS:
        raise UsageError(f"--{name} must give {epidemic.REGIONS} factors, one per region "
                         f"of the official partition; got {len(values[name])}")
    common.check_output(FLAGS.output, SIGNATURE)
    return cls(**values)


def _data_dir(s, generate: bool = True) -> tuple:
  """(the data folder, its generator metadata or {}), generating it if needed and
  `generate` (a Ray worker does not: two at once would write the same folder)."""
  if s.data_dir is not None:
    path = os.path.join(s.data_dir, "synthetic_meta.json")
    meta = json.load(open(path)) if os.path.isfile(path) else {}
    return s.data_dir, meta
  from tff_silo.pandemic import epidemic, synth
  regions = "".join(f"-{name}{'_'.join(f'{f:g}' for f in factors)}"
                    for name, factors in (("transmission", s.region_transmission),
                                          ("home", s.region_home_weight)) if factors)
  folder = os.path.join(s.generated_dir, f"{s.profile}-seed{s.seed}-rate"
                        f"{s.final_week_rate:g}{regions}")
  meta_path = os.path.join(folder, "synthetic_meta.json")
  if os.path.isfile(meta_path):
    with open(meta_path) as f:
      return folder, json.load(f)
  if not generate:
    import socket
    raise ValueError(f"the data folder {folder} is not on {socket.gethostname()}: "
                     "share it at the same path, or generate it there with the same "
                     "flags")
  print(f"generating the {s.profile} profile in {folder}", file=sys.stderr, flush=True)
  staging = folder + ".partial"
  import shutil
  shutil.rmtree(staging, ignore_errors=True)
  meta = synth.generate(staging, s.profile, s.seed,
                        config=epidemic.EpidemicConfig(
                            region_transmission=s.region_transmission,
                            region_home_weight=s.region_home_weight),
                        final_week_rate=s.final_week_rate,
                        progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
  os.rename(staging, folder)
  return folder, meta


def _data_key(data_dir, meta) -> dict:
  """What of the data a run key names: the folder and the generator's SHA-256 of
  the centralized training file (None for given files without metadata)."""
  files = meta.get("files_sha256", {})
  return dict(data_dir=os.path.abspath(data_dir),
              files=files.get("centralized/train/va_person.csv.gz"))


_SCENARIOS = {}


def _run_rows(s, batch, progress, shards_on=None, replay=None, export=False):
  """The row of a run (a batch of one): the plan's work, in this process or on a
  Ray worker, where the data folder must be at the driver's path with the same
  files (checked by the run key, which names their SHA-256); with --shards, in
  this process with its clients on the shards of the executor `shards_on`; with
  --import_xla, its rounds' results and seconds those of the bundle's `replay`
  (`tff_silo.bundles.Replay`); with `export`, its rounds only (recorded: no row)."""
  from tff_silo.pandemic import pipeline
  (planned,) = batch
  run = planned.spec
  data_dir, meta = _data_dir(s, generate=False)
  data_key = _data_key(data_dir, meta)
  if _run_key(run, data_key, s) != planned.key:
    raise _not_the_drivers(data_dir)
  backend = common.backend_for(s.backend)
  device = common.device_scope(s.device, backend, s.xla, replay)[1]
  first_call = replay.calls if replay is not None else 0
  name = "centralized" if run["method"] == "centralized" else s.scenario
  loaded = (data_dir, name, run["mode"], run["sample_size"], run["seed"])
  settings = _pipeline_settings(
      run, s, noise_multiplier=run["sigma"],
      seed=common.run_seed(run["seed"], _run_key(run, data_key["files"], s)))
  load_seconds = 0.0
  if s.shards:
    checked = executors.Work(_shard, s, "benchmarks.pandemic")
    measured = pipeline.train_sharded(
        data_dir, name, settings,
        lambda makes: shards_on.shards([shards_on.recipe(checked, (data_key, make))
                                        for make in makes]), s.shards,
        sample_size=run["sample_size"], mode=run["mode"], data_seed=run["seed"],
        progress=progress)
    load_seconds = measured.pop("load_seconds")
  else:
    scenario, load_seconds = _scenario(loaded)
    if export:   # (the models are placeholders: nothing to score)
      pipeline.fit(scenario, settings, backend=backend)
      _release_programs()
      return []
    measured = pipeline.train(scenario, settings, backend=backend, progress=progress)
  if replay is not None:
    measured["train_seconds"] = common.replayed_seconds(
        replay, first_call, measured["rounds"])["wall_seconds"]
  stats = meta.get("statistics", {})
  row = dict(run_key=planned.key,
             profile=meta.get("profile", {}).get("name", "given files"),
             persons=stats.get("persons"), contacts=stats.get("contacts"),
             scenario=name, **{"feature_set": choices.FEATURE_SETS[0], **run},
             clip=s.clip if run["sigma"] else None, **_noise(run),
             **measured, load_seconds=load_seconds, backend=backend, device=device,
             peak_memory_mb=common.peak_memory_mb(),
             finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
  _release_programs()
  return [row]


def _release_programs() -> None:
  """Drops the traced rounds: each run's model captures its own tables, so the next
  run (another seed's data, say) traces its rounds anew, and exports them anew."""
  from tff_silo.backends.vectorized import programs
  programs.release_programs()


def _scenario(loaded) -> tuple:
  """(the scenario of `loaded`, its data folder, name, mode, sample size and seed;
  the seconds its loading took here, 0 when this process had it already)."""
  from tff_silo.pandemic import pipeline
  if loaded in _SCENARIOS:
    return _SCENARIOS[loaded], 0.0
  data_dir, name, mode, sample_size, seed = loaded
  t0 = time.perf_counter()   # a DataError (a ValueError) ends it as a usage error
  _SCENARIOS[loaded] = pipeline.load_scenario(data_dir, name, sample_size=sample_size,
                                              mode=mode, seed=seed)
  return _SCENARIOS[loaded], time.perf_counter() - t0


def _shard(s, spec, progress):
  """A shard's recipe (`executors.recipe`), run where the shard is: its machine's
  data folder checked against the driver's (`_data_key`: the generator's SHA-256),
  then `make()` (`pipeline.shard`: its clients loaded)."""
  del progress
  expected, make = spec
  data_dir, meta = _data_dir(s, generate=False)
  if _data_key(data_dir, meta) != expected:
    raise _not_the_drivers(data_dir)
  return make()


def _not_the_drivers(data_dir: str):
  from benchmarks import datasets
  return datasets.DataMismatch(f"the data in {data_dir} is not the driver's: give "
                               "every machine the same files")


def _runs(s):
  """Every run of the grid; `feature_set` is in a run (and its key) only when it is
  not every group, so the keys of runs before the ablation stay."""
  for (seed, mode, s1, method, sigma, lam, loss, alpha, architecture,
       feature_set) in itertools.product(
           s.seeds, s.modes, s.sample_sizes, s.methods, s.noise_multipliers, s.lams,
           s.losses, s.alphas, s.architectures, s.feature_sets):
    if method != "mrmtl" and lam != s.lams[0]:
      continue   # lambda is MR-MTL's alone
    if loss == "bce" and alpha != s.alphas[0]:
      continue
    ablation = ({} if feature_set == choices.FEATURE_SETS[0]
                else dict(feature_set=feature_set))
    yield dict(seed=seed, mode=mode, sample_size=s1, method=method, sigma=sigma,
               lam=lam if method == "mrmtl" else None, loss=loss,
               alpha=alpha if loss == "focal" else None, architecture=architecture,
               **ablation)


# What the rows' numbers mean besides the flags (rows of an earlier pipeline, scored
# on the training persons at delta 1/n, are not taken for these)
PIPELINE = dict(scored_on="held-out households", delta_rule="1/(10 n)",
                unit="a node of the capped graph")


def _run_key(run, data_key, s) -> str:
  return json.dumps(dict(run, data=data_key, scenario=s.scenario, clip=s.clip,
                         rounds=s.rounds, batch_size=s.batch_size, lr=s.lr,
                         **PIPELINE, **_noise(run)), sort_keys=True)


def _noise(run) -> dict:
  """A private run's DP-SGD noise (the library's default, integer), for its key
  and row."""
  return dict(noise="integer") if run["sigma"] else {}


# Table 2.6 (thesis, real Virginia data, Smoke): sigma -> the epsilon it prints
THESIS_TABLE_2_6 = {4.5: "~9.9", 1.0: "~84", 0.5: "~245", 0.1: ">= 500", 0.01: ">= 500",
                    5.0: "~7.87 (text)", 2.75: "-"}


def _print_epsilon_table():
  """Table 2.6's epsilon column from the accountant (`node_level`), no data."""
  from tff_silo.privacy import node_level
  n, b = 2_609_976, 512
  steps = 2 * math.ceil(n / b)
  print(f"Table 2.6 epsilons: n = {n}, b = {b}, {steps} steps (two epochs), delta = 1/n "
        "(the thesis' delta, to reproduce it; runs use 1/(10 n)), the authors' orders")
  print("| sigma | thesis, real Virginia data | authors' code exponent, S = 20 | "
        "S = 21 | printed theorem (replace one), S = 21 | replace one, S = 41 "
        "(what replacing a node changes) |")
  print("|---|---|---|---|---|---|")
  for sigma, thesis in sorted(THESIS_TABLE_2_6.items(), reverse=True):
    values = [node_level.epsilon(sigma, n, s, b, steps, 1 / n, neighbouring=rel)
              for s, rel in ((20, "add_remove"), (21, "add_remove"), (21, "replace_one"),
                             (41, "replace_one"))]
    print(f"| {sigma:g} | {thesis} | " + " | ".join(f"{v:.4g}" for v in values) + " |")


# Fig. 2.8's axes: sigma per curve, S (a node's examples: S1 + 1 for S1 kept
# neighbours) along x.
DEGREE_SIGMAS = (0.5, 1.0, 2.0, 4.5, 5.0, 10.0)
DEGREE_S = (1, 2, 3, 5, 7, 10, 15, 21, 31, 41, 51, 71, 101)


def _degree_figure(figures_dir: str) -> None:
  """Fig. 2.8 from the accountant (`node_level`), no data: Smoke's n and b, one
  epoch, delta = 1/n, the authors' orders; both exponents."""
  import pandas as pd
  from benchmarks import plots
  from tff_silo.privacy import node_level
  n, b = 2_609_976, 512
  steps = math.ceil(n / b)
  rows = [dict(neighbouring=rel, sigma=sigma, max_neighbourhoods=s, num_nodes=n,
               batch_size=b, steps=steps, delta=1 / n,
               epsilon=node_level.epsilon(sigma, n, s, b, steps, 1 / n, neighbouring=rel))
          for rel in node_level.EXPONENT for sigma in DEGREE_SIGMAS for s in DEGREE_S]
  df = pd.DataFrame(rows)
  path = os.path.join(figures_dir, "pandemic_degree.png")
  os.makedirs(figures_dir, exist_ok=True)
  df.to_csv(os.path.splitext(path)[0] + ".csv", index=False)
  plots.pandemic_degree(df, f"Fig. 2.8 from the accountant: n = {n:,}, b = {b}, one "
                        f"epoch ({steps:,} steps), delta = 1/n", path)
  print(df.pivot_table(index=["neighbouring", "max_neighbourhoods"], columns="sigma",
                       values="epsilon").to_string(float_format=lambda v: f"{v:.4g}"))
  print(f"wrote {path}")


def _alone(others, why: str) -> None:
  """A mode's other work is refused, not skipped: UsageError for the first of the
  flags `others` given, `why` it has no place."""
  for name in others:
    if FLAGS[name].present:
      raise UsageError(f"{why}: drop --{name}")


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  if FLAGS.generate_only:
    _alone(("data_dir", "epsilon_table", "degree_figure", "gradient_norms", "export_xla",
            "import_xla", "shards"), "--generate_only generates --profile and runs nothing")
  if FLAGS.epsilon_table:
    _print_epsilon_table()
    return
  if FLAGS.degree_figure:   # the figure only
    _alone(("gradient_norms", "shards", "executor", "epsilon_table"),
           "--degree_figure draws Fig. 2.8 from the accountant alone")
    common.check_figure_path(os.path.join(FLAGS.figures_dir, "pandemic_degree.png"),
                             "figures_dir")
    _degree_figure(FLAGS.figures_dir)
    return
  s = Settings.from_flags()
  bundle = common.bundle_from_flags()
  from tff_silo import runtime
  runtime.exit_cleanly_on_sigterm()
  executor = executors.from_flags()   # a cluster that cannot be joined: before any work
  data_dir, meta = _data_dir(s)
  if FLAGS.generate_only:
    print(data_dir)
    return
  if FLAGS.gradient_norms:
    _gradient_norms(data_dir, s)
    return
  data_key = _data_key(data_dir, meta)
  work = executors.Work(_run_rows, s, "benchmarks.pandemic")
  if s.shards:   # the runs one by one here, each with its shards on the executor
    _check_shards(data_dir, s)
    executor.check_shards(s.shards)
    work = work._replace(function=functools.partial(_run_rows, shards_on=executor))
    executor = executors.Local()
  todo = plan.Plan(
      [plan.Run(_run_key(run, data_key, s), _tag(run, s), run) for run in _runs(s)],
      output=s.output, signature=SIGNATURE, resume=s.resume)
  if s.export_xla:
    _export(todo, s, bundle)
    return
  if bundle is not None:
    work = work._replace(function=functools.partial(_run_rows, replay=bundle))
  pending = bool(todo.pending)
  rows = todo.execute(
      work, rounds=s.rounds, scope=common.placement(s, bundle), executor=executor,
      summary=lambda done: f"AP {done[0].get('average_precision', math.nan):.4f} (lift "
      f"{done[0].get('lift', math.nan):.2f}), epsilon {done[0]['epsilon_theorem']:.4g}")
  if bundle is not None and pending:
    with common.usage_errors():
      bundle.finish()
  _print_table(rows)
  _print_comparison(rows, s)
  _figures(meta.get("statistics", {}).get("persons"), s)


def _tag(run, s) -> str:
  """A run's name in the progress lines: its method, mode, S1 and sigma, and each
  setting the grid varies besides."""
  varied = [f"{name}={run[name]}" for name, values in (
      ("loss", s.losses), ("alpha", s.alphas), ("architecture", s.architectures),
      ("feature_set", s.feature_sets)) if len(values) > 1 and run.get(name)]
  return " ".join([f"{run['method']} {run['mode']} S1={run['sample_size']} "
                   f"sigma={run['sigma']:g}"] + ([f"lam={run['lam']:g}"] if run["lam"]
                                                 else []) + varied)


def _export(todo, s, recording) -> None:
  """--export_xla: the pending runs' rounds recorded, not run (no row), and written
  as a bundle."""
  from tff_silo import bundles
  with common.usage_errors(), common.placement(s, recording):
    for planned in todo.pending:
      _run_rows(s, [planned], None, export=True)
    manifest = recording.write(s.export_xla, about=dict(
        binary="benchmarks.pandemic", command=" ".join(sys.argv[1:]),
        runs=[run.tag for run in todo.pending], privacy=bundles.OUTSIDE_GUARANTEE))
  common.print_exported(s.export_xla, f"{len(todo.pending)} run(s)", manifest)


def _check_shards(data_dir: str, s) -> None:
  """A one-line error for more shards than a run has silos."""
  from tff_silo.pandemic import files
  clients = len(files.read_scenario(data_dir, s.scenario))
  if s.shards > clients:
    raise UsageError(f"--shards={s.shards} is more than the {clients} clients of "
                     f"{s.scenario}")
  if "centralized" in s.methods and s.shards > 1:
    raise UsageError("--shards: the centralized method trains one silo; leave it "
                     "out of --methods, or give --shards=1")


def _pipeline_settings(run, s, *, noise_multiplier: float, seed: int):
  """The `pipeline.Settings` of a run of `_runs` with the given noise and training
  seed."""
  from tff_silo.pandemic import pipeline
  return pipeline.Settings(
      method=run["method"], noise_multiplier=noise_multiplier, clip=s.clip,
      lam=run["lam"] or 0.0, rounds=s.rounds, batch_size=s.batch_size,
      learning_rate=s.lr, loss=run["loss"], alpha=run["alpha"] or 0.75,
      architecture=run["architecture"],
      feature_set=run.get("feature_set", choices.FEATURE_SETS[0]), seed=seed)


def _gradient_norms(data_dir: str, s) -> None:
  """Fig. 2.9 (`pipeline.gradient_norms`): the first configuration's norms at the
  initial and the trained model (no DP), shares below clip / 5 and clip."""
  import numpy as np
  import pandas as pd
  from benchmarks import plots
  from tff_silo.pandemic import pipeline
  run = next(_runs(s))
  method, mode, s1, seed = run["method"], run["mode"], run["sample_size"], run["seed"]
  name = "centralized" if method == "centralized" else s.scenario
  scenario = pipeline.load_scenario(data_dir, name, sample_size=s1, mode=mode, seed=seed)
  settings = _pipeline_settings(run, s, noise_multiplier=0.0, seed=seed)
  model, result, _ = pipeline.fit(scenario, settings, backend=common.backend_for(s.backend))
  silos = scenario.silos
  initial = [model.initial_weights(seed)] * silos.num_silos
  labels = np.concatenate(silos.y_train)
  norms = pd.concat([pd.DataFrame(dict(
      model=point, label=labels,
      norm=np.concatenate(pipeline.gradient_norms(model, weights, silos))))
      for point, weights in (("initial", initial), ("trained", result.silo_weights))])
  rng = np.random.default_rng(seed)
  first = silos.train_sizes[0]
  picked = rng.choice(first, size=min(s.batch_size, first), replace=False)
  trained = norms[norms.model == "trained"]
  batch = trained.iloc[np.sort(picked)].reset_index(drop=True)
  figures = dict(examples="size", median="median", q99=lambda v: v.quantile(0.99),
                 q995=lambda v: v.quantile(0.995), largest="max",
                 below_clip_5=lambda v: float((v < s.clip / 5).mean()),
                 below_clip=lambda v: float((v < s.clip).mean()))
  summary = norms.groupby(["model", "label"]).norm.agg(**figures).reset_index()
  every = norms.groupby("model").norm.agg(**figures).reset_index().assign(label="all")
  summary = pd.concat([summary, every]).assign(
      clip=s.clip, method=method, mode=mode, sample_size=s1, loss=s.losses[0],
      alpha=s.alphas[0], lam=s.lams[0], seed=seed, data_dir=os.path.abspath(data_dir),
      guarantee="none: per-example norms of private training data, no noise")
  path = os.path.join(s.figures_dir, "pandemic_gradient_norms.png")
  os.makedirs(s.figures_dir, exist_ok=True)
  summary.to_csv(os.path.splitext(path)[0] + ".csv", index=False)
  plots.pandemic_gradient_norms(
      batch, norms, s.clip,
      f"Fig. 2.9: per-example gradient norms, {method} ({mode}, S1 = {s1}, "
      f"{s.losses[0]} alpha {s.alphas[0]:g}, no DP)\n{len(labels):,} training examples "
      f"of {silos.num_silos} silos; shares below C / 5: "
      + ", ".join(f"{r.model} {r.below_clip_5:.4f}" for r in every.itertuples()), path)
  print(summary.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
  print(f"wrote {path}")


def _print_table(rows):
  import pandas as pd
  from benchmarks import tables
  tables.print_frame(pd.DataFrame(rows), tables.PANDEMIC_COLUMNS)


def _print_comparison(rows, s) -> None:
  """`tables.pandemic_comparison` of the rows, naming what may tell the methods
  apart where they are not."""
  from benchmarks import tables
  larger = ("regions that differ (--region_transmission=0.5,1,2 "
            "--region_home_weight=0.3,1,3), more --seeds or a larger --profile"
            if s.data_dir is None and not s.region_transmission
            else "more --seeds or more held-out positives")
  text = tables.pandemic_comparison(rows, larger)
  if text:
    print("\n" + text)


# What one curve of the AP figure holds fixed (its points differ in sigma only)
CURVE = ["method", "mode", "sample_size", "lam", "loss", "alpha", "architecture",
         "feature_set"]


def _figures(persons, s):
  """AP against the printed theorem's epsilon for the rows of data sets of
  `persons` persons (`plots.pandemic_ap`); and time and peak memory against
  persons (every profile's rows in --output, median per method and profile)."""
  import numpy as np
  import pandas as pd
  from benchmarks import plots
  every = pd.read_csv(s.output)
  if "scored_on" in every:   # this pipeline's rows only (not an earlier one's)
    every = every[every.scored_on == PIPELINE["scored_on"]]
  df = every if persons is None else every[every.persons == persons]
  df = df.assign(**{c: df[c].fillna("-") for c in CURVE if c in df})
  private = np.isfinite(df.epsilon_theorem)
  unbounded = sorted(df.sigma[(df.sigma > 0) & ~private].unique())
  plots.pandemic_ap(df, CURVE, (f"{int(persons):,} persons" if persons
                                else "given files") + (
      f"; sigma {', '.join(f'{v:g}' for v in unbounded)}: no finite epsilon, not drawn"
      if unbounded else ""), os.path.join(s.figures_dir, "pandemic_ap_epsilon.png"))
  timed = every.dropna(subset=["persons"]).assign(
      load=lambda d: d.load_seconds.fillna(0), memory=lambda d: d.peak_memory_mb / 1024)
  plots.pandemic_time(timed, os.path.join(s.figures_dir, "pandemic_time.png"))


if __name__ == "__main__":
  common.run_main(main)
