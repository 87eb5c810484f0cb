"""A daily outbreak on a fixed contact graph (`../shared/PANDEMIC.md` 4.3).

Internal states S -> E -> {A (asymptomatic), P (symptomatic)} -> R, reported as S
for S, E and A, I for P, R for R: an asymptomatic infection shows as S -> R, the
"secretly infectious" case of the thesis. On day t a susceptible j is infected with
probability 1 - exp(-H_j),

    H_j = beta * sus(age_j) * sum over contacts (i, j) of inf_i(t) * hours_ij,

inf = 1 for P and 0.5 for A, hours at home weighted by `home_contact_weight`, plus an
importation probability per person-day. With heterogeneous regions
(`EpidemicConfig.region_transmission`, `region_home_weight`) the susceptibility and
the home weight are scaled per region, so regions differ in how contacts translate
into infections.
Latent (2/3/4 days) and infectious (3..10, mode 5) durations and the asymptomatic
coin are drawn per person once, and the day's uniforms from the seed and the day,
so runs with different beta share their random numbers (bisection on beta in
`calibrate` is then nearly monotone). The parameters are COVID-like assumptions,
not the challenge's (UVA's disease model is not public).
"""

from __future__ import annotations

import dataclasses

import numpy as np

DAYS = 64                     # days 0..63
S, E, A, P, R = range(5)
REPORTED = np.array([0, 0, 0, 1, 2], np.int8)   # S, E, A -> S; P -> I; R -> R
REGIONS = 3   # the official partition's (`partition.official_regions`)


@dataclasses.dataclass(frozen=True)
class EpidemicConfig:
  """The disease model's parameters (PANDEMIC.md 4.3 defaults)."""
  beta: float = 5e-3                 # per contact-hour with a symptomatic person
  asymptomatic_probability: float = 0.35
  asymptomatic_infectiousness: float = 0.5
  latent_days: tuple = (2, 3, 4)
  latent_probabilities: tuple = (0.3, 0.4, 0.3)
  infectious_days: tuple = (3, 4, 5, 6, 7, 8, 9, 10)
  infectious_probabilities: tuple = (0.08, 0.16, 0.22, 0.17, 0.13, 0.10, 0.08, 0.06)
  seed_fraction: float = 5e-4        # I0 = max(min_seeds, fraction * N) on day 0
  min_seeds: int = 20
  seed_counties: int = 0             # 0: seeds drawn from everyone (every client
                                     # gets an outbreak); k: from k random counties
  home_contact_weight: float = 3.0   # a household contact-hour counts this much
                                     # (closer contact; household attack 5-30%)
  importation: float = 5e-5          # per person-day (PANDEMIC.md suggests 1e-6;
                                     # more keeps every region's outbreak going)
  # Heterogeneous regions (the official partition's three; empty: one disease and
  # one contact structure everywhere): a susceptible of region r is infected with
  # pressure times region_transmission[r], and household contact-hours in region r
  # count home_contact_weight times region_home_weight[r].
  region_transmission: tuple = ()
  region_home_weight: tuple = ()

  def __post_init__(self):
    for name in ("region_transmission", "region_home_weight"):
      factors = getattr(self, name)
      if factors and (len(factors) != REGIONS or not all(
          np.isfinite(f) and f > 0 for f in factors)):
        raise ValueError(f"{name} must be {REGIONS} positive factors (one per region "
                         f"of the official partition) or empty, got {factors}")


def susceptibility(age) -> np.ndarray:
  """0.5 under 10 years, 0.75 for 10-19, 1 from 20."""
  age = np.asarray(age)
  return np.where(age < 10, 0.5, np.where(age < 20, 0.75, 1.0))


@dataclasses.dataclass(frozen=True)
class Outbreak:
  """Reported states [N, DAYS] (0 S, 1 I, 2 R) and the internal timeline."""
  reported: np.ndarray
  infected_day: np.ndarray      # day of infection (-1: never; seeds: -1 too)
  asymptomatic: np.ndarray      # bool, per person
  seeds: np.ndarray             # the persons infectious on day 0


class Contacts:
  """The undirected contacts (pid1, pid2, hours) indexed by each end, so that a day
  visits only the contacts of infectious persons (a few percent of them)."""

  def __init__(self, pid1, pid2, hours, n: int):
    self.ends = (np.asarray(pid1), np.asarray(pid2))
    self.hours = np.asarray(hours)
    self.n = n
    self._by_end = []
    for end in self.ends:   # the contacts of person i: order[indptr[i]:indptr[i + 1]]
      counts = np.bincount(end, minlength=n)
      self._by_end.append((np.argsort(end, kind="stable"),
                           np.concatenate([[0], np.cumsum(counts)])))

  def pressure(self, spreading, force) -> np.ndarray:
    """sum over contacts (i, j) of force_i * hours_ij, per j (`spreading`: the
    persons whose force is not 0). Only their contacts are summed, in the contacts'
    own order, so the sums are those over every contact to the last bit (the other
    terms are exact zeros)."""
    total = np.zeros(self.n)
    for side, (order, indptr) in enumerate(self._by_end):
      starts = indptr[spreading]
      counts = indptr[spreading + 1] - starts
      within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
      edges = np.sort(order[np.repeat(starts, counts) + within])
      source, target = self.ends[side][edges], self.ends[1 - side][edges]
      total += np.bincount(target, weights=force[source] * self.hours[edges],
                           minlength=self.n)
    return total


