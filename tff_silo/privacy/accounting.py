"""Privacy accounting for silo-specific example-level DP (thesis Def. 1.3.1).

Every silo runs DP-SGD on its own examples: `steps` applications of the Gaussian
mechanism (noise multiplier z, clip C) to subsampled batches with sampling rate
q = B / m_k (m_k the silo's public size, `tff_silo.privacy.protocol`). Its Renyi-DP
is composed with `dp_accounting`'s RDP accountant and converted to (epsilon, delta).

Private selections (IFCA's exponential mechanism, thesis sec. 1.2) are
(eps^2 / 8)-zCDP, i.e. (alpha, alpha * eps^2 / 8)-RDP for every order alpha. That curve
is exactly the RDP of a Gaussian mechanism with noise multiplier 2 / eps
(alpha / (2 z^2)), so a selection is described as that `GaussianDpEvent` and composed
with the DP-SGD event.

Neighbouring relations (`NEIGHBOURING`, `events`):
- `add_remove` (add or remove one example) with Poisson sampling at rate q: the
  Poisson-subsampled Gaussian, noise multiplier z (a clipped sum moves by C).
- `replace_one` (replace one example; the silo's size n is public) with B of the n
  examples sampled without replacement each step (Wang, Balle, Kasiviswanathan 2019,
  Thm. 27, `SampledWithoutReplacementDpEvent`): replacing an example moves a clipped
  sum by up to 2C, so noise of standard deviation z C is a Gaussian mechanism with
  multiplier z / 2 relative to the sensitivity.

Other queries (standardization statistics) come as `extra_events`: Gaussian
mechanisms composed with the rest.

Node-level DP (`node_examples` = S, replace_one only): the protected unit is a node
that lies in at most S of the silo's examples (a neighbourhood and its neighbours'
ones, thesis ch. 2); each step of B of the n examples drawn without replacement is
a `node_level.NodeLevelDpEvent` (Theorem 2.4.4 as printed).

The library's Gaussian noise (`gaussian`) has a support bound; the probability that
it matters, `sampler_tail` of an event, is taken from delta before every conversion
to epsilon here (and in `ledger`, `node_level`, `tuning`): a reported (epsilon,
delta) holds for the noise actually drawn. Selections are `SelectionDpEvent`s
(Gumbel noise, bounded in `selection`), outside that tail.

`calibrate_noise_multiplier` brackets and bisects the noise multiplier and returns the
upper end of the bracket, rounded up to the next float32 (the processes run in
float32), so the epsilon it implies never exceeds the target. Results are kept on
disk (`calibration_cache`) and reused once dp_accounting confirms them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from typing import Optional

import dp_accounting
import numpy as np
import scipy.optimize
import scipy.special

from tff_silo.privacy import calibration_cache, node_level
# The events and relations every accountant shares (`events`), part of this API too.
from tff_silo.privacy.events import (  # pylint: disable=unused-import
    NEIGHBOURING, REPLACE_ONE_SENSITIVITY_FACTOR, SelectionDpEvent, check_neighbouring,
    delta_after_tail, neighbouring_relation, sampler_tail, selection_event)

# Orders used by the RDP accountant: every integer order up to 64 plus larger ones
# up to 256 (optimal for epsilons down to ~0.05), and a few fractional orders below 2
# for large epsilons (each costs ~20x an integer order in dp_accounting).
RDP_ORDERS = (1.25, 1.5, 1.75) + tuple(float(a) for a in range(2, 65)) + (
    72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 256.0)

CALIBRATION_RELATIVE_TOLERANCE = 1e-4
_MAX_NOISE_MULTIPLIER = 1e7

def _check_common(sampling_rate, steps, target_delta, selection_epsilon, num_selections):
  if not 0.0 < sampling_rate <= 1.0:
    raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
  if int(steps) != steps or steps < 0:
    raise ValueError(f"steps must be a non-negative integer, got {steps}")
  if not 0.0 < target_delta < 1.0:
    raise ValueError(f"target_delta must be in (0, 1), got {target_delta}")
  if int(num_selections) != num_selections or num_selections < 0:
    raise ValueError(f"num_selections must be a non-negative integer, got {num_selections}")
  if num_selections > 0 and (selection_epsilon is None or selection_epsilon <= 0):
    raise ValueError("selection_epsilon must be positive when num_selections > 0, "
                     f"got {selection_epsilon}")


def dp_sgd_event(noise_multiplier: float, sampling_rate: float, steps: int, *,
                 neighbouring: str = "add_remove",
                 dataset_size: Optional[int] = None,
                 node_examples: Optional[int] = None) -> dp_accounting.DpEvent:
  """`steps` DP-SGD steps with noise std z C: Poisson-subsampled Gaussians at rate q
  (`add_remove`), or round(q n) of the `dataset_size` n examples sampled without
  replacement, multiplier z / 2 (`replace_one`); with `node_examples` S, node-level
  steps (`node_level`, replace_one)."""
  check_neighbouring(neighbouring)
  if node_examples is not None:
    if neighbouring != "replace_one" or dataset_size is None:
      raise ValueError("node-level accounting (node_examples) needs replace_one and "
                       "the public dataset_size (uniform batches of a fixed size)")
    return node_level.training_event(   # no more examples change than there are
        noise_multiplier, int(dataset_size), int(min(node_examples, dataset_size)),
        int(round(sampling_rate * dataset_size)), int(steps))
  if neighbouring == "add_remove":
    step = dp_accounting.PoissonSampledDpEvent(
        sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
  else:
    if dataset_size is None or int(dataset_size) != dataset_size or dataset_size < 1:
      raise ValueError("replace_one accounting needs the (public) dataset_size, got "
                       f"{dataset_size}")
    step = dp_accounting.SampledWithoutReplacementDpEvent(
        int(dataset_size), int(round(sampling_rate * dataset_size)),
        dp_accounting.GaussianDpEvent(noise_multiplier / REPLACE_ONE_SENSITIVITY_FACTOR))
  return dp_accounting.SelfComposedDpEvent(step, int(steps))


def epsilon_from_rdp(orders, rdp, target_delta: float, tail: float = 0.0) -> float:
  """dp_accounting's epsilon of an RDP curve at `target_delta` less `tail`."""
  delta = delta_after_tail(target_delta, tail)
  if delta <= 0:
    return math.inf
  eps, _ = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(
      np.asarray(orders, np.float64), np.asarray(rdp, np.float64), delta)
  return float(eps)


