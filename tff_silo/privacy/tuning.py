"""The privacy cost of hyperparameter tuning (thesis sec. 1.7, app. E; Papernot &
Steinke, ICLR 2022, "Hyperparameter tuning with Renyi differential privacy").

Random-repeat tuning runs a trial h times and releases only the best result, where a
trial is a DP mechanism Q: pick a hyperparameter at random, train, score. Releasing
the best of a *fixed* h trials can cost h times Q's epsilon (P&S Prop. 17, thesis
Prop. E.1.1); drawing h at random makes the cost a constant factor in RDP:

- truncated negative binomial TNB(eta, gamma), eta > -1, gamma in (0, 1):
  P[h] = (1 - gamma)^h / (gamma^-eta - 1) * prod_{l<h} (l + eta) / (l + 1), h >= 1
  (eta = 0: the logarithmic distribution (1 - gamma)^h / (h log(1 / gamma))), with
  E[h] = eta (1 - gamma) / (gamma (1 - gamma^eta)) ((1/gamma - 1) / log(1/gamma) at
  eta = 0). If Q is (a, eps(a))-RDP at every order, the released best is
  (a, eps'(a))-RDP with (P&S Thm. 2, thesis eq. E.2)
      eps'(a) = eps(a) + (1 + eta) min_b [(1 - 1/b) eps(b) + log(1/gamma) / b]
                + log E[h] / (a - 1);
- Poisson(mu) (h = 0 releases nothing): with delta_hat Q's delta at
  eps_hat = log(1 + 1/(a - 1)) (P&S Thm. 6),
      eps'(a) = eps(a) + mu delta_hat + log(mu) / (a - 1).

Both bounds are then made monotone in the order (RDP never decreases with it) and
converted to (epsilon, delta) by dp_accounting. `dp_accounting`'s own
`RepeatAndSelectDpEvent` covers eta >= 0 and Poisson; this module also takes
-1 < eta < 0 (Fig. 1.7 uses eta = -0.5), samples h from exactly the distribution it
accounts, and is tested against dp_accounting where both apply.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence, Union

import dp_accounting
import numpy as np

from tff_silo.privacy import accounting

_compute_delta = dp_accounting.rdp.rdp_privacy_accountant.compute_delta


@dataclasses.dataclass(frozen=True)
class TruncatedNegativeBinomial:
  """TNB(eta, gamma): the number of trials, h >= 1 (module docstring)."""

  eta: float
  gamma: float

  def __post_init__(self):
    if not (math.isfinite(self.eta) and self.eta > -1):
      raise ValueError(f"eta must be a finite number > -1, got {self.eta}")
    if not 0 < self.gamma < 1:
      raise ValueError(f"gamma must be in (0, 1), got {self.gamma}")

  @classmethod
  def with_mean(cls, eta: float, mean: float) -> "TruncatedNegativeBinomial":
    """The TNB(eta, gamma) with E[h] = mean (gamma by bisection: the mean falls as
    gamma grows, from infinity at 0 to 1 at 1)."""
    if not (math.isfinite(mean) and mean > 1):
      raise ValueError(f"the mean number of trials must be a finite number > 1, got "
                       f"{mean}")
    cls(eta, 0.5)   # checks eta
    low, high = 0.0, 1.0
    for _ in range(200):
      middle = (low + high) / 2
      if middle in (low, high):
        break
      if cls(eta, middle).mean > mean:
        low = middle
      else:
        high = middle
    return cls(eta, high)

  @property
  def mean(self) -> float:
    g = self.gamma
    if self.eta == 0:
      return (1 / g - 1) / math.log(1 / g)
    return self.eta * (1 - g) / (g * -math.expm1(self.eta * math.log(g)))

  def pmf(self, h_max: int) -> np.ndarray:
    """P[h] for h = 1..h_max (index h - 1)."""
    h = np.arange(1, h_max + 1, dtype=np.float64)
    g = self.gamma
    if self.eta == 0:
      return np.exp(h * math.log1p(-g) - np.log(h) - math.log(math.log(1 / g)))
    # prod_{l<h} (l + eta) / (l + 1) = Gamma(h + eta) / (Gamma(eta) Gamma(h + 1)),
    # kept as a running product so that eta in (-1, 0) needs no negative Gamma.
    ratios = (h - 1 + self.eta) / h
    return np.cumprod(ratios * (1 - g)) / (g ** -self.eta - 1)

  def sample(self, rng: np.random.Generator) -> int:
    """One draw of h (inverse CDF over the pmf, extended until it covers the draw)."""
    u = rng.random()
    h_max = max(64, int(4 * self.mean))
    while True:
      cdf = np.cumsum(self.pmf(h_max))
      if cdf[-1] >= u:
        return int(np.searchsorted(cdf, u, side="left")) + 1
      if cdf[-1] >= 1 - 1e-15 or h_max > 10 ** 8:   # u lies in float rounding
        return h_max
      h_max *= 4


@dataclasses.dataclass(frozen=True)
class PoissonTrials:
  """Poisson(mu) trials; h = 0 releases nothing (P&S sec. 3.3)."""

  mu: float

  def __post_init__(self):
    if not (math.isfinite(self.mu) and self.mu > 0):
      raise ValueError(f"mu (the mean number of trials) must be a finite number > 0, "
                       f"got {self.mu}")

  @property
  def mean(self) -> float:
    return self.mu

  def sample(self, rng: np.random.Generator) -> int:
    return int(rng.poisson(self.mu))


Trials = Union[TruncatedNegativeBinomial, PoissonTrials]


def _orders_and_rdp(orders, rdp):
  orders, rdp = np.asarray(orders, np.float64), np.asarray(rdp, np.float64)
  if orders.shape != rdp.shape or orders.ndim != 1:
    raise ValueError("orders and rdp must be 1-D sequences of one length")
  if np.any(orders <= 1) or np.any(np.diff(orders) <= 0):
    raise ValueError("RDP orders must be > 1 and increasing")
  return orders, rdp


def repeat_and_select_rdp(orders: Sequence[float], rdp: Sequence[float],
                          trials: Trials) -> np.ndarray:
  """The RDP curve (at `orders`) of releasing the best of h ~ `trials` runs of a
  mechanism whose RDP curve is `rdp` (module docstring)."""
  orders, rdp = _orders_and_rdp(orders, rdp)
  if isinstance(trials, TruncatedNegativeBinomial):
    constant = (1 + trials.eta) * np.min((1 - 1 / orders) * rdp
                                         + math.log(1 / trials.gamma) / orders)
    out = rdp + constant + math.log(trials.mean) / (orders - 1)
  elif isinstance(trials, PoissonTrials):
    out = np.array([
        e + trials.mu * _compute_delta(orders, rdp, math.log1p(1 / (a - 1)))[0]
        + math.log(trials.mu) / (a - 1) for a, e in zip(orders, rdp)])
  else:
    raise TypeError(f"trials must be a TruncatedNegativeBinomial or PoissonTrials, got "
                    f"{type(trials).__name__}")
  # RDP is non-decreasing in the order: a bound at a higher order holds at a lower.
  return np.minimum.accumulate(out[::-1])[::-1]


def repeat_and_select_epsilon(orders: Sequence[float], rdp: Sequence[float],
                              trials: Trials, target_delta: float,
                              tail: float = 0.0) -> float:
  """Epsilon at `target_delta` of the best of h ~ `trials` runs (dp_accounting's
  RDP-to-(epsilon, delta) conversion), each trial's sampler `tail` (a union over
  the trials run: E[h] tails) taken from delta."""
  out = repeat_and_select_rdp(orders, rdp, trials)
  return accounting.epsilon_from_rdp(orders, out, target_delta, trials.mean * tail)


def gaussian_rdp(noise_multiplier: float, orders: Sequence[float]) -> np.ndarray:
  """RDP of the Gaussian mechanism with noise multiplier z: a / (2 z^2)."""
  return np.asarray(orders, np.float64) / (2 * noise_multiplier ** 2)


# Orders for the small epsilons of tuned releases (the log E[h] / (a - 1) term wants
# high orders where epsilon is small): the accountant's, then up to 8192.
TUNING_ORDERS = accounting.RDP_ORDERS + tuple(float(2 ** k) for k in range(9, 14))


def event_rdp(event: dp_accounting.DpEvent, neighbouring: str = "add_remove",
              orders: Sequence[float] = TUNING_ORDERS) -> np.ndarray:
  """dp_accounting's RDP curve of `event` at `orders`."""
  accountant = dp_accounting.rdp.RdpAccountant(
      list(orders), accounting.neighbouring_relation(neighbouring))
  accountant.compose(event)
  return accountant._rdp.copy()   # pylint: disable=protected-access