def simulate(pid1, pid2, hours, age, county, config: EpidemicConfig, seed: int, *,
             contacts: Contacts | None = None, region=None) -> Outbreak:
  """The outbreak over `DAYS` days on the undirected contacts (pid1, pid2, hours)
  (`contacts`: the same contacts already indexed, for repeated runs; `region`:
  each person's region, needed with `config.region_transmission`)."""
  n = len(age)
  contacts = contacts or Contacts(pid1, pid2, hours, n)
  rng = np.random.default_rng([seed, 0])
  latent = rng.choice(config.latent_days, n, p=config.latent_probabilities)
  infectious = rng.choice(config.infectious_days, n, p=config.infectious_probabilities)
  asymptomatic = rng.random(n) < config.asymptomatic_probability
  if config.seed_counties:
    counties = rng.choice(np.unique(county), min(config.seed_counties,
                                                 len(np.unique(county))), replace=False)
    candidates = np.flatnonzero(np.isin(county, counties))
  else:
    candidates = np.arange(n)
  seeds = rng.choice(candidates, min(len(candidates), max(
      config.min_seeds, int(config.seed_fraction * n))), replace=False)
  sus = susceptibility(age) * config.beta * region_factor(
      config.region_transmission, region, n)
  weight = np.where(asymptomatic, config.asymptomatic_infectiousness, 1.0)
  state = np.full(n, S, np.int8)
  # day on which the current state ends (the next one begins)
  ends = np.full(n, np.iinfo(np.int32).max, np.int64)
  state[seeds] = np.where(asymptomatic[seeds], A, P)
  ends[seeds] = infectious[seeds]
  infected_day = np.full(n, -1, np.int64)
  reported = np.empty((n, DAYS), np.int8)
  for day in range(DAYS):
    # transitions due today
    due = ends <= day
    moving = due & (state == E)
    state[moving] = np.where(asymptomatic[moving], A, P)
    ends[moving] = day + infectious[moving]
    recovering = due & ((state == A) | (state == P)) & ~moving
    state[recovering] = R
    ends[recovering] = np.iinfo(np.int32).max
    reported[:, day] = REPORTED[state]
    # today's infections (E from tomorrow)
    spreading = (state == A) | (state == P)
    pressure = contacts.pressure(np.flatnonzero(spreading),
                                 np.where(spreading, weight, 0.0))
    day_rng = np.random.default_rng([seed, 1, day])
    draws, imported = day_rng.random(n), day_rng.random(n)
    new = (state == S) & ((draws < -np.expm1(-sus * pressure))
                          | (imported < config.importation))
    state[new] = E
    ends[new] = day + 1 + latent[new]
    infected_day[new] = day
  return Outbreak(reported, infected_day, asymptomatic, seeds)


def region_factor(factors: tuple, region, n: int) -> np.ndarray:
  """Each of n persons' factor of `factors` (one per region; empty: 1 for all)."""
  if not factors:
    return np.ones(n)
  if region is None:
    raise ValueError("heterogeneous regions need each person's region")
  return np.asarray(factors, np.float64)[np.asarray(region)]


def target(reported: np.ndarray, count_asymptomatic: bool = False) -> np.ndarray:
  """infected (0/1) per person: reported S on day 56 and I on some day in 57..63
  (with `count_asymptomatic`, also S -> R without I in that week)."""
  last = reported[:, 56] == 0
  window = reported[:, 57:64]
  positive = (window == 1).any(axis=1)
  if count_asymptomatic:
    positive |= (window == 2).any(axis=1)
  return (last & positive).astype(np.int64)


def calibrate(pid1, pid2, hours, age, county, config: EpidemicConfig, seed: int, *,
              final_week_rate: float = 0.003, grid: int = 16, refine: int = 6,
              region=None):
  """(config with beta set so that the share of persons counted positive in days
  57..63 is near `final_week_rate`, its outbreak). That share rises with beta and
  falls again once the outbreak burns out before day 57, so beta is the first
  crossing on a log grid (the slow, still-growing branch), refined by bisection."""
  rates, best = {}, [None]
  contacts = Contacts(pid1, pid2, hours, len(age))
  distance = lambda r: abs(np.log(max(r, 1e-9) / final_week_rate))

  def rate(beta):
    if beta not in rates:
      trial = dataclasses.replace(config, beta=float(beta))
      outbreak = simulate(pid1, pid2, hours, age, county, trial, seed,
                          contacts=contacts, region=region)
      rates[beta] = target(outbreak.reported).mean()
      if best[0] is None or distance(rates[beta]) < distance(best[0][2]):
        best[0] = (trial, outbreak, rates[beta])   # only the closest is kept
    return rates[beta]

  betas = np.logspace(-4, np.log10(0.3), grid)
  above = [b for b in betas if rate(b) >= final_week_rate]
  if above:
    high = above[0]
    low = betas[max(0, int(np.flatnonzero(betas == high)[0]) - 1)]
    for _ in range(refine if low < high else 0):
      middle = float(np.sqrt(low * high))
      if rate(middle) < final_week_rate:
        low = middle
      else:
        high = middle
  return best[0][0], best[0][1]
