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
mechanisms composed with the rest, and the `IntegerNoiseTail` of their integer noise.

Node-level DP (`node_examples` = S, replace_one only): the protected unit is a node
that lies in at most S of the silo's examples (a neighbourhood and its neighbours'
ones, thesis ch. 2); each step of B of the n examples drawn without replacement is
a `node_level.NodeLevelDpEvent` (Theorem 2.4.4 as printed).

The library's Gaussian noise (`gaussian`) has a support bound; the probability that
it matters, `sampler_tail` of an event, is taken from delta before every conversion
to epsilon here (and in `ledger`, `node_level`, `tuning`). For that sampler a
reported (epsilon, delta) is the real-valued Gaussian's: the float grid of the
draws (the radius's 2^32-point grid, `gaussian`) adds to delta what no accountant
here charges, and rows say so (`benchmarks.common.NOISE_MECHANISM`; issue 53).
DP-SGD with integer noise (`integer_coordinates`, `integer_gaussian`) has no grid:
it is the Gaussian mechanism post-processed, its sampler's gap an
`IntegerNoiseTail`. Selections are `SelectionDpEvent`s (Gumbel noise, bounded in
`selection`), outside that tail.

`calibrate_noise_multipliers` calibrates a run's distinct silo settings together:
a bisection of the noise multiplier on `rdp_curves` (the RDP curves of all settings
at once, ~0.1 s for School's 85 settings under the paper's protocol, where
dp_accounting's Python takes ~4 s), keeping the upper end of the bracket, rounded up
to the next float32 (the processes run in float32); dp_accounting's own accountant
then confirms each multiplier at the setting's optimal order (the epsilon at one
order bounds the one over all orders from above), so the epsilon it implies never
exceeds the target. The epsilon reported (`epsilons_spent`) is dp_accounting's at
that order. Node-level settings are searched on dp_accounting's accountant itself.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import dp_accounting
import numpy as np
import scipy.optimize

from tff_silo.privacy import node_level, pld, rdp_curves
from tff_silo.privacy.gaussian_tail import float32_at_least
# The events and relations every accountant shares (`events`), part of this API too.
from tff_silo.privacy.events import (  # pylint: disable=unused-import
    NEIGHBOURING, REPLACE_ONE_SENSITIVITY_FACTOR, SelectionDpEvent, check_neighbouring,
    IntegerNoiseTail, delta_after_tail, neighbouring_relation, sampler_tail,
    selection_event)

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
                 node_examples: Optional[int] = None,
                 integer_coordinates: int = 0) -> dp_accounting.DpEvent:
  """`steps` DP-SGD steps with noise std z C: Poisson-subsampled Gaussians at rate q
  (`add_remove`), or round(q n) of the `dataset_size` n examples sampled without
  replacement, multiplier z / 2 (`replace_one`); with `node_examples` S, node-level
  steps (`node_level`, replace_one). With `integer_coordinates` d > 0 the steps
  release d coordinates of integer noise each (`integer_gaussian`; z its effective
  multiplier): the same Gaussian events, beside the sampler's `IntegerNoiseTail`."""
  check_neighbouring(neighbouring)
  if integer_coordinates:   # contributions clipped to sqrt(bound), noise SIGMA: z_eff
    return dp_accounting.ComposedDpEvent([
        dp_sgd_event(noise_multiplier, sampling_rate, steps, neighbouring=neighbouring,
                     dataset_size=dataset_size, node_examples=node_examples),
        IntegerNoiseTail(int(steps) * int(integer_coordinates))])
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
    if not isinstance(event, (dp_accounting.GaussianDpEvent, IntegerNoiseTail)):
      raise TypeError("extra_events must be GaussianDpEvents or IntegerNoiseTails, got "
                      f"{event}")


def silo_event(noise_multiplier: float, sampling_rate: float, steps: int, *,
               selection_epsilon: Optional[float] = None, num_selections: int = 0,
               neighbouring: str = "add_remove", dataset_size: Optional[int] = None,
               extra_events: tuple = (),
               node_examples: Optional[int] = None,
               integer_coordinates: int = 0) -> dp_accounting.DpEvent:
  """Everything one silo's data is queried for: DP-SGD (when it runs steps; integer
  noise over `integer_coordinates` coordinates when that is > 0), private
  selections and `extra_events` (Gaussian mechanisms, e.g. standardization)."""
  events = list(extra_events)
  if steps > 0:
    events.append(dp_sgd_event(noise_multiplier, sampling_rate, steps,
                               neighbouring=neighbouring, dataset_size=dataset_size,
                               node_examples=node_examples,
                               integer_coordinates=integer_coordinates))
  if num_selections > 0:
    events.append(selection_event(selection_epsilon, num_selections))
  return dp_accounting.ComposedDpEvent(events)