def tuned_epsilon(trial_event: dp_accounting.DpEvent, trials, target_delta: float,
                  neighbouring: str = "add_remove",
                  orders: Sequence[float] = TUNING_ORDERS,
                  tail: Optional[float] = None) -> float:
  """Epsilon at `target_delta` of releasing the best of h ~ `trials` runs of a trial
  whose queries are `trial_event` (None `trials`: one run, no tuning). `tail`: a
  trial's Gaussian sampler tail, taken from delta (default: that of the library's
  sampler, `accounting.sampler_tail`; 0 for noise drawn elsewhere)."""
  rdp = event_rdp(trial_event, neighbouring, orders)
  if tail is None:
    tail = accounting.sampler_tail(trial_event, neighbouring)
  if trials is None:
    return accounting.epsilon_from_rdp(orders, rdp, target_delta, tail)
  return repeat_and_select_epsilon(orders, rdp, trials, target_delta, tail)


def all_trials_epsilon(trial_event: dp_accounting.DpEvent, num_trials: int,
                       target_delta: float, neighbouring: str = "add_remove",
                       orders: Sequence[float] = TUNING_ORDERS) -> float:
  """Epsilon at `target_delta` of releasing every one of `num_trials` trials (h
  public), each of queries `trial_event`: their composition, h times the trial's
  RDP. What publishing a tuning's every trial costs, against `tuned_epsilon`'s
  best alone."""
  if int(num_trials) != num_trials or num_trials < 1:
    raise ValueError(f"num_trials must be a positive integer, got {num_trials}")
  rdp = num_trials * event_rdp(trial_event, neighbouring, orders)
  return accounting.epsilon_from_rdp(
      orders, rdp, target_delta,
      num_trials * accounting.sampler_tail(trial_event, neighbouring))