def _check_extra(extra_events):
  for event in extra_events:
    if not isinstance(event, dp_accounting.GaussianDpEvent):
      raise TypeError(f"extra_events must be GaussianDpEvents, got {event}")


def silo_event(noise_multiplier: float, sampling_rate: float, steps: int, *,
               selection_epsilon: Optional[float] = None, num_selections: int = 0,
               neighbouring: str = "add_remove", dataset_size: Optional[int] = None,
               extra_events: tuple = (),
               node_examples: Optional[int] = None) -> dp_accounting.DpEvent:
  """Everything one silo's data is queried for: DP-SGD (when it runs steps), private
  selections and `extra_events` (Gaussian mechanisms, e.g. standardization)."""
  events = list(extra_events)
  if steps > 0:
    events.append(dp_sgd_event(noise_multiplier, sampling_rate, steps,
                               neighbouring=neighbouring, dataset_size=dataset_size,
                               node_examples=node_examples))
  if num_selections > 0:
    events.append(selection_event(selection_epsilon, num_selections))
  return dp_accounting.ComposedDpEvent(events)


@functools.lru_cache(maxsize=65536)
def _epsilon(noise_multiplier, sampling_rate, steps, target_delta, selection_epsilon,
             num_selections, neighbouring="add_remove", dataset_size=None,
             extra_events=(), node_examples=None) -> float:
  accountant = node_level.NodeLevelRdpAccountant(list(RDP_ORDERS),
                                                 neighbouring_relation(neighbouring))
  event = silo_event(noise_multiplier, sampling_rate, steps,
                     selection_epsilon=selection_epsilon, num_selections=num_selections,
                     neighbouring=neighbouring, dataset_size=dataset_size,
                     extra_events=extra_events, node_examples=node_examples)
  accountant.compose(event)
  delta = delta_after_tail(target_delta, sampler_tail(event, neighbouring))
  return float(accountant.get_epsilon(delta)) if delta > 0 else math.inf


