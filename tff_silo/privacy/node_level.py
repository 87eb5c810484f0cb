"""Node-level DP of DP-SGD on neighbourhood examples (thesis ch. 2, Theorem 2.4.4,
after Daigavane et al. 2021).

A silo's graph has n nodes, one example per node (its neighbourhood); every node lies
in at most S neighbourhoods (its own and S - 1 others': the degree cap). A step
draws a batch of b examples uniformly without replacement, so rho, the number of
batch examples that contain a given node, is Hypergeometric(n, S, b). A step with
noise multiplier sigma is (alpha, gamma(alpha))-RDP with

    gamma(alpha) = 1/(alpha - 1) ln E_rho[exp(alpha (alpha - 1) c rho^2 / sigma^2)],

where the exponent constant c depends on the neighbouring relation:
  - `replace_one`: c = 2, Theorem 2.4.4 as printed (replacing a node and its edges
    changes up to rho clipped gradients by up to 2C each: sensitivity 2 rho C);
  - `add_remove`: c = 1/2, what the authors' accounting code computes (sensitivity
    rho C), and what reproduces Table 2.6's epsilons (`../shared/PANDEMIC.md` 2.10).

`NodeLevelDpEvent` is a `dp_accounting.DpEvent` and `NodeLevelRdpAccountant` a
`dp_accounting.rdp.RdpAccountant` that composes it with every event the library's
accountant knows; a `PrivacyLedger` charges it like any other query. The guarantee
holds only for what the event describes: S bounds the examples that one node's
change alters, and batches are drawn uniformly at random each step. Its unit is a
node of the graph the examples are built from; where that graph is a degree-capped
one, the capping (which reads every node's edges) lies outside the guarantee.
Replacing a node alters the examples that held it and those that hold its
replacement: under a cap of S1 neighbours, S = 2 S1 + 1 (`pandemic.pipeline.
node_examples`); the theorem as printed takes S1 + 1, the count for adding or
removing one node.
"""

from __future__ import annotations

import functools
import math

import attr
import dp_accounting
import numpy as np
from scipy import special, stats

from tff_silo.privacy import events, gaussian_tail

# The orders of the authors' accountant (accounting.py of their submission); with
# sigma <= 0.5 the lowest usable order is optimal, so epsilon depends on this list.
AUTHOR_ORDERS = ((1.01, 1.1, 1.2, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.25, 3.5, 3.75,
                  4.0, 4.25, 4.5, 4.75) + tuple(float(a) for a in np.arange(5, 64, 0.5))
                 + (128.0, 256.0, 512.0))
EXPONENT = {"replace_one": 2.0, "add_remove": 0.5}
EXPONENT_LABEL = {
    "replace_one": "Theorem 2.4.4 as printed (2 rho^2 / sigma^2; replace one node)",
    "add_remove": "the authors' code (rho^2 / (2 sigma^2); add or remove one node)",
}


@attr.s(frozen=True, slots=True, auto_attribs=True)
class NodeLevelDpEvent(dp_accounting.DpEvent):
  """One DP-SGD step on `num_nodes` neighbourhood examples, each node in at most
  `max_neighbourhoods` (S) of them, a batch of `batch_size` (b) drawn uniformly
  without replacement, Gaussian noise of std `noise_multiplier` times the clip."""
  noise_multiplier: float
  num_nodes: int
  max_neighbourhoods: int
  batch_size: int

  def sampler_tail(self, neighbouring: str) -> float:
    """The Gaussian sampler's tail of this step (`step_tail`), for
    `events.sampler_tail`."""
    return step_tail(self, neighbouring)


def check_event(event: NodeLevelDpEvent) -> None:
  if not event.noise_multiplier > 0:
    raise ValueError(f"noise_multiplier must be > 0, got {event.noise_multiplier}")
  for name in ("num_nodes", "max_neighbourhoods", "batch_size"):
    value = getattr(event, name)
    if int(value) != value or value < 1:
      raise ValueError(f"{name} must be a positive integer, got {value}")
  if event.batch_size > event.num_nodes or event.max_neighbourhoods > event.num_nodes:
    raise ValueError(f"batch_size ({event.batch_size}) and max_neighbourhoods "
                     f"({event.max_neighbourhoods}) must be at most num_nodes "
                     f"({event.num_nodes})")