@functools.lru_cache(maxsize=65536)
def _epsilon(noise_multiplier, sampling_rate, steps, target_delta, selection_epsilon,
             num_selections, neighbouring="add_remove", dataset_size=None,
             extra_events=(), node_examples=None, integer_coordinates=0,
             orders=RDP_ORDERS) -> float:
  """dp_accounting's own epsilon (its RDP accountant at `orders`)."""
  accountant = node_level.NodeLevelRdpAccountant(list(orders),
                                                 neighbouring_relation(neighbouring))
  event = silo_event(noise_multiplier, sampling_rate, steps,
                     selection_epsilon=selection_epsilon, num_selections=num_selections,
                     neighbouring=neighbouring, dataset_size=dataset_size,
                     extra_events=extra_events, node_examples=node_examples,
                     integer_coordinates=integer_coordinates)
  accountant.compose(event)
  delta = delta_after_tail(target_delta, sampler_tail(event, neighbouring))
  return float(accountant.get_epsilon(delta)) if delta > 0 else math.inf


class SiloSetting(NamedTuple):
  """Everything but the noise that one silo's epsilon depends on (`silo_setting`);
  in the order of `_epsilon`'s arguments after the noise multiplier."""
  sampling_rate: float
  steps: int
  target_delta: float
  selection_epsilon: Optional[float]
  num_selections: int
  neighbouring: str
  dataset_size: Optional[int]
  extra_events: tuple
  node_examples: Optional[int]
  integer_coordinates: int = 0


def silo_setting(sampling_rate, steps, target_delta, selection_epsilon=None,
                 num_selections=0, neighbouring="add_remove", dataset_size=None,
                 extra_events=(), node_examples=None,
                 integer_coordinates=0) -> SiloSetting:
  """The checked `SiloSetting` of one silo's queries (arguments as `epsilon_spent`'s)."""
  _check_common(sampling_rate, steps, target_delta, selection_epsilon, num_selections)
  _check_extra(extra_events)
  if int(integer_coordinates) != integer_coordinates or integer_coordinates < 0:
    raise ValueError("integer_coordinates must be a non-negative integer, got "
                     f"{integer_coordinates}")
  return SiloSetting(
      float(sampling_rate), int(steps), float(target_delta),
      None if selection_epsilon is None else float(selection_epsilon),
      int(num_selections), check_neighbouring(neighbouring),
      None if dataset_size is None else int(dataset_size), tuple(extra_events),
      None if node_examples is None else int(node_examples), int(integer_coordinates))


def epsilon_spent(noise_multiplier: float, sampling_rate: float, steps: int,
                  target_delta: float, *, selection_epsilon: Optional[float] = None,
                  num_selections: int = 0, neighbouring: str = "add_remove",
                  dataset_size: Optional[int] = None, extra_events: tuple = (),
                  node_examples: Optional[int] = None,
                  integer_coordinates: int = 0) -> float:
  """Epsilon at `target_delta` of DP-SGD (integer noise over `integer_coordinates`
  coordinates when > 0), selections and `extra_events`; inf when DP-SGD runs steps
  without noise; 0 when nothing is queried."""
  setting = silo_setting(sampling_rate, steps, target_delta, selection_epsilon,
                         num_selections, neighbouring, dataset_size, extra_events,
                         node_examples, integer_coordinates)
  return float(epsilons_spent([noise_multiplier], [setting])[0])


def epsilons_spent(noise_multipliers, settings, accountant: str = "rdp") -> np.ndarray:
  """`epsilon_spent` of many silos at once (`SiloSetting`s): the optimal order of
  each found on `rdp_curves`, the epsilon there computed by dp_accounting's own
  accountant (so never below dp_accounting's over all orders; equal to it, tests
  show); node-level settings on dp_accounting's alone. With `accountant="pld"`,
  the smaller of that and the PLD epsilon where PLD expresses the setting
  (`pld_expressible`)."""
  out = _rdp_epsilons_spent(noise_multipliers, settings)
  if pld.check_accountant(accountant) == "pld":
    for i, (zi, s) in enumerate(zip(noise_multipliers, settings)):
      if pld_expressible(s) and zi > 0:
        out[i] = min(out[i], _pld_epsilon(float(zi), s))
  return out


