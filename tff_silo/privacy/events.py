"""The library's privacy events and what every accountant needs to know of them: the
neighbouring relations, the exponential-mechanism selection as an RDP-equivalent
Gaussian, and the Gaussian sampler's tail of any event (a leaf of `privacy/`:
`accounting`, `node_level`, `ledger` and `tuning` all build on it).

Neighbouring relations (`NEIGHBOURING`; the relation a run protects is chosen in
`protocol`):
- `add_remove`: add or remove one example (one node, one user).
- `replace_one`: replace one example's value; the dataset's size is public. A sum of
  vectors clipped to C moves by up to 2C (`REPLACE_ONE_SENSITIVITY_FACTOR`).

The sampler tail (`sampler_tail`): the library's Gaussian noise (`gaussian`) has a
support bound, and the probability that it matters is taken from delta before any
conversion to epsilon (`delta_after_tail`). The float grid of those draws is not
accounted: a reported (epsilon, delta) is the real-valued Gaussian's (`gaussian`).
The integer Gaussian mechanism (`integer_gaussian`) has no grid: its DP-SGD steps
are Gaussian events (they are as private as the Gaussian mechanism) beside an
`IntegerNoiseTail` that carries its sampler's gap (`integer_law.release_tail`).
"""

from __future__ import annotations

import attr
import dp_accounting

from tff_silo.privacy import gaussian_tail, integer_law

NEIGHBOURING = ("add_remove", "replace_one")
# Replacing one example moves a sum of vectors clipped to C by up to 2C.
REPLACE_ONE_SENSITIVITY_FACTOR = 2.0


def check_neighbouring(neighbouring: str) -> str:
  if neighbouring not in NEIGHBOURING:
    raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {neighbouring!r}")
  return neighbouring


def neighbouring_relation(neighbouring: str) -> dp_accounting.NeighboringRelation:
  """dp_accounting's relation for `add_remove` or `replace_one`."""
  check_neighbouring(neighbouring)
  return (dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
          if neighbouring == "add_remove" else dp_accounting.NeighboringRelation.REPLACE_ONE)


def relation_name(relation: dp_accounting.NeighboringRelation) -> str:
  """The library's name of dp_accounting's relation (inverse of
  `neighbouring_relation`)."""
  return {dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE: "add_remove",
          dp_accounting.NeighboringRelation.REPLACE_ONE: "replace_one"}[relation]


@attr.s(frozen=True, slots=True)
class SelectionDpEvent(dp_accounting.GaussianDpEvent):
  """One exponential-mechanism selection: the RDP of the Gaussian mechanism with
  multiplier 2 / eps (which every accountant composes as such), drawn with Gumbel
  noise (`selection`), so no Gaussian sampler tail."""


def selection_event(selection_epsilon: float, num_selections: int) -> dp_accounting.DpEvent:
  """`num_selections` exponential-mechanism selections, each (eps^2/8)-zCDP.

  Represented by the Gaussian mechanism with noise multiplier 2 / eps, whose RDP
  alpha / (2 (2/eps)^2) = alpha * eps^2 / 8 is the selection's RDP.
  """
  return dp_accounting.SelfComposedDpEvent(
      SelectionDpEvent(2.0 / selection_epsilon), int(num_selections))


@attr.s(frozen=True, slots=True)
class IntegerNoiseTail(dp_accounting.NoOpDpEvent):
  """Releases of `coordinates` integer-noise coordinates in all: nothing for the
  accountants' curves (the releases' own Gaussian events carry their privacy), their
  sampler's gap for `sampler_tail`, whatever the sampling (the gap is the
  sampler's, in every release, the differing example's or not)."""
  coordinates = attr.ib(type=int)


def sampler_tail(event: dp_accounting.DpEvent,
                 neighbouring: str = "add_remove") -> float:
  """The probability, over the releases `event` describes, that the library's
  Gaussian noise leaves the Gaussian's law where a neighbour's shift matters
  (`gaussian_tail.release_tail`): a release shifts only when the differing example or
  node is in its batch (probability q; b / n; the node's hypergeometric count), by
  its sensitivity over the noise's std (1 / z of its `GaussianDpEvent`); an event of
  the library's own kind (`node_level.NodeLevelDpEvent`) says its own
  (`event.sampler_tail`). Selections and non-Gaussian events add nothing; the sum
  may exceed 1. An `IntegerNoiseTail` says its sampler's gap (a Gaussian event of
  integer noise beside it adds its support tail too: an upper bound)."""
  if isinstance(event, IntegerNoiseTail):
    return integer_law.release_tail(event.coordinates)
  if isinstance(event, SelectionDpEvent) or isinstance(event, (
      dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent,
      dp_accounting.LaplaceDpEvent)):
    return 0.0
  if isinstance(event, dp_accounting.GaussianDpEvent):
    z = event.noise_multiplier
    return gaussian_tail.release_tail(1.0 / z) if z > 0 else 0.0   # z = 0: epsilon inf
  if isinstance(event, dp_accounting.PoissonSampledDpEvent):
    return event.sampling_probability * sampler_tail(event.event, neighbouring)
  if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
    return (event.sample_size / event.source_dataset_size
            * sampler_tail(event.event, neighbouring))
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return event.count * sampler_tail(event.event, neighbouring)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return sum(sampler_tail(e, neighbouring) for e in event.events)
  if hasattr(event, "sampler_tail"):
    return event.sampler_tail(neighbouring)
  raise ValueError(f"no sampler tail is known for {event}")


def delta_after_tail(target_delta: float, tail: float) -> float:
  """The delta left for the Gaussian's own (epsilon, delta) once the sampler's tail
  is paid; 0 when nothing is left (epsilon is then infinite)."""
  return max(0.0, target_delta - tail)
