"""A run's silo-specific example-level DP bookkeeping, outside the driver's loop
(thesis Def. 1.3.1): the calibration of every silo's DP-SGD noise to its own
(epsilon_k, delta_k) under a `PrivacyProtocol`, one `PrivacyLedger` per silo (silos
with equal settings share one), and each round's charges. The driver
(`tff_silo.simulation`) opens one `SiloAccounts` per run, asks it for what the silos
train with (noise multiplier, public size, selection epsilon), calls
`charge_round` before every round and `privacy()` at the end; the ledgers are the
only source of the epsilon a run reports.

Steps and sampling rates come from the arithmetic the training runs
(`tff_silo.privacy.batching`).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import os
from typing import Optional, Sequence

import dp_accounting
import numpy as np

from tff_silo.privacy import accounting, batching, integer_law, ledger as ledger_lib
from tff_silo.privacy.protocol import PrivacyProtocol


def _events_of(event) -> tuple:
  """A silo's preprocessing event (None, an event, or a composition of events) as
  the tuple of events its ledger charges."""
  if event is None:
    return ()
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return tuple(event.events)
  return (event,)


@dataclasses.dataclass(frozen=True)
class SiloPrivacy:
  """Per-silo DP-SGD and selection settings and the privacy they spend, composed
  (arrays over silos). After a run `epsilon_spent` is the ledgers' figure."""

  noise_multipliers: np.ndarray
  sampling_rates: np.ndarray
  steps: np.ndarray               # DP-SGD steps of the whole run
  target_delta: np.ndarray
  epsilon_spent: np.ndarray
  selection_epsilon: np.ndarray   # per selection (0: no private selection)
  num_selections: int
  sizes: np.ndarray = None        # the public size each silo samples with
  protocol: PrivacyProtocol = PrivacyProtocol()
  sampling: str = "poisson"
  preprocessing: tuple = ()       # per silo: the DpEvents spent before training
  stopped_because: str = "rounds"
  integer_coordinates: int = 0    # integer noise: coordinates a step releases

  @property
  def bounded(self) -> bool:
    """Whether `epsilon_spent` is a DP bound (not for shuffled batches)."""
    return self.sampling != "shuffle"

  def silo_event(self, silo: int) -> dp_accounting.DpEvent:
    """Everything silo `silo`'s data is queried for over the whole run: its
    preprocessing, every DP-SGD step and every private selection."""
    return accounting.silo_event(
        float(self.noise_multipliers[silo]), float(self.sampling_rates[silo]),
        int(self.steps[silo]), selection_epsilon=float(self.selection_epsilon[silo]),
        num_selections=self.num_selections if self.selection_epsilon[silo] else 0,
        neighbouring=self.protocol.neighbouring, dataset_size=int(self.sizes[silo]),
        extra_events=self.preprocessing[silo] if self.preprocessing else (),
        node_examples=self.protocol.node_examples,
        integer_coordinates=self.integer_coordinates)

  def round_event(self, silo: int, epochs_steps: int, selecting: bool):
    """The queries silo `silo` makes in one round: `epochs_steps` DP-SGD steps and a
    selection when `selecting` (one object for silos with equal settings)."""
    return _round_event(
        float(self.noise_multipliers[silo]), float(self.sampling_rates[silo]),
        int(epochs_steps), self.protocol.neighbouring, int(self.sizes[silo]),
        float(self.selection_epsilon[silo]) if selecting else None,
        self.protocol.node_examples, self.integer_coordinates)

  def process_noise_multipliers(self) -> np.ndarray:
    """The multiplier each silo's noise is drawn with: its accounted one, or under
    integer noise the grid's, whose effective multiplier is at least that
    (`integer_law.grid_noise_multiplier`)."""
    if not self.integer_coordinates:
      return self.noise_multipliers
    return np.array([integer_law.grid_noise_multiplier(float(z), self.integer_coordinates)
                     if z > 0 else 0.0 for z in self.noise_multipliers])


@functools.lru_cache(maxsize=4096)
def _round_event(noise_multiplier, rate, steps, neighbouring, size, selection_epsilon,
                 node_examples=None, integer_coordinates=0):
  events = [accounting.dp_sgd_event(noise_multiplier, rate, steps,
                                    neighbouring=neighbouring, dataset_size=size,
                                    node_examples=node_examples,
                                    integer_coordinates=integer_coordinates)]
  if selection_epsilon is not None:
    events.append(accounting.selection_event(selection_epsilon, 1))
  return dp_accounting.ComposedDpEvent(events)


def per_silo(value, num_silos: int, name: str) -> np.ndarray:
  arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (num_silos,)) if np.ndim(
      value) == 0 else np.asarray(value, dtype=np.float64)
  if arr.shape != (num_silos,):
    raise ValueError(f"{name} must be a scalar or one value per silo ({num_silos}), "
                     f"got shape {arr.shape}")
  return arr


