"""One privacy ledger per protected unit (a silo, a user, a node).

Every query of a unit's private data is charged to its ledger as a `dp_accounting`
`DpEvent` (DP-SGD steps, node-level DP-SGD steps (`node_level`), cluster selections,
standardization statistics, a private metric) or, for d-privacy, as an explicit leakage (Galli et al., Theorem 1: leakages
add up). The ledger composes the events with the RDP accountant under its
neighbouring relation, reports epsilon at its delta at any time, and answers whether
a further charge would exceed its budget. Run drivers take their `epsilon_spent`
columns from the ledgers and nowhere else.

Composition is exact RDP addition: the RDP curve of each distinct event is computed
once (`rdp_curves`, dp_accounting's formulas vectorized; cached) and added `count`
times, which gives the same curve as one `RdpAccountant` composing every event of
the run (tests/privacy/test_ledger.py). The Gaussian sampler's tails of
the charged events (`accounting.sampler_tail`) add up too, and epsilon is reported
at delta less their sum. A ledger with `accountant="pld"` also counts its events'
primitive mechanisms (`pld.primitives`) and reports the smaller of the RDP and the
PLD epsilon while PLD expresses everything charged; its budget checks compose a PLD
only when RDP alone would refuse, and not at all for a prefix of a run its
calibration proved (`pld.known_bound`).
"""

from __future__ import annotations

import collections
import functools
import math
from typing import Optional

import dp_accounting
import numpy as np

from tff_silo.privacy import accounting, node_level, pld, rdp_curves


@functools.lru_cache(maxsize=4096)
def _rdp_curve(event: dp_accounting.DpEvent, neighbouring: str) -> np.ndarray:
  relation = accounting.neighbouring_relation(neighbouring)
  try:
    return rdp_curves.event_curve(event, lambda: node_level.NodeLevelRdpAccountant(
        list(accounting.RDP_ORDERS), relation))   # node events too
  except ValueError as e:
    raise ValueError(f"{event} cannot be accounted under the {neighbouring} "
                     "neighbouring relation") from e


@functools.lru_cache(maxsize=4096)
def _tail(event: dp_accounting.DpEvent, neighbouring: str) -> float:
  return accounting.sampler_tail(event, neighbouring)


def _epsilons(curves, target_deltas, tails) -> np.ndarray:
  """Epsilon of each RDP curve (a row) at its delta less the sampler's tail
  (dp_accounting's conversion, vectorized: `rdp_curves.epsilons`); 0 for a zero
  curve."""
  curves = np.asarray(curves, np.float64).reshape(-1, len(accounting.RDP_ORDERS))
  deltas = [accounting.delta_after_tail(d or 0.0, t)   # None: d-privacy only, no curve
            for d, t in zip(target_deltas, tails)]
  eps, _ = rdp_curves.epsilons(accounting.RDP_ORDERS, curves, deltas)
  return np.where(curves.any(axis=1), eps, 0.0)


class PrivacyLedger:
  """The privacy account of one protected unit.

  Args:
    target_delta: the delta epsilon is reported at; None for a ledger of d-privacy
      leakage only.
    neighbouring: `add_remove` or `replace_one` (see `accounting.NEIGHBOURING`).
    budget: epsilon at `target_delta` the unit allows (None: no limit).
    accountant: `rdp`, or `pld` (add_remove only; module docstring).
  """

  def __init__(self, target_delta: float, *, neighbouring: str = "add_remove",
               budget: Optional[float] = None, accountant: str = "rdp"):
    accounting.check_neighbouring(neighbouring)
    if pld.check_accountant(accountant) == "pld" and neighbouring != "add_remove":
      raise ValueError("a pld ledger accounts add_remove only")
    if target_delta is not None and not 0.0 < target_delta < 1.0:
      raise ValueError(f"target_delta must be in (0, 1), got {target_delta}")
    if budget is not None and not budget > 0:
      raise ValueError(f"budget must be a positive epsilon or None, got {budget}")
    self.target_delta = None if target_delta is None else float(target_delta)
    self.neighbouring = neighbouring
    self.budget = budget
    self._rdp = np.zeros(len(accounting.RDP_ORDERS))
    self.sampler_tail = 0.0   # the Gaussian sampler's tails of every charge
    self.leakage = 0.0
    self.charges = collections.Counter()   # label -> number of charges
    self.accountant = accountant
    # pld: the primitive mechanisms charged (None once one is not expressible)
    self._primitives = collections.Counter() if accountant == "pld" else None

  def _curve(self, event, count):
    """(RDP curve, sampler tail) of `count` runs of `event`."""
    if isinstance(event, dp_accounting.ComposedDpEvent):   # lists are not hashable
      parts = [self._curve(e, count) for e in event.events]
      return (sum((c for c, _ in parts), np.zeros(len(accounting.RDP_ORDERS))),
              sum(t for _, t in parts))
    return (count * _rdp_curve(event, self.neighbouring),
            count * _tail(event, self.neighbouring))

  def charge(self, event: dp_accounting.DpEvent, label: str, count: int = 1) -> None:
    """Composes `count` runs of `event` (a query labelled `label`)."""
    if int(count) != count or count < 0:
      raise ValueError(f"count must be a non-negative integer, got {count}")
    if count:
      self._add(self._curve(event, count), label, event, int(count))

  def _add(self, cost, label, event, count=1):
    curve, tail = cost
    self._rdp = self._rdp + curve
    self.sampler_tail += tail
    self.charges[label] += count
    if self._primitives is not None:
      self._primitives = pld.primitives(event, count, self._primitives)

  def _pld_epsilon(self, event=None, within=None) -> float:
    """The PLD epsilon of everything charged (and `event`, once), inf where PLD
    does not express it; with `within` (a budget), a bound already proven when it
    is within that (no new composition)."""
    if self._primitives is None or self.target_delta is None:
      return math.inf
    counts, tail = collections.Counter(self._primitives), self.sampler_tail
    if event is not None:
      if pld.primitives(event, 1, counts) is None:
        return math.inf
      tail += accounting.sampler_tail(event, self.neighbouring)
    delta = accounting.delta_after_tail(self.target_delta, tail)
    known = pld.known_bound(counts, delta)
    if within is not None and known <= within:
      return known
    return min(known, pld.epsilon(counts, delta))

  def charge_leakage(self, amount: float, label: str) -> None:
    """Adds a d-privacy leakage (epsilon times distance; not an (epsilon, delta))."""
    if not amount >= 0:
      raise ValueError(f"leakage must be >= 0, got {amount}")
    self.leakage += float(amount)
    self.charges[label] += 1

  def _checked_delta(self) -> Optional[float]:
    if self.target_delta is None and np.any(self._rdp):
      raise ValueError("this ledger has no target_delta: it accounts d-privacy leakage")
    return self.target_delta

  def epsilon(self) -> float:
    """Epsilon at `target_delta` of everything charged so far (the sampler's tail
    taken from delta)."""
    return float(epsilons([self])[0])

  def would_exceed(self, event: dp_accounting.DpEvent, count: int = 1) -> bool:
    """Whether charging `event` `count` times would take epsilon above the budget."""
    if self.budget is None or not self._exceeds_with(self._curve(event, count)):
      return False
    return self.accountant != "pld" or self._pld_epsilon(
        dp_accounting.SelfComposedDpEvent(event, int(count)), self.budget) > self.budget

  def _exceeds_with(self, cost) -> bool:
    curve, tail = cost
    return self.budget is not None and _epsilons(
        self._rdp + curve, [self._checked_delta()],
        [self.sampler_tail + tail])[0] > self.budget