def epsilon_spent(noise_multiplier: float, sampling_rate: float, steps: int,
                  target_delta: float, *, selection_epsilon: Optional[float] = None,
                  num_selections: int = 0, neighbouring: str = "add_remove",
                  dataset_size: Optional[int] = None, extra_events: tuple = (),
                  node_examples: Optional[int] = None) -> float:
  """Epsilon at `target_delta` of DP-SGD, selections and `extra_events`; inf when
  DP-SGD runs steps without noise; 0 when nothing is queried."""
  _check_common(sampling_rate, steps, target_delta, selection_epsilon, num_selections)
  _check_extra(extra_events)
  if noise_multiplier < 0:
    raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
  if noise_multiplier == 0 and steps > 0:
    return math.inf
  return _epsilon(float(noise_multiplier), float(sampling_rate), int(steps),
                  float(target_delta), selection_epsilon, int(num_selections),
                  check_neighbouring(neighbouring), dataset_size, tuple(extra_events),
                  node_examples)


def calibrate_noise_multiplier(target_epsilon: float, target_delta: float,
                               sampling_rate: float, steps: int, *,
                               selection_epsilon: Optional[float] = None,
                               num_selections: int = 0,
                               neighbouring: str = "add_remove",
                               dataset_size: Optional[int] = None,
                               extra_events: tuple = (),
                               node_examples: Optional[int] = None) -> float:
  """The smallest noise multiplier (to a relative tolerance, rounded up to a float32)
  whose epsilon at `target_delta`, with the selections and `extra_events` composed,
  is at most `target_epsilon`; never overshoots the target.

  Raises:
    ValueError: bad arguments, or a target the other queries alone already exceed.
  """
  _check_common(sampling_rate, steps, target_delta, selection_epsilon, num_selections)
  _check_extra(extra_events)
  if not target_epsilon > 0 or not math.isfinite(target_epsilon):
    raise ValueError(f"target_epsilon must be a positive finite number, got {target_epsilon}")
  args = (float(sampling_rate), int(steps), float(target_delta),
          None if selection_epsilon is None else float(selection_epsilon),
          int(num_selections), check_neighbouring(neighbouring), dataset_size,
          tuple(extra_events), node_examples)
  if num_selections > 0 or extra_events:
    floor = _epsilon(_MAX_NOISE_MULTIPLIER, *args)
    if floor > target_epsilon:
      raise ValueError(
          f"target_epsilon={target_epsilon} cannot be met: the queries besides DP-SGD "
          f"({num_selections} selections, {len(extra_events)} other) alone spend "
          f"{floor:.4g}")
  if steps == 0:
    return 0.0
  return _calibrate(float(target_epsilon), *args)


_INTEGER_ORDERS = np.array([a for a in RDP_ORDERS if a == int(a)])


def _search_epsilon(noise_multiplier, sampling_rate, steps, target_delta,
                    selection_epsilon, num_selections, neighbouring="add_remove",
                    dataset_size=None, extra_events=(), node_examples=None) -> float:
  """Epsilon from the integer orders only, in closed form (vectorized numpy).

  For integer alpha the Poisson-subsampled Gaussian has RDP
  log(sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2))) / (alpha - 1)
  (Mironov, Talwar, Zhang 2019). Fewer orders can only give a larger epsilon than
  `_epsilon`, so a noise multiplier found with this function also meets the target
  under `dp_accounting`; it is only used to search, `_epsilon` has the last word.
  `replace_one` (node-level included) has no closed form here and searches on
  `_epsilon` itself.
  """
  if neighbouring != "add_remove" or node_examples is not None:
    return _epsilon(noise_multiplier, sampling_rate, steps, target_delta,
                    selection_epsilon, num_selections, neighbouring, dataset_size,
                    extra_events, node_examples)
  q, z = sampling_rate, noise_multiplier
  alphas = _INTEGER_ORDERS
  k = np.arange(int(alphas.max()) + 1)
  log_comb = (scipy.special.gammaln(alphas[:, None] + 1) - scipy.special.gammaln(k + 1)
              - scipy.special.gammaln(np.maximum(alphas[:, None] - k, 0) + 1))
  if q == 1.0:
    rdp = steps * alphas / (2.0 * z * z)
  else:
    remaining = np.maximum(alphas[:, None] - k, 0)
    terms = (log_comb + k * np.log(q) + remaining * np.log1p(-q)
             + (k * k - k) / (2.0 * z * z))
    terms = np.where(k[None, :] <= alphas[:, None], terms, -np.inf)
    rdp = steps * scipy.special.logsumexp(terms, axis=1) / (alphas - 1.0)
  if num_selections > 0:
    rdp = rdp + num_selections * alphas * selection_epsilon ** 2 / 8.0
  for event in extra_events:   # Gaussian: alpha / (2 z^2)
    rdp = rdp + alphas / (2.0 * event.noise_multiplier ** 2)
  tail = sampler_tail(silo_event(z, q, steps, extra_events=extra_events))
  return epsilon_from_rdp(alphas, rdp, target_delta, tail)