def calibrate_silos(train_sizes: Sequence[int], *, batch_size: int, epochs_per_round: int,
                    rounds: int, target_epsilon, target_delta,
                    num_selections: int = 0, selection_budget_share: float = 0.0,
                    protocol: Optional[PrivacyProtocol] = None,
                    sampling: str = "poisson",
                    preprocessing_events: Optional[Sequence] = None,
                    noise_multiplier=None, integer_coordinates: int = 0) -> SiloPrivacy:
  """Silo k's noise multiplier for its own (epsilon_k, delta_k), its sampling rate
  min(B, m_k) / m_k and T * epochs * max(1, floor(m_k / min(B, m_k))) steps, where
  m_k is the size the protocol makes public (n_k, or the assumed size for every silo)
  under Poisson sampling and n_k for the other samplings (`batching`: what the
  training takes); epsilon spent is recomputed from it.

  With `num_selections` private cluster selections of epsilon
  share * epsilon_k each, and `preprocessing_events` (per silo None, a Gaussian
  `DpEvent`, or one composed with its `IntegerNoiseTail`, e.g. DP standardization),
  DP-SGD gets what they leave (RDP composition).
  `noise_multiplier` (a scalar or one per silo) instead of `target_epsilon`: the
  silos train with that noise and spend what it costs (inf, if no epsilon bounds
  it); no selections then. `integer_coordinates` d > 0: the steps release d
  coordinates of integer noise (`integer_gaussian`), whose multipliers here are the
  effective ones (`SiloPrivacy.process_noise_multipliers` draws them)."""
  protocol = PrivacyProtocol() if protocol is None else protocol
  protocol.check_sampling(sampling)
  sizes = protocol.silo_sizes(train_sizes)
  k = len(train_sizes)
  if (target_epsilon is None) == (noise_multiplier is None):
    raise ValueError("give one of target_epsilon and noise_multiplier")
  if noise_multiplier is not None and num_selections:
    raise ValueError("a run with given noise has no budget to share with selections")
  given = None if noise_multiplier is None else per_silo(noise_multiplier, k,
                                                          "noise_multiplier")
  if given is not None and not (given > 0).all():
    raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
  eps = per_silo(np.inf if target_epsilon is None else target_epsilon, k,
                  "target_epsilon")
  delta = per_silo(target_delta, k, "target_delta")
  select = eps * selection_budget_share if num_selections else np.zeros(k)
  followed, batch, per_epoch = batching.batch_plan(
      np, sampling, batch_size, np.asarray(train_sizes, np.int64), sizes)
  rates = batch / followed
  steps = per_epoch * epochs_per_round * rounds
  extra = ([()] * k if preprocessing_events is None
           else [_events_of(e) for e in preprocessing_events])
  if len(extra) != k:
    raise ValueError(f"preprocessing_events must have one entry per silo ({k})")
  settings = [accounting.silo_setting(
      q, int(n_steps), d, float(s) if num_selections else None, num_selections,
      protocol.neighbouring, int(n), e, protocol.node_examples, integer_coordinates)
      for q, n_steps, d, s, n, e in zip(rates, steps, delta, select, sizes, extra)]
  if given is not None:
    z, spent = given, accounting.epsilons_spent(given, settings, protocol.accountant)
  else:
    z, spent = accounting.calibrate_noise_multipliers(eps, settings, protocol.accountant)
  return SiloPrivacy(z, rates, steps, delta, spent, select, num_selections, sizes,
                     protocol, sampling, tuple(extra),
                     integer_coordinates=int(integer_coordinates))