def pld_expressible(setting) -> bool:
  """Whether PLD expresses every query of a setting: Poisson DP-SGD steps (add/
  remove) and Gaussian extra events, no selections, not node-level."""
  return (setting.neighbouring == "add_remove" and setting.num_selections == 0
          and setting.node_examples is None)


def _pld_epsilon(noise_multiplier: float, setting) -> float:
  """The PLD epsilon of a setting's whole run (`pld.epsilon`), at its delta less
  the sampler's tail."""
  event = silo_event(noise_multiplier, setting.sampling_rate, setting.steps,
                     extra_events=setting.extra_events,
                     integer_coordinates=setting.integer_coordinates)
  delta = delta_after_tail(setting.target_delta, sampler_tail(event))
  return pld.epsilon(pld.primitives(event), delta)


def _rdp_epsilons_spent(noise_multipliers, settings) -> np.ndarray:
  z = np.asarray(noise_multipliers, np.float64)
  if (z < 0).any():
    raise ValueError(f"noise_multiplier must be >= 0, got {z.min()}")
  out = np.full(len(z), math.inf)   # DP-SGD steps without noise stay inf
  noisy = [i for i, s in enumerate(settings) if z[i] > 0 or s.steps == 0]
  wanted = {(float(z[i]), settings[i]) for i in noisy}
  found = {key: _SPENT[key] for key in wanted if key in _SPENT}
  fast = [key for key in wanted - found.keys() if _vectorizable(key[1])]
  orders = (_best_epsilons([zi for zi, _ in fast], [s for _, s in fast])[1]
            if fast else [])
  for (zi, s), order in zip(fast, orders):
    found[(zi, s)] = _epsilon(zi, *s, orders=(order,))
  for zi, s in wanted - found.keys():
    found[(zi, s)] = _epsilon(zi, *s)
  _remember(_SPENT, found)
  for i in noisy:
    out[i] = found[(float(z[i]), settings[i])]
  return out


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
  setting = silo_setting(sampling_rate, steps, target_delta, selection_epsilon,
                         num_selections, neighbouring, dataset_size, extra_events,
                         node_examples)
  return float(calibrate_noise_multipliers([target_epsilon], [setting])[0][0])


def calibrate_noise_multipliers(target_epsilons, settings, accountant: str = "rdp"
                                ) -> tuple:
  """`calibrate_noise_multiplier` of many silos at once (`SiloSetting`s), the
  distinct ones calibrated together (`_search_noise_multipliers`): (noise
  multipliers, the epsilon each spends, as `epsilons_spent` reports it). With
  `accountant="pld"`, each setting PLD expresses is then searched down from there
  on the PLD epsilon (`_calibrate_pld`)."""
  z, spent = _rdp_calibrate(target_epsilons, settings)
  if pld.check_accountant(accountant) == "pld":
    lower = {}
    for i, (t, s) in enumerate(zip(target_epsilons, settings)):
      if pld_expressible(s) and s.steps > 0:
        key = (float(t), s, float(z[i]))
        if key not in lower:
          lower[key] = _calibrate_pld(*key)
        z[i] = lower[key]
    spent = epsilons_spent(z, settings, accountant)
  return z, spent


PLD_RELATIVE_TOLERANCE = 1e-3   # PLD compositions cost ~0.2-0.6 s each


@functools.lru_cache(maxsize=4096)
def _calibrate_pld(target_epsilon: float, setting, upper: float) -> float:
  """The smallest noise multiplier below `upper` (which meets the target: RDP) whose
  PLD epsilon meets `target_epsilon`, by bisection in log z to a relative
  `PLD_RELATIVE_TOLERANCE`, keeping the upper end; rounded up to a float32 and
  checked. (RDP needs more noise: PLD is the tighter bound here, 4-7% less z.)"""
  meets = lambda z: _pld_epsilon(z, setting) <= target_epsilon
  hi, lo = upper, upper * 0.8
  while meets(lo):
    hi, lo = lo, lo * 0.8
  while hi > lo * (1 + PLD_RELATIVE_TOLERANCE):
    mid = math.sqrt(lo * hi)
    hi, lo = (mid, lo) if meets(mid) else (hi, mid)
  z = float32_at_least(hi)
  while not meets(z) and z < upper:   # a rounding difference: rare
    z = float32_at_least(z * (1 + PLD_RELATIVE_TOLERANCE))
  return min(z, upper)