def calibrate_noise(target_epsilon: float, target_delta: float, event_for, trials=None,
                    neighbouring: str = "add_remove",
                    orders: Sequence[float] = TUNING_ORDERS) -> float:
  """The smallest noise multiplier z (to relative 1e-6, rounded up) for which
  `tuned_epsilon(event_for(z), trials, ...)` is at most `target_epsilon`: the
  returned z never overshoots. `event_for(z)` is a trial's `DpEvent` at noise z
  (e.g. `dp_accounting.GaussianDpEvent` for one Gaussian release)."""
  if not (math.isfinite(target_epsilon) and target_epsilon > 0):
    raise ValueError(f"target_epsilon must be a finite number > 0, got {target_epsilon}")
  if not 0 < target_delta < 1:
    raise ValueError(f"target_delta must be in (0, 1), got {target_delta}")
  epsilon = lambda z: tuned_epsilon(event_for(z), trials, target_delta, neighbouring,
                                    orders)
  low, high = 1e-3, 1.0
  while epsilon(high) > target_epsilon:
    low, high = high, high * 2
    if high > 1e7:
      raise ValueError(f"no noise multiplier up to 1e7 reaches epsilon "
                       f"{target_epsilon} at delta {target_delta}")
  return _boundary(lambda z: epsilon(z) <= target_epsilon, low, high, 1e-6)