def epsilons(ledgers) -> np.ndarray:
  """Each ledger's epsilon (an array; one vectorized conversion for all; a pld
  ledger's the smaller of that and its PLD epsilon)."""
  if not ledgers:
    return np.zeros(0)
  out = _epsilons([ledger._rdp for ledger in ledgers],   # pylint: disable=protected-access
                  [ledger._checked_delta() for ledger in ledgers],   # pylint: disable=protected-access
                  [ledger.sampler_tail for ledger in ledgers])
  for i, ledger in enumerate(ledgers):
    if ledger.accountant == "pld" and out[i] > 0:
      out[i] = min(out[i], ledger._pld_epsilon())   # pylint: disable=protected-access
  return out


def leakages(ledgers) -> np.ndarray:
  """Each ledger's composed d-privacy leakage (an array)."""
  return np.array([ledger.leakage for ledger in ledgers])


def _curves(ledgers, events) -> list:
  """Each event's (RDP curve, sampler tail) under its ledger's relation, computed
  once per distinct event object (units with the same settings share one)."""
  cache, curves = {}, []
  for ledger, event in zip(ledgers, events):
    key = (id(event), ledger.neighbouring)
    if event is not None and key not in cache:
      cache[key] = ledger._curve(event, 1)   # pylint: disable=protected-access
    curves.append(None if event is None else cache[key])
  return curves


def over_budget(ledgers, events) -> list:
  """Indices of the units whose next `events` (one per ledger, or None) would
  exceed their budget; units with the same account, event and budget are checked
  once (in a round of 139 silos with equal settings, once instead of 139 times)."""
  candidates, owners = {}, []
  for i, (ledger, curve) in enumerate(zip(ledgers, _curves(ledgers, events))):
    if curve is None or ledger.budget is None:
      continue
    key = (ledger._rdp.tobytes(), ledger.sampler_tail, id(curve), ledger.budget,  # pylint: disable=protected-access
           ledger.target_delta)
    if key not in candidates:
      candidates[key] = (ledger._rdp + curve[0], ledger._checked_delta(),  # pylint: disable=protected-access
                         ledger.sampler_tail + curve[1], ledger.budget)
    owners.append((i, key))
  if not owners:
    return []
  curves, deltas, tails, budgets = zip(*candidates.values())
  exceeds = dict(zip(candidates, _epsilons(curves, deltas, tails) > np.array(budgets)))
  refused = [i for i, key in owners if exceeds[key]]
  # a pld ledger refuses only if its PLD epsilon exceeds the budget as well
  return [i for i in refused if ledgers[i].accountant != "pld"
          or ledgers[i]._pld_epsilon(events[i], ledgers[i].budget)   # pylint: disable=protected-access
          > ledgers[i].budget]


def charge_all(ledgers, events, label: str) -> None:
  """Charges each ledger its event (None: nothing), sharing equal events' curves."""
  for ledger, event, curve in zip(ledgers, events, _curves(ledgers, events)):
    if curve is not None:
      ledger._add(curve, label, event)   # pylint: disable=protected-access