def _rdp_calibrate(target_epsilons, settings) -> tuple:
  targets = [float(t) for t in target_epsilons]
  for t in targets:
    if not t > 0 or not math.isfinite(t):
      raise ValueError(f"target_epsilon must be a positive finite number, got {t}")
  unique = sorted(set(zip(targets, settings)), key=repr)   # silos of equal settings
  others = [(t, s) for t, s in unique if s.num_selections > 0 or s.extra_events]
  floors = epsilons_spent([_MAX_NOISE_MULTIPLIER] * len(others), [s for _, s in others])
  for (t, setting), floor in zip(others, floors):
    if floor > t:
      raise ValueError(
          f"target_epsilon={t} cannot be met: the queries besides DP-SGD "
          f"({setting.num_selections} selections, {len(setting.extra_events)} "
          f"other) alone spend {floor:.4g}")
  distinct = [(t, s) for t, s in unique if s.steps > 0]
  found = {key: _CALIBRATED[key] for key in distinct if key in _CALIBRATED}
  fast = [d for d in distinct if _vectorizable(d[1]) and d not in found]
  if fast:
    found.update(zip(fast, _search_noise_multipliers([t for t, _ in fast],
                                                     [s for _, s in fast])))
  for key in distinct:
    if key not in found:
      found[key] = _calibrate(key[0], *key[1])
  _remember(_CALIBRATED, found)
  z = np.array([found[(t, s)] if s.steps > 0 else 0.0
                for t, s in zip(targets, settings)])
  return z, epsilons_spent(z, settings)


# Calibrations and epsilons already computed ((target or noise multiplier, setting)
# -> value): pure functions of their keys, so a grid's runs of one setting (a
# stacked program's hundreds) calibrate once.
_CALIBRATED, _SPENT = {}, {}


def _remember(memo: dict, found: dict) -> None:
  if len(memo) + len(found) > 65536:
    memo.clear()
  memo.update(found)


def _vectorizable(setting) -> bool:
  """Whether `rdp_curves` computes this setting's curve (not node-level DP)."""
  return setting.node_examples is None


_INTEGER_ORDERS = tuple(a for a in RDP_ORDERS if a == int(a))
_SMALLEST_INTEGER_ORDER = _INTEGER_ORDERS[0]


def _curves(noise_multipliers, settings, orders) -> tuple:
  """(RDP curves at `orders`, deltas left after the sampler's tails) of the whole
  run's queries of each setting at its noise multiplier, vectorized
  (`rdp_curves`; the event objects only for the tails)."""
  z = np.asarray(noise_multipliers, np.float64)
  steps = np.array([s.steps for s in settings], np.float64)
  rdp = np.zeros((len(z), len(orders)))
  poisson = np.array([s.neighbouring == "add_remove" for s in settings])
  if poisson.any():
    rdp[poisson] = rdp_curves.poisson_gaussian(
        [s.sampling_rate for s in settings if s.neighbouring == "add_remove"],
        z[poisson], orders)
  if (~poisson).any():   # round(q n) of the n examples, as `dp_sgd_event` samples
    rdp[~poisson] = rdp_curves.without_replacement_gaussian(
        [round(s.sampling_rate * s.dataset_size) / s.dataset_size
         for s in settings if s.neighbouring != "add_remove"],
        z[~poisson] / REPLACE_ONE_SENSITIVITY_FACTOR, orders)
  with np.errstate(invalid="ignore"):   # no steps: no DP-SGD, whatever its noise
    rdp = np.where(steps[:, None] > 0, steps[:, None] * rdp, 0.0)
  for i, s in enumerate(settings):
    if s.num_selections > 0:   # selections: Gaussians of multiplier 2 / eps (`events`)
      rdp[i] += s.num_selections * rdp_curves.gaussian([2.0 / s.selection_epsilon],
                                                       orders)[0]
    for event in s.extra_events:   # (an IntegerNoiseTail adds only to the tail)
      if isinstance(event, dp_accounting.GaussianDpEvent):
        rdp[i] += rdp_curves.gaussian([event.noise_multiplier], orders)[0]
  deltas = [delta_after_tail(s.target_delta, sampler_tail(silo_event(
      zi, s.sampling_rate, s.steps, selection_epsilon=s.selection_epsilon,
      num_selections=s.num_selections, neighbouring=s.neighbouring,
      dataset_size=s.dataset_size, extra_events=s.extra_events,
      integer_coordinates=s.integer_coordinates), s.neighbouring))
            for zi, s in zip(z, settings)]
  return rdp, deltas