def step_rdp(event: NodeLevelDpEvent, orders, neighbouring: str) -> np.ndarray:
  """gamma(alpha) of one step at each order (> 1), in the log domain."""
  check_event(event)
  events.check_neighbouring(neighbouring)
  c = EXPONENT[neighbouring]
  n, s, b = int(event.num_nodes), int(event.max_neighbourhoods), int(event.batch_size)
  rho = np.arange(0, min(s, b) + 1)
  log_pmf = stats.hypergeom(n, s, b).logpmf(rho)
  out = []
  for alpha in orders:
    if alpha <= 1:
      raise ValueError(f"orders must be > 1, got {alpha}")
    exponent = alpha * (alpha - 1) * c * rho.astype(np.float64) ** 2 / (
        event.noise_multiplier ** 2)
    out.append(float(special.logsumexp(log_pmf + exponent)) / (alpha - 1))
  return np.array(out)


@functools.lru_cache(maxsize=1024)
def step_tail(event: NodeLevelDpEvent, neighbouring: str) -> float:
  """The Gaussian sampler's tail of one step (`gaussian_tail.release_tail`): a node
  in rho of the batch's examples shifts the clipped sum by 2 rho C (replacing it) or
  rho C (adding or removing it), i.e. by sqrt(2 c) rho / sigma noise deviations,
  averaged over rho's hypergeometric law."""
  check_event(event)
  events.check_neighbouring(neighbouring)
  n, s, b = int(event.num_nodes), int(event.max_neighbourhoods), int(event.batch_size)
  rho = np.arange(1, min(s, b) + 1)
  pmf = stats.hypergeom(n, s, b).pmf(rho)
  scale = math.sqrt(2.0 * EXPONENT[neighbouring]) / event.noise_multiplier
  return float(sum(p * gaussian_tail.release_tail(scale * r)
                   for p, r in zip(pmf, rho) if p > 0))


class NodeLevelRdpAccountant(dp_accounting.rdp.RdpAccountant):
  """dp_accounting's RDP accountant that also composes `NodeLevelDpEvent`s (the
  exponent of its neighbouring relation: `EXPONENT`)."""

  def _maybe_compose(self, event, count, do_compose):
    if isinstance(event, NodeLevelDpEvent):
      try:
        check_event(event)
      except ValueError as e:
        return self.CompositionErrorDetails(event, str(e))
      if do_compose:
        self._rdp += count * step_rdp(event, self._orders, events.relation_name(
            self._neighboring_relation))
      return None
    return super()._maybe_compose(event, count, do_compose)


def training_event(noise_multiplier: float, num_nodes: int, max_neighbourhoods: int,
                   batch_size: int, steps: int) -> dp_accounting.DpEvent:
  """`steps` node-level DP-SGD steps."""
  return dp_accounting.SelfComposedDpEvent(
      NodeLevelDpEvent(float(noise_multiplier), int(num_nodes), int(max_neighbourhoods),
                       int(batch_size)), int(steps))


def epsilon(noise_multiplier: float, num_nodes: int, max_neighbourhoods: int,
            batch_size: int, steps: int, delta: float, *,
            neighbouring: str = "replace_one", orders=AUTHOR_ORDERS) -> float:
  """Node-level epsilon at `delta` after `steps` steps (dp_accounting's conversion,
  orders at most 1.01 unused; the Gaussian sampler's tail taken from delta)."""
  event = training_event(noise_multiplier, num_nodes, max_neighbourhoods, batch_size,
                         steps)
  check_event(event.event)   # a one-line ValueError, not dp_accounting's
  accountant = NodeLevelRdpAccountant(list(orders),
                                      events.neighbouring_relation(neighbouring))
  accountant.compose(event)
  tail = events.sampler_tail(event, neighbouring)
  delta = events.delta_after_tail(delta, tail)
  return float(accountant.get_epsilon(delta)) if delta > 0 else math.inf


def calibrate_noise_multiplier(target_epsilon: float, num_nodes: int,
                               max_neighbourhoods: int, batch_size: int, steps: int,
                               delta: float, *, neighbouring: str = "replace_one",
                               orders=AUTHOR_ORDERS) -> float:
  """The smallest noise multiplier (to a relative 1e-4) whose epsilon is at most
  `target_epsilon`: bisection keeping the upper end, so it never overshoots."""
  if not target_epsilon > 0 or not math.isfinite(target_epsilon):
    raise ValueError(f"target_epsilon must be a positive number, got {target_epsilon}")
  spent = lambda z: epsilon(z, num_nodes, max_neighbourhoods, batch_size, steps, delta,
                            neighbouring=neighbouring, orders=orders)
  low, high = 1e-3, 1.0
  while spent(high) > target_epsilon:
    low, high = high, high * 2
    if high > 1e6:
      raise ValueError(f"no noise multiplier up to 1e6 reaches epsilon {target_epsilon}")
  while high - low > 1e-4 * high:
    middle = (low + high) / 2
    if spent(middle) > target_epsilon:
      low = middle
    else:
      high = middle
  return high