def _boundary(holds, fails_at: float, holds_at: float, tolerance: float) -> float:
  """Bisects between a point where the monotone condition `holds` fails and one
  where it holds, to relative `tolerance`; returns the end where it holds."""
  while abs(holds_at - fails_at) > tolerance * max(abs(holds_at), abs(fails_at)):
    middle = (fails_at + holds_at) / 2
    if holds(middle):
      holds_at = middle
    else:
      fails_at = middle
  return holds_at


def calibrate_trial_epsilon(target_epsilon: float, target_delta: float, event_for,
                            trials, neighbouring: str = "add_remove",
                            orders: Sequence[float] = TUNING_ORDERS) -> float:
  """The largest epsilon e (to relative 1e-4, rounded down) such that the best of
  h ~ `trials` trials, each of queries `event_for(e)` (a run calibrated to spend e,
  with whatever else it releases), is (target_epsilon, target_delta)-DP: the budget
  to give each trial of a tuning. The result never overshoots."""
  if not (math.isfinite(target_epsilon) and target_epsilon > 0):
    raise ValueError(f"target_epsilon must be a finite number > 0, got {target_epsilon}")
  total = lambda e: tuned_epsilon(event_for(e), trials, target_delta, neighbouring,
                                  orders)
  low, high = target_epsilon, target_epsilon
  while total(low) > target_epsilon:
    high, low = low, low / 2
    if low < 1e-6 * target_epsilon:
      raise ValueError(f"no trial budget reaches epsilon {target_epsilon} at delta "
                       f"{target_delta} once tuned")
  return _boundary(lambda e: total(e) <= target_epsilon, high, low, 1e-4)


def draw_trials(trials: Trials, num_candidates: int, rng: np.random.Generator) -> list:
  """Random-repeat tuning's plan: h ~ `trials`, then h candidate indices drawn
  uniformly with replacement from range(num_candidates) (each trial picks its
  hyperparameter at random, P&S sec. 1.1)."""
  if num_candidates < 1:
    raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
  return [int(i) for i in rng.integers(0, num_candidates, trials.sample(rng))]


def expected_best(values: Sequence[float], trials: Trials) -> float:
  """E over h ~ `trials` and h uniform draws (with replacement) of `values` of the
  smallest value drawn: what random-repeat tuning releases when it scores each
  candidate exactly (an upper bound on what it can reach). h = 0 (Poisson) releases
  the first candidate (in `benchmarks.tuning_cost`, lambda = 0: local training).
  With the values sorted v_1 <= ... <= v_G, P[min >= v_j | h] = ((G - j + 1) / G)^h."""
  values = np.asarray(values, np.float64)
  ordered, g = np.sort(values), len(values)
  above = (g - np.arange(g)) / g            # P[a draw >= v_j], j = 1..G

  def given(h):
    at_least = above ** h
    return float(np.sum(ordered * (at_least - np.append(at_least[1:], 0.0))))

  if isinstance(trials, TruncatedNegativeBinomial):
    pmf = trials.pmf(max(64, int(50 * trials.mean)))
    # the mass beyond: so many draws that the smallest value is all but certain
    return float(sum(p * given(h) for h, p in enumerate(pmf, 1) if p > 0)
                 + (1 - pmf.sum()) * ordered[0])
  import scipy.stats   # pylint: disable=g-import-not-at-top
  h = np.arange(0, int(trials.mu + 20 * math.sqrt(trials.mu) + 20))
  pmf = scipy.stats.poisson.pmf(h, trials.mu)
  return float(pmf[0] * values[0] + sum(p * given(k) for k, p in zip(h[1:], pmf[1:])))