def _fast_epsilons(noise_multipliers, settings, orders) -> tuple:
  """(epsilon, optimal order's index) of each setting from `rdp_curves`."""
  rdp, deltas = _curves(noise_multipliers, settings, orders)
  return rdp_curves.epsilons(orders, rdp, deltas)


def _best_epsilons(noise_multipliers, settings) -> tuple:
  """(epsilon, optimal order) of each setting from `rdp_curves`: the integer orders,
  and the fractional ones below 2 only where 2 is the best integer one (they matter
  for large epsilons only, and cost most)."""
  z = np.asarray(noise_multipliers, np.float64)
  eps, best = _fast_epsilons(z, settings, _INTEGER_ORDERS)
  orders = [_INTEGER_ORDERS[b] for b in best]
  low = [i for i, o in enumerate(orders) if o == _SMALLEST_INTEGER_ORDER]
  if low:
    eps[low], best = _fast_epsilons(z[low], [settings[i] for i in low], RDP_ORDERS)
    for i, b in zip(low, best):
      orders[i] = RDP_ORDERS[b]
  return eps, orders


def _search_noise_multipliers(targets, settings) -> np.ndarray:
  """Bisection (in log z, all settings at once, on `rdp_curves`' integer orders,
  then on all orders where the fractional ones allow less noise) to a relative
  CALIBRATION_RELATIVE_TOLERANCE / 4, keeping the upper end; rounded up to a
  float32 and moved up until dp_accounting's own accountant, at the setting's
  optimal order, confirms the target."""
  if not settings:
    return np.zeros(0)
  targets = np.asarray(targets, np.float64)
  z = _bisect(targets, settings, _INTEGER_ORDERS, 1e-6, _MAX_NOISE_MULTIPLIER)
  # Loose where the fractional orders (large epsilons) allow less noise.
  eps, _ = _best_epsilons(z * (1 - CALIBRATION_RELATIVE_TOLERANCE), settings)
  loose = np.flatnonzero(eps <= targets)
  if len(loose):
    z[loose] = _bisect(targets[loose], [settings[i] for i in loose], RDP_ORDERS,
                       1e-6, z[loose])
  rtol = CALIBRATION_RELATIVE_TOLERANCE / 4
  z = np.array([float32_at_least(v) for v in z])
  for i, order in enumerate(_best_epsilons(z, settings)[1]):
    while _epsilon(float(z[i]), *settings[i], orders=(order,)) > targets[i]:
      z[i] = float32_at_least(z[i] * (1 + rtol))   # a rounding difference: rare
  return z


def _bisect(targets, settings, orders, lo, hi) -> np.ndarray:
  """The upper ends of brackets [lo, hi] of each setting's noise multiplier, hi
  meeting the target on `orders` (checked) and lo not (else lo is returned)."""
  lo = np.broadcast_to(np.asarray(lo, np.float64), targets.shape).copy()
  hi = np.broadcast_to(np.asarray(hi, np.float64), targets.shape).copy()
  over, _ = _fast_epsilons(hi, settings, orders)
  if (over > targets).any():
    raise ValueError(f"no noise multiplier up to {hi.max():g} meets target_epsilon="
                     f"{targets[over > targets][0]}")
  meets_lo, _ = _fast_epsilons(lo, settings, orders)
  hi = np.where(meets_lo <= targets, lo, hi)
  rtol = CALIBRATION_RELATIVE_TOLERANCE / 4
  while True:
    open_ = np.flatnonzero(hi > lo * (1 + rtol))
    if not len(open_):
      return hi
    mid = np.sqrt(lo[open_] * hi[open_])
    eps, _ = _fast_epsilons(mid, [settings[i] for i in open_], orders)
    meets = eps <= targets[open_]
    hi[open_] = np.where(meets, mid, hi[open_])
    lo[open_] = np.where(meets, lo[open_], mid)


@functools.lru_cache(maxsize=4096)
def _calibrate(target_epsilon, *args) -> float:
  """A node-level setting's multiplier: Brent's method on dp_accounting's epsilon,
  moved up until the target is met, rounded up to a float32."""
  def gap(z):
    return math.log(_epsilon(z, *args)) - math.log(target_epsilon)
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
  while gap(z) > 0:
    z *= 1.0 + rtol
  return float32_at_least(z)   # rounded up: more noise, less epsilon