# Bump when the search below changes what it returns (2: the sampler's tail).
_CALIBRATION_VERSION = 2
_DISK_CACHE = calibration_cache.CalibrationCache(dict(
    search=_CALIBRATION_VERSION, orders=RDP_ORDERS,
    tolerance=CALIBRATION_RELATIVE_TOLERANCE,
    dp_accounting=importlib.metadata.version("dp-accounting")))


@functools.lru_cache(maxsize=4096)
def _calibrate(target_epsilon, *args) -> float:
  """`_search_noise_multiplier`, through the on-disk cache: a cached multiplier is
  used only after dp_accounting confirms that it meets the target and that a
  relative tolerance less noise would not (so it is what the search returns)."""
  key = repr((target_epsilon, *args))
  cached = _DISK_CACHE.get(key)
  if (cached is not None and cached > 0
      and _epsilon(cached, *args) <= target_epsilon
      and _epsilon(cached * (1 - CALIBRATION_RELATIVE_TOLERANCE), *args) > target_epsilon):
    return cached
  z = _search_noise_multiplier(target_epsilon, *args)
  _DISK_CACHE.put(key, z)
  return z


def _search_noise_multiplier(target_epsilon, *args) -> float:
  def gap(z, epsilon_fn=_search_epsilon):
    return math.log(epsilon_fn(z, *args)) - math.log(target_epsilon)
  lo, hi = 0.5, 1.0
  while gap(lo) <= 0 and lo > 1e-6:
    lo /= 4.0
  while gap(hi) > 0:
    lo, hi = hi, 4.0 * hi
    if hi > _MAX_NOISE_MULTIPLIER:
      raise ValueError(f"no noise multiplier up to {_MAX_NOISE_MULTIPLIER:g} meets "
                       f"target_epsilon={target_epsilon}")
  rtol = CALIBRATION_RELATIVE_TOLERANCE / 4
  z = lo if gap(lo) <= 0 else scipy.optimize.brentq(gap, lo, hi, rtol=rtol)
  while gap(z) > 0:  # cheap: the search epsilon bounds dp_accounting's from above
    z *= 1.0 + rtol
  exact_gap = lambda z: gap(z, _epsilon)
  z_gap = exact_gap(z)
  if z_gap < math.log1p(-CALIBRATION_RELATIVE_TOLERANCE):
    # Loose: the fractional orders (large epsilons) allow less noise. Refine on
    # dp_accounting's epsilon itself.
    lo = z / 2.0
    while exact_gap(lo) <= 0 and lo > 1e-6:
      lo /= 2.0
    if exact_gap(lo) > 0:
      z = scipy.optimize.brentq(exact_gap, lo, z, rtol=rtol)
      z_gap = exact_gap(z)
  # The root is moved up until dp_accounting confirms epsilon <= target, then to
  # the float32 the processes will use (rounded up: more noise, less epsilon).
  while z_gap > 0:
    z *= 1.0 + rtol
    z_gap = exact_gap(z)
  return float32_at_least(z)


def float32_at_least(value: float) -> float:
  """The smallest float32 >= `value`, as a Python float."""
  rounded = np.float32(value)
  if float(rounded) < value:
    rounded = np.nextafter(rounded, np.float32(np.inf))
  return float(rounded)
