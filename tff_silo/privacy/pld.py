"""Privacy loss distributions for DP-SGD releases (`dp_accounting.pld`), beside RDP.

For Poisson-subsampled Gaussian steps (add/remove one example) and plain Gaussian
mechanisms (DP standardization), the PLD accountant of dp_accounting (Koskela et
al.; Doroshenko et al. 2022, "Connect the dots", pessimistic discretization) gives a
tighter epsilon than converting RDP: a few percent less noise for the same (epsilon,
delta). It cannot express the other events this library charges: exponential-mechanism
selections (`SelectionDpEvent`, a Gaussian only in RDP), sampling without
replacement, node-level steps. A protocol with `accountant="pld"` therefore uses PLD
where every event of a silo is expressible and RDP elsewhere; both bound the same
epsilon from above, so a ledger reports the smaller (`accounting`, `ledger`).

An event is flattened into its primitive mechanisms with counts (`primitives`): PLD
epsilon grows with every count, so a run that charges a prefix of what a
calibration proved within budget stays within it (`known_bound`), without a PLD
composition every round.
"""

from __future__ import annotations

import collections
import functools
import math
from typing import Optional

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

ACCOUNTANTS = ("rdp", "pld")
# The loss grid of the PLDs (dp_accounting's pessimistic discretization: a coarser
# grid only raises epsilon): 1e-3 costs ~0.2-0.6 s a silo setting and moves epsilon
# by ~1e-3 relative against 1e-4 (5x slower; benchmarks/RESULTS.md, issue 53).
VALUE_DISCRETIZATION = 1e-3


def check_accountant(name: str) -> str:
  if name not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {name!r}")
  return name


def _expressible(event) -> bool:
  if type(event) is dp_accounting.GaussianDpEvent:   # not a SelectionDpEvent
    return True
  return (type(event) is dp_accounting.PoissonSampledDpEvent
          and type(event.event) is dp_accounting.GaussianDpEvent)


def primitives(event, count: int = 1, into: Optional[collections.Counter] = None
               ) -> Optional[collections.Counter]:
  """`count` runs of `event` as a Counter of primitive mechanisms (Gaussian and
  Poisson-subsampled Gaussian events) to their counts; None when PLD cannot express
  one of them."""
  into = collections.Counter() if into is None else into
  if isinstance(event, dp_accounting.ComposedDpEvent):
    for part in event.events:
      if primitives(part, count, into) is None:
        return None
    return into
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return primitives(event.event, count * event.count, into)
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return into
  if not _expressible(event):
    return None
  if count:
    into[event] += count
  return into


def _key(counts: collections.Counter) -> tuple:
  return tuple(sorted(((e, c) for e, c in counts.items() if c), key=repr))


@functools.lru_cache(maxsize=4096)
def _epsilon(key: tuple, delta: float) -> float:
  """One PLD composition, remembered once in `_PROVEN` (a cached repeat adds
  nothing)."""
  accountant = pld_privacy_accountant.PLDAccountant(
      value_discretization_interval=VALUE_DISCRETIZATION)
  for event, count in key:
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, count))
  eps = float(accountant.get_epsilon(delta))
  _PROVEN.append((dict(key), delta, eps))
  del _PROVEN[:-256]
  return eps


def epsilon(counts: collections.Counter, delta: float) -> float:
  """PLD epsilon at `delta` of the primitives `counts` (add/remove one example);
  inf for delta <= 0, 0 for nothing charged."""
  if not delta > 0:
    return math.inf
  key = _key(counts)
  if not key:
    return 0.0
  return _epsilon(key, float(delta))


# (counts, delta, epsilon) of recent PLD compositions: any prefix of one, at a delta
# at least its, spends at most its epsilon.
_PROVEN: list = []


def known_bound(counts: collections.Counter, delta: float) -> float:
  """The smallest epsilon proven (`epsilon`) for counts that include `counts` at a
  delta at most `delta` (PLD epsilon only grows with a count and falls with delta);
  inf when none does."""
  best = math.inf
  for proven, proven_delta, eps in _PROVEN:
    if proven_delta <= delta and all(proven.get(e, 0) >= c for e, c in counts.items()
                                     if c):
      best = min(best, eps)
  return best
