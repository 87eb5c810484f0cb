"""An empirical lower bound on epsilon for the example-level DP methods (local,
FedAvg, MR-MTL, Ditto, finetuning, IFCA with its private selections on 2 clusters),
from one training run each (`attacks.audit`: Steinke, Nasr & Jagielski 2023), and
for HyperNetFL's user-level mechanism (`hypernet_udp`: UDP-Alg's server step over
--rounds rounds, user canaries contributing along coordinates of their own, scored
on every round's released aggregate).

For each method, a DP run on silos with --canaries canaries (each included with
probability 1/2 from the auditor's seed; data-level, one feature each, white-box on
the final silo models' parameters), then the --guesses highest and lowest canary
scores guessed in and out, and the largest epsilon those guesses refute at
--confidence. A row: method, preset, epsilon_reported (the run's ledgers, the
largest over silos), delta, epsilon_lower, confidence, canaries, guesses, correct,
threat_model, mutation. The runs are calibrated at --delta, 1e-5 by default: the
bound pays 2 m delta. epsilon_lower <= epsilon_reported is what a correct
implementation shows; a lower bound above it is a bug. --mutations adds runs that
are broken on purpose, behind the accountant's back, to show the audit bites:
`noise_div4` trains with a quarter of the calibrated noise, `rate_x2` samples each
example with twice the accounted rate (the ledgers still report the honest run's
epsilon). Threat model and limits: a lower bound says that this attack, on these
canaries, refutes smaller epsilons; it does not say the reported epsilon is tight,
nor anything of other canaries, attacks or released quantities.

    uv run python -m benchmarks.audit --preset=quick --mutations=noise_div4,rate_x2
    uv run python -m benchmarks.audit --preset=school --data_dir=../shared/data
"""

from __future__ import annotations

import contextlib
import time

from absl import flags

from benchmarks import common, configs
from benchmarks.common import UsageError
from benchmarks.harness import spec

FLAGS = flags.FLAGS
PRESETS = ("quick", "school")
METHODS = ("local", "fedavg", "mrmtl", "ditto", "finetune", "ifca", "ifca_mrmtl",
           "hypernet_udp")
# hypernet_udp: UDP-Alg's user-level mean with user canaries (`audit.user_level_scores`)
USER_SAMPLING_RATE, REAL_USERS, USER_CLIP = 0.3, 100, 1.0
USER_THREAT_MODEL = ("white-box, every round's released aggregate f_t of UDP-Alg's "
                     "server step: a canary user contributes the clip along its own "
                     "coordinate (add/remove one user)")
NUM_CLUSTERS = 2   # IFCA's clusters (the quick silos have none; School's are unknown)
MUTATIONS = ("noise_div4", "rate_x2")
THREAT_MODEL = ("white-box, final silo models: one canary feature per canary example "
                "(add/remove one example), its coordinate of its silo's model as score")
SPEC = spec.Spec(
    preset=spec.string("quick", "One of {choices}: the quick preset's synthetic "
                       "linear-regression silos (all 60 training examples of each), or "
                       "School (needs --data_dir); their batch size, clip, rounds and "
                       "lr.", choices=PRESETS),
    data_dir=spec.string(None, "--preset=school: the folder with school.mat."),
    methods=spec.strings(["local", "fedavg", "mrmtl", "ditto"], "Methods audited, among "
                         "{choices}.", choices=METHODS),
    epsilon=spec.real(1.0, "Each silo's target epsilon.", bounds="> 0"),
    delta=spec.real(1e-5, "Each silo's delta. The bound pays 2 m delta (m the "
                    "canaries): at 1,000 canaries a delta of 1e-3 leaves it nothing.",
                    bounds="(0, 1)"),
    rounds=spec.integer(None, "Rounds (default: the preset's).", bounds=">= 1"),
    lr=spec.real(None, "Client learning rate (default: the preset's).", bounds="> 0"),
    lam=spec.real(1.0, "lambda of MR-MTL and Ditto.", bounds="> 0"),
    canaries=spec.integer(1000, "m, canaries (each included with probability 1/2).",
                          bounds=">= 2"),
    guesses=spec.integer(100, "k: the k highest scores are guessed in, the k lowest "
                         "out (2k guesses).", bounds=">= 1"),
    confidence=spec.real(0.95, "Confidence of the lower bound.", bounds="(0, 1)"),
    seed=spec.integer(0, "Seed of the data, the canaries' inclusion and the runs."),
    mutations=spec.strings([], "Deliberately broken runs to add, among {choices} (their "
                           "rows say so).", choices=MUTATIONS),
    **common.output_group(
        output=("audit.csv", "CSV rows are appended to."),
        plot=("audit.png", "Figure: reported against audited epsilon.")),
)
SPEC.define()