class SiloAccounts:
  """One run's DP bookkeeping: its calibration (`privacy`, None without DP), each
  silo's ledger, the per-silo steps of a round, and the distinct ledgers with a silo
  of each.

  Silos with the same settings (noise, sampling rate, steps, public size, selection
  epsilon, preprocessing, delta and budget) are charged the same events every round,
  so they share one ledger object: a round's accounting costs per distinct account,
  not per silo (139 School silos of one assumed size: one)."""

  def __init__(self, train_sizes: Sequence[int], *, private: bool, batch_size: int,
               epochs_per_round: int, rounds: int, num_selections: int = 0,
               selection_budget_share: float = 0.0, sampling: str = "poisson",
               target_epsilon=None, target_delta=None, noise_multiplier=None,
               protocol: Optional[PrivacyProtocol] = None,
               preprocessing_events: Optional[Sequence] = None,
               ledger_csv: Optional[str] = None, integer_coordinates: int = 0):
    """Checks the DP arguments against `private` (whether the run clips: DP-SGD),
    calibrates every silo (`calibrate_silos`) and opens their ledgers, charging
    each its preprocessing first."""
    given = noise_multiplier is not None
    if private and ((target_epsilon is None) == (not given) or target_delta is None):
      raise ValueError("the process trains with DP (l2_norm_clip is set): give "
                       "target_delta and one of target_epsilon and noise_multiplier")
    if not private and preprocessing_events is not None:
      raise ValueError("preprocessing_events are accounted only under DP")
    if not private and (target_epsilon is not None or given):
      raise ValueError("target_epsilon or noise_multiplier was given but the process "
                       "has no l2_norm_clip; build it with l2_norm_clip to train with DP")
    num_silos = len(train_sizes)
    self._rounds, self._num_selections = rounds, num_selections
    self.ledger_csv = ledger_csv
    self.stopped_because, self.rounds_done = "rounds", 0
    self.privacy, self.ledgers, self.units = None, [], []
    self.noise_multipliers = self.selection_epsilons = np.zeros(num_silos)
    self.process_noise_multipliers = self.noise_multipliers
    self.sizes = np.asarray(train_sizes)
    if not private:
      return
    privacy = calibrate_silos(
        train_sizes, batch_size=batch_size, epochs_per_round=epochs_per_round,
        rounds=rounds, target_epsilon=target_epsilon, target_delta=target_delta,
        num_selections=num_selections, selection_budget_share=selection_budget_share,
        protocol=protocol, sampling=sampling, preprocessing_events=preprocessing_events,
        noise_multiplier=noise_multiplier, integer_coordinates=integer_coordinates)
    self.privacy = privacy
    self.noise_multipliers, self.selection_epsilons, self.sizes = (
        privacy.noise_multipliers, privacy.selection_epsilon, privacy.sizes)
    self.process_noise_multipliers = privacy.process_noise_multipliers()
    self._round_steps = privacy.steps // rounds
    budgets = (per_silo(target_epsilon, num_silos, "target_epsilon")
               if not given else [None] * num_silos)
    distinct = {}
    for k in range(num_silos):
      settings = (privacy.target_delta[k], budgets[k], privacy.noise_multipliers[k],
                  privacy.sampling_rates[k], privacy.steps[k], privacy.sizes[k],
                  privacy.selection_epsilon[k], repr(privacy.preprocessing[k]))
      if settings not in distinct:
        ledger = ledger_lib.PrivacyLedger(
            float(privacy.target_delta[k]), neighbouring=privacy.protocol.neighbouring,
            budget=None if budgets[k] is None else float(budgets[k]),
            accountant=privacy.protocol.accountant)
        for event in privacy.preprocessing[k]:
          ledger.charge(event, "preprocessing")
        distinct[settings] = (ledger, k)
      self.ledgers.append(distinct[settings][0])
    self.units = list(distinct.values())

  def round_charges(self, round_num: int) -> list:
    """(ledger, event) of every distinct ledger for round `round_num`'s queries."""
    if self.privacy is None:
      return []
    selecting = round_num <= self._num_selections
    return [(ledger, self.privacy.round_event(k, int(self._round_steps[k]), selecting))
            for ledger, k in self.units]

  def finish_round(self, rounds_done: int) -> None:
    """Notes a round run (and appends every silo's epsilon to `ledger_csv`)."""
    self.rounds_done = rounds_done
    if self.ledger_csv is not None and self.privacy is not None:
      _write_ledger_rows(self.ledger_csv, rounds_done, self.ledgers)

  def final_privacy(self) -> Optional[SiloPrivacy]:
    """The calibration with the ledgers' epsilon spent and why the run stopped."""
    if self.privacy is None:
      return None
    return dataclasses.replace(self.privacy,
                               epsilon_spent=ledger_lib.epsilons(self.ledgers),
                               stopped_because=self.stopped_because)


def charge_round(accounts: Sequence[SiloAccounts], active: list, round_num: int) -> None:
  """Charges round `round_num`'s queries to the ledgers of every active private run
  (one batched check and charge for all of them); a run that would exceed a silo's
  budget stops instead (`active[i]` set False, `stopped_because` "budget")."""
  ledgers, events, owner = [], [], []
  for i, account in enumerate(accounts):
    if active[i]:
      for ledger, event in account.round_charges(round_num):
        ledgers.append(ledger)
        events.append(event)
        owner.append(i)
  for i in {owner[j] for j in ledger_lib.over_budget(ledgers, events)}:
    active[i], accounts[i].stopped_because = False, "budget"
  keep = [j for j, i in enumerate(owner) if active[i]]
  ledger_lib.charge_all([ledgers[j] for j in keep], [events[j] for j in keep],
                        "training_round")


def _write_ledger_rows(path, rounds_done, ledgers):
  """Appends each silo's epsilon after `rounds_done` rounds to a CSV."""
  new = not os.path.exists(path)
  with open(path, "a", newline="") as f:
    writer = csv.writer(f)
    if new:
      writer.writerow(["round", "silo", "epsilon", "target_delta"])
    for k, (ledger, epsilon) in enumerate(zip(ledgers, ledger_lib.epsilons(ledgers))):
      writer.writerow([rounds_done, k, epsilon, ledger.target_delta])
