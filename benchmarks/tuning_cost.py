"""The privacy cost of tuning lambda on federated mean estimation (thesis sec. 1.7,
Fig. 1.7, app. E).

The model of thesis sec. 1.6 (`tff_silo.theory`): K silos, n samples each with
variance sigma^2 around silo means spread by tau; each silo releases its sum with
Gaussian noise of standard deviation clip * z. MR-MTL's error at lambda is Lemma
1.6.7 (closed form, checked here by Monte Carlo). The conditions:
- `non_private`: z = 0;
- `private`: z calibrated to (epsilon, delta) for one release (no tuning cost, as
  papers report);
- `tnb_eta=...` / `poisson`: z calibrated so that random-repeat tuning with h ~
  TNB(eta, gamma) / Poisson(mu), E[h] = --mean_trials, is (epsilon, delta)-DP
  (`tff_silo.privacy.tuning`, Papernot & Steinke Thms. 2 and 6).
Both calibrations use the same RDP accountant and orders. For each condition the
binary also gives the expected error of the lambda that tuning would release if it
scored each of its h random grid draws by the true error (an upper bound on what
tuning can reach; h = 0 of Poisson releases nothing and counts as local training),
against local training (lambda = 0) and FedAvg (lambda -> inf) of the `private`
condition, which need no tuning.

    uv run python -m benchmarks.tuning_cost   # the authors' settings (flag defaults)
"""

from __future__ import annotations

import math

from absl import flags
import numpy as np

from benchmarks import common
from benchmarks.harness import spec

FLAGS = flags.FLAGS
SPEC = spec.Spec(
    num_silos=spec.integer(20, "K, silos.", bounds=">= 2"),
    n=spec.integer(200, "Samples per silo.", bounds=">= 1"),
    sigma=spec.real(0.4, "Sample standard deviation within a silo.", bounds="> 0"),
    tau=spec.real(0.08, "Standard deviation of the silo means (heterogeneity).",
                  bounds="> 0"),
    epsilon=spec.real(0.25, "Each silo's epsilon.", bounds="> 0"),
    delta=spec.real(1e-5, "Each silo's delta.", bounds="(0, 1)"),
    clip=spec.real(1.0, "Sensitivity of a silo's sum to one sample.", bounds="> 0"),
    etas=spec.numbers(["-0.5", "0", "0.5", "1", "2", "5"], "Shapes eta (> -1) of the "
                      "truncated negative binomial.", bounds="> -1"),
    mean_trials=spec.real(10.0, "E[h], the mean number of lambdas tried (> 1).",
                          bounds="> 1"),
    num_lambdas=spec.integer(100, "Log-spaced lambdas in [1e-3, 1e2] (and 0).",
                             bounds=">= 1"),
    monte_carlo_trials=spec.integer(500, "Samples of the model per lambda (the thesis "
                                    "ran 500) to check the closed form; 0: none.",
                                    bounds=">= 0"),
    seed=spec.integer(0, "Seed of the Monte Carlo check."),
    **common.output_group(output=("tuning_cost.csv", "CSV rows are appended to."),
                          plot=("tuning_cost.png", "Figure path.")),
)
SPEC.define()

SIGNATURE = ("condition", "lam", "error")


class Settings(SPEC.settings_class("_Fields", module=__name__)):
  """`benchmarks.tuning_cost`'s settings (`SPEC`), checked (`from_flags`)."""

  @classmethod
  def from_flags(cls) -> "Settings":
    """Checks the flags; raises UsageError."""
    values = dict(SPEC.values(), etas=SPEC.parsed("etas"))
    SPEC.check_ranges(values)
    common.check_output(FLAGS.output, SIGNATURE)
    common.check_figure_path(FLAGS.plot)
    return cls(**values)


def _conditions(s):
  """(name, eta or None, trials or None, noise multiplier) of every condition."""
  import dp_accounting
  from tff_silo.privacy import tuning
  calibrate = lambda trials: tuning.calibrate_noise(
      s.epsilon, s.delta, dp_accounting.GaussianDpEvent, trials)
  out = [("non_private", None, None, 0.0), ("private", None, None, calibrate(None))]
  for eta in s.etas:
    trials = tuning.TruncatedNegativeBinomial.with_mean(eta, s.mean_trials)
    out.append((f"tnb_eta={eta:g}", eta, trials, calibrate(trials)))
  trials = tuning.PoissonTrials(s.mean_trials)
  out.append(("poisson", None, trials, calibrate(trials)))
  return out


def main(argv):
  del argv   # (no arguments: `common.run_main`)
  s = Settings.from_flags()
  from tff_silo import theory
  from tff_silo.privacy import tuning
  lams = np.concatenate([[0.0], np.logspace(-3, 2, s.num_lambdas)])
  k, tau2 = s.num_silos, s.tau ** 2
  settings = dict(num_silos=k, n=s.n, sigma=s.sigma, tau=s.tau,
                  epsilon=s.epsilon, delta=s.delta, clip=s.clip,
                  mean_trials=s.mean_trials)
  rows, summary = [], []
  for name, eta, trials, z in _conditions(s):
    sigma_dp2 = (s.clip * z) ** 2
    sigma_loc2 = theory.local_variance(s.n, s.sigma ** 2, sigma_dp2)
    errors = np.array([theory.mrmtl_error(lam, k, sigma_loc2, tau2) for lam in lams])
    for lam, error in zip(lams, errors):
      monte_carlo = (theory.monte_carlo_mrmtl_error(
          lam, num_silos=k, n=s.n, sigma2=s.sigma ** 2, tau2=tau2,
          sigma_dp2=sigma_dp2, trials=s.monte_carlo_trials, seed=s.seed)
                     if s.monte_carlo_trials else float("nan"))
      rows.append(dict(condition=name, eta=eta, noise_multiplier=z, lam=lam,
                       error=error, error_monte_carlo=monte_carlo, **settings))
    best = int(np.argmin(errors))
    summary.append(dict(
        condition=name, noise_multiplier=z, best_lam=lams[best], best_error=errors[best],
        tuned_error=(tuning.expected_best(errors, trials) if trials is not None
                     else float("nan")),
        local_error=errors[0], fedavg_error=theory.mrmtl_error(math.inf, k, sigma_loc2,
                                                               tau2)))
  common.append_rows(s.output, rows)
  from benchmarks import plots
  plots.tuning_cost(rows, summary, f"K={s.num_silos}, n={s.n}, "
                    f"sigma={s.sigma:g}, tau={s.tau:g}, eps={s.epsilon:g}, "
                    f"delta={s.delta:g}, E[h]={s.mean_trials:g}", s.plot)
  import pandas as pd
  from benchmarks import tables
  tables.print_frame(pd.DataFrame(summary), number=".6g")
  print(f"{len(rows)} row(s) appended to {s.output}; figure: {s.plot}")


if __name__ == "__main__":
  common.run_main(main)