SIGNATURE = ("method", "epsilon_reported", "epsilon_lower")


class Settings(SPEC.settings_class("_Fields", ("batch_size", int), ("clip", float),
                                   ("assumed_silo_size", int), module=__name__)):
  """`benchmarks.audit`'s settings (`SPEC`), checked (`from_flags`), the preset's
  rounds and lr filled in, its batch size, clip and public silo size beside them."""

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags; raises UsageError."""
    SPEC.check_choices()
    common.check_epsilon("epsilon", FLAGS.epsilon, "the audit needs a private run")
    SPEC.check_ranges({})
    if FLAGS.preset == "school" and not FLAGS.data_dir:
      raise UsageError("--preset=school needs --data_dir (the folder with school.mat)")
    if FLAGS.preset != "school" and FLAGS.data_dir:
      raise UsageError("--data_dir applies to --preset=school only")
    if 2 * FLAGS.guesses > FLAGS.canaries:
      raise UsageError(f"--guesses must be at most --canaries / 2 "
                       f"({FLAGS.canaries // 2}); got {FLAGS.guesses}")
    common.check_output(FLAGS.output, SIGNATURE)
    common.check_figure_path(FLAGS.plot)
    if FLAGS.preset == "quick":   # the compare preset's, all training examples
      preset = configs.COMPARE_PRESETS["quick"]
      size, lr = int(configs.QUICK_DATA["num_examples"] * 0.75), preset.lrs[0]
    else:
      preset = configs.PRESETS["school"]
      size, lr = preset.assumed_silo_size, preset.lr
    return cls(**dict(SPEC.values(), rounds=FLAGS.rounds or preset.rounds,
                      lr=FLAGS.lr or lr),
               batch_size=preset.batch_size, clip=preset.clip, assumed_silo_size=size)


def _silos(s):
  from tff_silo import data
  if s.preset == "quick":
    return data.heterogeneous_linear_silos(**configs.QUICK_DATA, seed=s.seed)
  try:
    return data.load_school(s.data_dir, seed=s.seed, standardize="public")
  except (OSError, ValueError) as e:
    raise UsageError(str(e)) from None


@contextlib.contextmanager
def _mutated(mutation):
  """The training broken behind the accountant's back (None: as it is): the
  silos train with a quarter of their noise, or sample at twice the threshold."""
  if mutation is None:
    yield
    return
  from tff_silo import simulation
  from tff_silo.algorithms import poisson_sampling
  honest_accounts, honest_threshold = simulation.SiloAccounts, poisson_sampling.threshold

  class QuarterNoise(honest_accounts):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      # trained with, not charged
      self.process_noise_multipliers = self.process_noise_multipliers / 4.0

  def doubled(batch, size):
    import tensorflow as tf
    return tf.minimum(2 * honest_threshold(batch, size), poisson_sampling.WORD)

  try:
    if mutation == "noise_div4":
      simulation.SiloAccounts = QuarterNoise
    else:
      poisson_sampling.threshold = doubled
    yield
  finally:
    simulation.SiloAccounts = honest_accounts
    poisson_sampling.threshold = honest_threshold


def _guarantee(mutation, honest: str) -> str:
  """A row's `guarantee`: `honest`'s, or none for a run broken on purpose."""
  if mutation is None:
    return honest
  return (f"none: broken on purpose ({mutation}); epsilon_reported is what its "
          "accounting says, as for an honest run")


def _audit_user_level(s, mutation):
  """UDP-Alg's user-level mean audited with user canaries, and its row: W the
  declared population (every real user and canary), q = USER_SAMPLING_RATE."""
  from attacks import audit
  from tff_silo.privacy import accounting, user_level
  z = accounting.calibrate_noise_multiplier(s.epsilon, s.delta, USER_SAMPLING_RATE,
                                            s.rounds)
  settings = user_level.UserDPSettings(USER_SAMPLING_RATE, USER_CLIP, z,
                                       public_user_count=REAL_USERS + s.canaries)
  included = audit.inclusions(s.canaries, s.seed)
  start = time.perf_counter()
  scores = audit.user_level_scores(
      settings, s.rounds, included, REAL_USERS, s.seed,
      sampling_rate=min(1.0, 2 * USER_SAMPLING_RATE) if mutation == "rate_x2" else None,
      noise_scale=0.25 if mutation == "noise_div4" else 1.0)
  r, v = audit.guesses(scores, included, s.guesses)
  return dict(
      method="hypernet_udp", preset="users", silo="all", mutation=mutation or "none",
      epsilon_reported=settings.epsilon(s.rounds, s.delta, s.canaries + REAL_USERS + 1),
      delta=s.delta,
      epsilon_lower=audit.epsilon_lower(s.canaries, r, v, s.delta, s.confidence),
      confidence=s.confidence, canaries=s.canaries, guesses=r, correct=v,
      included=int(included.sum()), threat_model=USER_THREAT_MODEL,
      guarantee=_guarantee(mutation, "user-level (add/remove one user), Poisson users"),
      noise_multiplier=z, noise="integer", rounds=s.rounds,
      sampling_rate=USER_SAMPLING_RATE,
      clip=USER_CLIP, seed=s.seed, wall_seconds=time.perf_counter() - start)


def _audit(s, method, silos, mutation):
  """One DP run of `method` on the canaried silos and its row."""
  import numpy as np
  from attacks import audit
  from tff_silo import algorithms, keys, models, simulation
  from tff_silo.privacy.protocol import PrivacyProtocol
  canaried, canaries = audit.canary_silos(silos, s.canaries, s.seed)
  definition = algorithms.silo_definition(
      method, models.model_for(canaried), canaried.feature_shape,
      client_learning_rate=s.lr, batch_size=s.batch_size, rounds=s.rounds, lam=s.lam,
      l2_norm_clip=s.clip, num_silos=canaried.num_silos,
      num_clusters=NUM_CLUSTERS if method.startswith("ifca") else None)
  start = time.perf_counter()
  with _mutated(mutation):
    result = simulation.run_simulation(
        definition, canaried, rounds=s.rounds, target_epsilon=s.epsilon,
        target_delta=s.delta, backend="vectorized",
        seed=keys.run_seed(s.seed, dict(audit=method, mutation=mutation)),
        protocol=PrivacyProtocol(assumed_silo_size=s.assumed_silo_size))
  scores = audit.canary_scores(result.silo_weights, canaries)
  r, v = audit.guesses(scores, canaries.included, s.guesses)
  return dict(
      method=method, preset=s.preset, silo="all", mutation=mutation or "none",
      epsilon_reported=float(np.max(result.privacy.epsilon_spent)), delta=s.delta,
      epsilon_lower=audit.epsilon_lower(s.canaries, r, v, s.delta, s.confidence),
      confidence=s.confidence, canaries=s.canaries, guesses=r, correct=v,
      included=int(canaries.included.sum()), threat_model=THREAT_MODEL,
      guarantee=_guarantee(
          mutation, "example-level (add/remove, Poisson), each silo's; the largest"),
      noise_multiplier=float(np.min(result.privacy.noise_multipliers)),
      noise=definition.config.noise, rounds=s.rounds, lr=s.lr,
      lam=s.lam if method in ("mrmtl", "ditto", "ifca_mrmtl") else None,
      batch_size=s.batch_size, clip=s.clip, assumed_silo_size=s.assumed_silo_size,
      seed=s.seed, test_metric=result.test_metric,
      wall_seconds=time.perf_counter() - start)


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = Settings.from_flags()
  silos = _silos(s)
  rows = []
  for mutation in (None, *s.mutations):
    for method in s.methods:
      rows.append(_audit_user_level(s, mutation) if method == "hypernet_udp"
                  else _audit(s, method, silos, mutation))
      row = rows[-1]
      print(f"{method} ({row['mutation']}): epsilon reported "
            f"{row['epsilon_reported']:.3f}, audited >= {row['epsilon_lower']:.3f} "
            f"({row['correct']}/{row['guesses']} guesses right)", flush=True)
  common.append_rows(s.output, rows)
  import pandas as pd
  from benchmarks import plots, tables
  table = pd.DataFrame(rows)
  plots.audit(table, f"{s.preset}: {s.canaries} canaries, {2 * s.guesses} guesses, "
              f"{s.confidence:.0%} confidence", s.plot)
  shown = ["method", "mutation", "epsilon_reported", "epsilon_lower", "correct",
           "guesses", "noise_multiplier", "test_metric"]
  tables.print_frame(table[[c for c in shown if c in table]], number=".4g")
  honest = table[table.mutation == "none"]
  broken = honest[honest.epsilon_lower > honest.epsilon_reported]
  print(f"{len(rows)} row(s) appended to {s.output}; figure: {s.plot}")
  if not broken.empty:
    print(f"AUDIT FAILED: {', '.join(broken.method)} refute(s) the reported epsilon")


if __name__ == "__main__":
  common.run_main(main)
