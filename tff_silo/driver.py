"""The one round loop every driver runs, who takes part in a round, and the result
fields every run has.

`run_rounds` runs T rounds of a runner's `step`: before each round `before(r)` (the
privacy charge, which may refuse the round: the run stops), after it `after(r)`
(charges, validation; may stop the run with a reason), evaluation every
`eval_every` rounds, progress and timing (the step alone). The drivers around it
set a family up and build its result: `tff_silo.simulation` (the MR-MTL family,
Mocha, IFCA: every silo every round), `tff_silo.dprivate_simulation` (d-private
clustering: U users a round with a leakage cap) and `hypernet.simulation` (UDP-Alg:
Poisson-sampled users). Their results extend `RunResult`.

Who takes part: every silo in every round in `tff_silo.simulation` (cross-silo FL,
thesis sec. 1.3); the user-sampling drivers ask a policy (`sample(round_num)`: the
users of round `round_num`):
- `UniformUsers`: U users uniformly without replacement; with a leakage cap a user
  whose composed leakage would pass it declines (Galli et al., Algorithm 1);
- `PoissonUsers`: each user independently with probability q, as the sampled
  Gaussian mechanism's accounting assumes (Nemala et al.).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_silo import keys, runtime
from tff_silo.algorithms import poisson_sampling
from tff_silo.privacy.ledger import PrivacyLedger, leakages

# Leakages are sums of floats: a cap met to this slack is met.
LEAKAGE_SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What every run produced; a family's result adds its own fields. Metrics are
  the model's (`mse`: lower is better; `accuracy`: a fraction in [0, 1])."""

  algorithm: str
  rounds: int                   # rounds run
  metric: str
  train_metric: float           # pooled over every silo's (user's) examples
  test_metric: float
  silo_train_metric: np.ndarray
  silo_test_metric: np.ndarray
  history: tuple                # ((rounds_done, train_metric, test_metric), ...)
  round_seconds: np.ndarray     # each round's step
  wall_seconds: float
  silo_weights: tuple           # each silo's (user's) model at the end, as evaluated


def check_run_length(rounds, eval_every: int = 0) -> None:
  """T a positive integer, `eval_every` >= 0."""
  if int(rounds) != rounds or rounds < 1:
    raise ValueError(f"rounds must be a positive integer, got {rounds}")
  if eval_every < 0:
    raise ValueError(f"eval_every must be >= 0, got {eval_every}")


@dataclasses.dataclass(frozen=True)
class RoundLog:
  """What `run_rounds` did: rounds run, each one's step time, why it stopped
  (`rounds`: all T; `budget`: `before` refused; or `after`'s reason)."""
  rounds_run: int
  round_seconds: np.ndarray
  stopped_because: str


def run_rounds(rounds: int, step: Callable[[int], None], *,
               before: Optional[Callable[[int], bool]] = None,
               after: Optional[Callable[[int], Optional[str]]] = None,
               evaluate: Optional[Callable[[int], None]] = None, eval_every: int = 0,
               progress: Optional[Callable[[int, int, float], None]] = None,
               start: Optional[float] = None) -> RoundLog:
  """Rounds 1..T: `before(r)` (False: stop, `budget`), `step(r)` (timed),
  `after(r)` (a reason: stop after this round), `evaluate(r)` every `eval_every`
  rounds but the last (the driver evaluates the end), `progress(r, T, seconds since
  `start`)`."""
  check_run_length(rounds, eval_every)
  start = time.perf_counter() if start is None else start
  seconds, stopped = [], "rounds"
  for r in range(1, rounds + 1):
    if before is not None and not before(r):
      stopped = "budget"
      break
    t0 = time.perf_counter()
    step(r)
    seconds.append(time.perf_counter() - t0)
    reason = None if after is None else after(r)
    if evaluate is not None and eval_every and r % eval_every == 0 and r != rounds:
      evaluate(r)
    if progress is not None:
      progress(r, rounds, time.perf_counter() - start)
    if reason is not None:
      stopped = reason
      break
  return RoundLog(len(seconds), np.array(seconds), stopped)


@contextlib.contextmanager
def tff_workers_stopped():
  """Stops TFF's worker process when the block ends, however it ends (its pipes
  would otherwise stay open: `tff_silo.runtime`)."""
  try:
    yield
  finally:
    runtime.stop_tff_workers()


class UniformUsers:
  """U of N users a round, uniformly without replacement (numpy's generator seeded
  [seed, 2]); with `leakage_cap`, a user whose leakage plus one participation's
  would pass the cap declines. `charge(sampled)` after the round books their
  participation (leakage `per_participation` each: Galli et al. Theorem 1)."""

  def __init__(self, num_users: int, per_round: int, seed: int, *,
               per_participation: float = 0.0, leakage_cap: Optional[float] = None):
    self.num_users, self.per_round = num_users, per_round
    self.per_participation, self.leakage_cap = per_participation, leakage_cap
    self._rng = np.random.default_rng([seed, 2])
    self.ledgers = [PrivacyLedger(None) for _ in range(num_users)]   # leakage only
    self.participations = np.zeros(num_users, np.int64)
    self.declined = 0

  def leakage(self) -> np.ndarray:
    return leakages(self.ledgers)

  def sample(self, round_num: int) -> np.ndarray:
    del round_num
    sampled = self._rng.choice(self.num_users, self.per_round, replace=False)
    if self.leakage_cap is None:
      return sampled
    fits = self._fits(self.leakage()[sampled])
    self.declined += int(np.sum(~fits))
    return sampled[fits]

  def charge(self, sampled) -> None:
    for k in sampled:
      self.ledgers[k].charge_leakage(self.per_participation, "d_privacy")
    self.participations[sampled] += 1

  def exhausted(self) -> bool:
    """Whether every user would decline from now on."""
    return self.leakage_cap is not None and not np.any(self._fits(self.leakage()))

  def _fits(self, leakage) -> np.ndarray:
    return leakage + self.per_participation <= self.leakage_cap + LEAKAGE_SLACK


class PoissonUsers:
  """Each of N users independently with probability floor(q 2^32) / 2^32 <= q a
  round (a user kept when its 32-bit word is below that threshold,
  `poisson_sampling.rate_threshold`), the words stateless TF draws keyed
  derive(root, USER_SAMPLING, round - 1) (`tff_silo.keys`)."""

  def __init__(self, num_users: int, rate: float, seed: int):
    self.num_users, self.rate, self.seed = num_users, rate, seed
    self._below = poisson_sampling.rate_threshold(rate)

  def sample(self, round_num: int) -> np.ndarray:
    key = keys.derive(keys.root_key(self.seed), keys.USER_SAMPLING, round_num - 1)
    words = tf.random.stateless_uniform([self.num_users], seed=key, minval=None,
                                        maxval=None, dtype=tf.uint32)
    return np.flatnonzero(poisson_sampling.kept(words, self._below).numpy())
