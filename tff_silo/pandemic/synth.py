"""A synthetic population, contact network and outbreak in the challenge's files
(`../shared/PANDEMIC.md` 4), seeded and byte-reproducible.

Stages: counties (lognormal populations, centroids in Virginia's bounding box,
spread so that the official three-way partition's regions hold similar numbers of
persons) -> households (US-like sizes)
and persons (ages, sexes) -> residences and activity locations -> one day's
schedule per person (home, work, school, college, shopping, other, religion) ->
contacts (household members at home; co-located visitors in rooms elsewhere, each
undirected pair once) -> the outbreak (`epidemic`, beta calibrated to the final
week's positive rate) -> the centralized folder and the scenarios' client folders
(`partition`).

    from tff_silo.pandemic import synth
    synth.generate("data/pandemic", "small", seed=0)

Profiles: tiny (2,000 persons, tests), small (50,000), medium (400,000), large
(1,000,000) and smoke (2,600,000, the size of the thesis' Smoke silo; documented,
for a machine with more memory than the tests need).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import time
from typing import Optional

import numpy as np
import pandas as pd

from tff_silo.pandemic import epidemic, files, partition

HOUSEHOLD_SIZES = np.arange(1, 8)
HOUSEHOLD_PMF = np.array([0.28, 0.34, 0.16, 0.13, 0.06, 0.02, 0.01])
DAY = 86_400
HOUR = 3_600
# county FIPS-like codes: 100 odd county codes, then independent-city codes
ADMIN2_CODES = tuple(range(1, 200, 2)) + tuple(range(510, 850, 10))
# type: (code, share of activity locations, room capacity, mean partners in a room
# before `degree_target` scales them)
PLACES = {
    "work": (2, 0.60, 120, 8.0), "shopping": (3, 0.12, 80, 2.0),
    "other": (4, 0.18, 80, 3.0), "school": (5, 0.05, 60, 10.0),
    "college": (6, 0.005, 100, 8.0), "religion": (7, 0.045, 120, 6.0),
}
DEGREE_TARGET = 45.0   # mean 2E/N (the thesis' subsets: 41.8 and 50.6)
PERSONS_PER_PLACE = 55


@dataclasses.dataclass(frozen=True)
class Profile:
  name: str
  persons: int
  counties: int


PROFILES = {p.name: p for p in (
    Profile("tiny", 2_000, 3), Profile("small", 50_000, 12),
    Profile("medium", 400_000, 40), Profile("large", 1_000_000, 133),
    Profile("smoke", 2_600_000, 133))}


@dataclasses.dataclass(frozen=True)
class Population:
  """Everything generated, as arrays (before writing)."""
  county_code: np.ndarray        # [K] admin2
  county_lon: np.ndarray
  county_lat: np.ndarray
  household_county: np.ndarray   # [H] county index
  household_rlid: np.ndarray     # [H]
  household_size: np.ndarray     # [H]
  person_hid: np.ndarray         # [N]
  person_number: np.ndarray
  age: np.ndarray
  sex: np.ndarray
  residences: pd.DataFrame       # the residence location table
  places: pd.DataFrame           # the activity location table
  assignments: pd.DataFrame      # the assignment table
  contacts: pd.DataFrame         # the population network

  @property
  def person_county(self) -> np.ndarray:
    return self.household_county[self.person_hid]


# The official partition's three regions (lat >= 38.5; else lon < -77.5; else the
# rest) as (lon, lat) boxes inside Virginia's bounding box.
REGIONS = (((-83.5, -75.4), (38.55, 39.4)), ((-83.5, -77.6), (36.6, 38.45)),
           ((-77.4, -75.4), (36.6, 38.45)))


def _counties(k: int, rng) -> tuple:
  """(codes, centroid longitudes, latitudes, population shares): lognormal shares;
  the counties go, largest first, to the region with the fewest persons so far, so
  the official three-way partition's clients are of similar size (as the
  notebook's are: 2.61 M, 2.47 M, 2.61 M)."""
  weights = rng.lognormal(0.0, 1.0, k)
  weights /= weights.sum()
  region = np.empty(k, np.int64)
  totals = np.zeros(len(REGIONS))
  for c in np.argsort(-weights, kind="stable"):
    region[c] = int(np.argmin(totals))
    totals[region[c]] += weights[c]
  lon = np.array([rng.uniform(*REGIONS[r][0]) for r in region])
  lat = np.array([rng.uniform(*REGIONS[r][1]) for r in region])
  return np.array(ADMIN2_CODES[:k]), lon, lat, weights


def _households(n: int, county_weights, rng) -> tuple:
  """(household sizes, each household's county): households in county order."""
  sizes = rng.choice(HOUSEHOLD_SIZES, int(n / 2.3) + 10, p=HOUSEHOLD_PMF)
  total = np.cumsum(sizes)
  count = int(np.searchsorted(total, n)) + 1
  sizes = sizes[:count].copy()
  sizes[-1] -= total[count - 1] - n
  k = len(county_weights)
  per_county = np.maximum(1, np.round(county_weights * count).astype(int))
  per_county[np.argmax(per_county)] += count - per_county.sum()
  return sizes, np.repeat(np.arange(k), per_county)


def _ages(sizes, rng) -> tuple:
  """(ages, sexes, person numbers) of persons in household order."""
  first = np.repeat(np.cumsum(sizes) - sizes, sizes)
  number = np.arange(int(sizes.sum())) - first + 1
  head_age = rng.integers(18, 91, len(sizes))
  head = np.repeat(head_age, sizes)
  n = len(number)
  partner = rng.random(n) < 0.75
  child = rng.random(n) < 0.8
  age = np.where(number == 1, head,
                 np.where((number == 2) & partner,
                          np.clip(head + rng.normal(0, 5, n).round(), 18, 90),
                          np.where(child, rng.integers(0, 18, n), rng.integers(18, 91, n))))
  return age.astype(np.int64), rng.integers(1, 3, n), number


def _distance_km(lon1, lat1, lon2, lat2):
  scale = 111.0 * np.cos(np.deg2rad((lat1 + lat2) / 2))
  return np.hypot((lon1 - lon2) * scale, (lat1 - lat2) * 111.0)


def _residences(household_county, lon, lat, rng) -> tuple:
  """(the residence table, each household's rlid): ceil(1.1 H_c) residences per
  county near its centroid; households take a random permutation of them."""
  k = len(lon)
  per_county = np.bincount(household_county, minlength=k)
  count = np.ceil(1.1 * per_county).astype(int)
  first = np.cumsum(count) - count
  res_county = np.repeat(np.arange(k), count)
  rlid = files.RESIDENCE_LID_BASE + 1 + np.arange(count.sum())
  household_rlid = np.empty(len(household_county), np.int64)
  start = 0
  for c in range(k):
    chosen = rng.permutation(count[c])[:per_county[c]]
    household_rlid[start:start + per_county[c]] = rlid[first[c] + chosen]
    start += per_county[c]
  table = pd.DataFrame(dict(
      rlid=rlid, longitude=lon[res_county] + rng.normal(0, 0.15, len(rlid)),
      latitude=lat[res_county] + rng.normal(0, 0.15, len(rlid)), admin1=51,
      admin2=res_county))
  return table, household_rlid


def _places(n: int, county_weights, lon, lat, rng) -> pd.DataFrame:
  """Activity locations: per type its share of N / 55 places, spread over counties
  by population (work, shopping, other and school at least one per county)."""
  total = max(len(PLACES), n // PERSONS_PER_PLACE)
  rows = []
  for name, (_, share, _, _) in PLACES.items():
    per_county = rng.multinomial(max(1, round(share * total)), county_weights)
    if name in ("work", "shopping", "other", "school"):
      per_county = np.maximum(per_county, 1)
    county = np.repeat(np.arange(len(lon)), per_county)
    size = (np.minimum(rng.zipf(1.8, len(county)), 2000).astype(float)
            if name == "work" else np.ones(len(county)))
    rows.append(pd.DataFrame(dict(type=name, county=county, size=size)))
  table = pd.concat(rows, ignore_index=True)
  table = table.iloc[rng.permutation(len(table))].reset_index(drop=True)
  table.insert(0, "alid", np.arange(1, len(table) + 1))
  table["longitude"] = lon[table.county] + rng.normal(0, 0.1, len(table))
  table["latitude"] = lat[table.county] + rng.normal(0, 0.1, len(table))
  for flag in files.LOCATION_FLAGS:
    table[flag] = (table.type == flag).astype(np.int64)
  return table


def _choose(places, kind, county, rng, weights=None) -> np.ndarray:
  """For each entry of `county`, a place of type `kind` in that county (weighted by
  `weights`, a column), or anywhere when the county has none."""
  options = places[places.type == kind]
  chosen = np.empty(len(county), np.int64)
  for c in np.unique(county):
    mask = county == c
    here = options[options.county == c]
    pool = here if len(here) else options
    w = None if weights is None else pool[weights].to_numpy()
    chosen[mask] = rng.choice(pool.alid.to_numpy(), int(mask.sum()),
                              p=None if w is None else w / w.sum())
  return chosen


def _schedule(age, person_hid, household_county, household_rlid, places, lon, lat,
              county_weights, rng) -> pd.DataFrame:
  """One day per person: a primary activity (work 72% of 18-64, school 95% of 5-17,
  college 35% of other 18-24) then shopping (35%), other (40%), religion (5%) in
  sequence, home before and after. Rows: hid, pid, activity_number, activity_type,
  start_time, duration, lid."""
  n = len(age)
  home_county = household_county[person_hid]
  works = (age >= 18) & (age <= 64) & (rng.random(n) < 0.72)
  schools = (age >= 5) & (age <= 17) & (rng.random(n) < 0.95)
  college = (age >= 18) & (age <= 24) & ~works & (rng.random(n) < 0.35)
  # the workplace's county: 85% home, else gravity pop * exp(-d / 50 km)
  k = len(lon)
  d = _distance_km(lon[:, None], lat[:, None], lon[None], lat[None])
  gravity = county_weights[None] * np.exp(-d / 50.0)
  np.fill_diagonal(gravity, 0.0)
  work_county = home_county.copy()
  away = works & (rng.random(n) >= 0.85)
  if k > 1:
    for c in np.unique(home_county[away]):
      mask = away & (home_county == c)
      work_county[mask] = rng.choice(k, int(mask.sum()), p=gravity[c] / gravity[c].sum())
  slots = []   # (who, activity type, lid, duration), in the order of the day
  primary_lid = np.zeros(n, np.int64)
  primary_type = np.zeros(n, np.int64)
  start = np.where(works, np.clip(rng.normal(8 * HOUR, HOUR, n), 5 * HOUR, 11 * HOUR),
                   rng.uniform(9 * HOUR, 12 * HOUR, n))
  start = np.where(schools, 8 * HOUR, np.where(college, rng.uniform(9, 13, n) * HOUR,
                                               start))
  duration = np.where(works, np.clip(rng.normal(8 * HOUR, 1.5 * HOUR, n), 3 * HOUR,
                                     11 * HOUR),
                      np.where(schools, 7 * HOUR, rng.uniform(2, 5, n) * HOUR))
  primary = works | schools | college
  primary_lid[works] = _choose(places, "work", work_county[works], rng, "size")
  primary_lid[schools] = _choose(places, "school", home_county[schools], rng)
  primary_lid[college] = _choose(places, "college", home_county[college], rng)
  primary_type[works], primary_type[schools], primary_type[college] = 2, 5, 6
  slots.append((primary, primary_type, primary_lid, duration))
  for name, p, low, high in (("shopping", 0.35, 20, 90), ("other", 0.40, 30, 180),
                             ("religion", 0.05, 60, 120)):
    mask = rng.random(n) < p
    lid = np.zeros(n, np.int64)
    lid[mask] = _choose(places, name, home_county[mask], rng)
    slots.append((mask, np.full(n, PLACES[name][0]), lid,
                  rng.uniform(low, high, n) * 60))
  # sequential times: the first activity at `start`, then gaps of 10-60 minutes
  rows = []
  clock = start.copy()
  first = np.full(n, DAY, np.float64)
  last = np.zeros(n, np.float64)
  for mask, code, lid, length in slots:
    begin = np.where(clock == start, clock, clock + rng.uniform(10, 60, n) * 60)
    end = begin + length
    keep = mask & (end <= 23 * HOUR)
    rows.append(pd.DataFrame(dict(pid=np.flatnonzero(keep), activity_type=code[keep],
                                  start_time=begin[keep].astype(np.int64),
                                  duration=(end[keep].astype(np.int64)
                                            - begin[keep].astype(np.int64)),
                                  lid=lid[keep])))
    first = np.where(keep, np.minimum(first, begin.astype(np.int64)), first)
    last = np.where(keep, np.maximum(last, end.astype(np.int64)), last)
    clock = np.where(keep, end, clock)
  out = first < DAY
  pids = np.arange(n)
  home = household_rlid[person_hid]
  morning = pd.DataFrame(dict(pid=pids, activity_type=1, start_time=0,
                              duration=np.where(out, first, DAY).astype(np.int64),
                              lid=home))
  evening = pd.DataFrame(dict(pid=pids[out], activity_type=1,
                              start_time=last[out].astype(np.int64),
                              duration=(DAY - last[out]).astype(np.int64), lid=home[out]))
  table = pd.concat([morning, *rows, evening], ignore_index=True)
  table = table.sort_values(["pid", "start_time"], kind="stable").reset_index(drop=True)
  table.insert(0, "hid", person_hid[table.pid.to_numpy()])
  table.insert(2, "activity_number",
               table.groupby("pid").cumcount().to_numpy() + 1)
  return table[list(files.COLUMNS["activity_location_assignment_data_path"])]


def _home_contacts(sizes, assignments, household_rlid) -> pd.DataFrame:
  """Every pair of household members (all share the morning at home): start 0,
  duration the total overlap of their home intervals."""
  home = assignments[assignments.activity_type == 1]
  morning = home[home.start_time == 0].set_index("pid").duration
  n = int(sizes.sum())
  leave = morning.reindex(np.arange(n)).to_numpy()
  back = np.full(n, DAY, np.int64)
  evening = home[home.start_time > 0]
  back[evening.pid.to_numpy()] = evening.start_time.to_numpy()
  first = np.cumsum(sizes) - sizes
  pairs = []
  for size in range(2, int(sizes.max(initial=1)) + 1):
    heads = first[sizes == size]
    i, j = np.triu_indices(size, 1)
    pairs.append(np.stack([(heads[:, None] + i).ravel(), (heads[:, None] + j).ravel()], 1))
  if not pairs:
    return pd.DataFrame(columns=files.COLUMNS["population_network_data_path"])
  a, b = np.concatenate(pairs).T
  overlap = (np.minimum(leave[a], leave[b]) + DAY - np.maximum(back[a], back[b])
             + np.maximum(0, leave[a] - back[b]) + np.maximum(0, leave[b] - back[a]))
  hid = np.repeat(np.arange(len(sizes)), sizes)
  return pd.DataFrame(dict(pid1=a, pid2=b, lid=household_rlid[hid[a]], start_time=0,
                           duration=overlap, activity1=1, activity2=1))


def _place_contacts(assignments, seed, scale: float) -> pd.DataFrame:
  """At each activity location, visitors of a type split into rooms of its
  capacity; each draws Poisson(scale * m) partners from its room; a pair is kept if
  their visits overlap (start the later start, duration the overlap)."""
  rng = np.random.default_rng([seed, 23])
  visits = assignments[assignments.activity_type != 1]
  tables = []
  for name, (code, _, capacity, mean) in PLACES.items():
    v = visits[visits.activity_type == code]
    if len(v) < 2:
      continue
    order = np.lexsort((rng.random(len(v)), v.lid.to_numpy()))
    lid = v.lid.to_numpy()[order]
    pid = v.pid.to_numpy()[order]
    begin = v.start_time.to_numpy()[order]
    end = begin + v.duration.to_numpy()[order]
    group_start = np.flatnonzero(np.r_[True, lid[1:] != lid[:-1]])
    rank = np.arange(len(lid)) - np.repeat(group_start, np.diff(np.r_[group_start,
                                                                        len(lid)]))
    room = np.cumsum(np.r_[True, (lid[1:] != lid[:-1]) | (rank[1:] // capacity
                                                          != rank[:-1] // capacity)]) - 1
    room_start = np.flatnonzero(np.r_[True, room[1:] != room[:-1]])
    room_size = np.diff(np.r_[room_start, len(room)])
    draws = np.minimum(rng.poisson(scale * mean, len(lid)), room_size[room] - 1)
    who = np.repeat(np.arange(len(lid)), draws)
    other = room_start[room[who]] + (rng.random(len(who)) * room_size[room[who]]).astype(
        np.int64)
    keep = other != who
    who, other = who[keep], other[keep]
    overlap = np.minimum(end[who], end[other]) - np.maximum(begin[who], begin[other])
    keep = overlap > 0
    who, other = who[keep], other[keep]
    tables.append(pd.DataFrame(dict(
        pid1=pid[who], pid2=pid[other], lid=lid[who],
        start_time=np.maximum(begin[who], begin[other]), duration=overlap[keep],
        activity1=code, activity2=code)))
  return pd.concat(tables, ignore_index=True)


def _network(home, places, seed) -> pd.DataFrame:
  """One row per undirected pair (home rows first), randomly oriented."""
  rng = np.random.default_rng([seed, 29])
  table = pd.concat([home, places], ignore_index=True)
  low = np.minimum(table.pid1, table.pid2).to_numpy()
  high = np.maximum(table.pid1, table.pid2).to_numpy()
  _, first = np.unique(low * (int(high.max(initial=0)) + 1) + high, return_index=True)
  table = table.iloc[np.sort(first)].reset_index(drop=True)
  flip = rng.random(len(table)) < 0.5
  p1, p2 = table.pid1.to_numpy().copy(), table.pid2.to_numpy().copy()
  a1, a2 = table.activity1.to_numpy().copy(), table.activity2.to_numpy().copy()
  table["pid1"], table["pid2"] = np.where(flip, p2, p1), np.where(flip, p1, p2)
  table["activity1"], table["activity2"] = np.where(flip, a2, a1), np.where(flip, a1, a2)
  return table[list(files.COLUMNS["population_network_data_path"])].astype(np.int64)


def population(profile: Profile, seed: int,
               degree_target: float = DEGREE_TARGET) -> Population:
  """Generates `profile`'s population and contact network (no outbreak yet)."""
  rng = np.random.default_rng([seed, 17])
  codes, lon, lat, weights = _counties(profile.counties, rng)
  sizes, household_county = _households(profile.persons, weights, rng)
  age, sex, number = _ages(sizes, rng)
  person_hid = np.repeat(np.arange(len(sizes)), sizes)
  residences, household_rlid = _residences(household_county, lon, lat, rng)
  residences["admin2"] = codes[residences.admin2.to_numpy()]
  places = _places(profile.persons, weights, lon, lat, rng)
  assignments = _schedule(age, person_hid, household_county, household_rlid, places,
                          lon, lat, weights, rng)
  home = _home_contacts(sizes, assignments, household_rlid)
  low, high = 0.05, 20.0   # the partner scale whose network has DEGREE_TARGET
  for _ in range(12):
    scale = math.sqrt(low * high)
    contacts = _network(home, _place_contacts(assignments, seed, scale), seed)
    if 2 * len(contacts) / profile.persons < degree_target:
      low = scale
    else:
      high = scale
    if abs(2 * len(contacts) / profile.persons / degree_target - 1) < 0.02:
      break
  return Population(codes, lon, lat, household_county, household_rlid, sizes,
                    person_hid, number, age, sex, residences, places, assignments,
                    contacts)


def _tables(pop: Population, reported: np.ndarray) -> dict:
  """argument -> the full (centralized) table."""
  n = len(pop.age)
  person = pd.DataFrame(dict(hid=pop.person_hid, pid=np.arange(n),
                             person_number=pop.person_number, age=pop.age, sex=pop.sex))
  household = pd.DataFrame(dict(hid=np.arange(len(pop.household_size)),
                                rlid=pop.household_rlid, admin1=51,
                                admin2=pop.county_code[pop.household_county],
                                hh_size=pop.household_size))
  places = pop.places[list(files.COLUMNS["activity_location_data_path"])]
  days = files.TRAINING_DAYS
  outcome = pd.DataFrame(dict(
      pid=np.tile(np.arange(n), days), day=np.repeat(np.arange(days), n),
      state=np.array(files.STATES)[reported[:, :days].T.ravel()]))
  return {"person_data_path": person, "household_data_path": household,
          "residence_location_data_path": pop.residences,
          "activity_location_data_path": places,
          "activity_location_assignment_data_path": pop.assignments,
          "population_network_data_path": pop.contacts,
          "disease_outcome_data_path": outcome}


def _write_stages(train: str, test: str, tables: dict, target_table: pd.DataFrame
                  ) -> None:
  """The train and test folders of one client (or the centralized one): the same
  tables (written once, the test folder's are byte copies), and in the test folder
  the target and the predictions' format."""
  for argument, table in tables.items():
    path = os.path.join(train, files.FILES[argument])
    files.write_csv_gz(table, path)
    copy = os.path.join(test, files.FILES[argument])
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    shutil.copyfile(path, copy)
  files.write_csv_gz(target_table, os.path.join(test, files.TARGET))
  files.write_csv(target_table[["pid"]].assign(score=0.5),
                  os.path.join(test, files.PREDICTIONS_FORMAT))


def generate(out: str, profile="tiny", seed: int = 0, *,
             config: Optional[epidemic.EpidemicConfig] = None,
             final_week_rate: float = 0.003, count_asymptomatic: bool = False,
             scenarios=partition.SCENARIOS, progress=None) -> dict:
  """Writes the centralized folder and `scenarios` under `out`; returns the
  metadata (also written to `out/synthetic_meta.json`, which no loader reads)."""
  profile = PROFILES[profile] if isinstance(profile, str) else profile
  say = progress or (lambda message: None)
  start = time.perf_counter()
  pop = population(profile, seed)
  say(f"population: {profile.persons} persons, {len(pop.contacts)} contacts "
      f"({time.perf_counter() - start:.0f}s)")
  config = config or epidemic.EpidemicConfig()
  region = partition.official_regions(pop.county_lon, pop.county_lat)[pop.person_county]
  p1, p2 = pop.contacts.pid1.to_numpy(), pop.contacts.pid2.to_numpy()
  home_weight = config.home_contact_weight * epidemic.region_factor(
      config.region_home_weight, region, len(region))[p1]   # a household: one region
  hours = pop.contacts.duration.to_numpy() / HOUR * np.where(
      pop.contacts.activity1.to_numpy() == 1, home_weight, 1.0)
  config, outbreak = epidemic.calibrate(p1, p2, hours, pop.age, pop.person_county,
                                        config, seed, final_week_rate=final_week_rate,
                                        region=region)
  say(f"outbreak: beta {config.beta:.3g} ({time.perf_counter() - start:.0f}s)")
  infected = epidemic.target(outbreak.reported, count_asymptomatic)
  tables = _tables(pop, outbreak.reported)
  target_table = pd.DataFrame(dict(pid=np.arange(len(infected)), infected=infected))
  centralized = [os.path.join(out, "centralized", stage) for stage in ("train", "test")]
  _write_stages(*centralized, tables, target_table)
  for folder in centralized:
    files.write_json(files.FILES, os.path.join(folder, "data.json"))
  written = []
  for name in scenarios:
    clients = partition.scenario_clients(name, pop.county_lon, pop.county_lat,
                                         np.bincount(pop.person_county,
                                                     minlength=len(pop.county_lon)))
    if clients is None:
      say(f"{name}: not possible with {profile.counties} counties; skipped")
      continue
    layout = {}
    for client, counties in clients.items():
      part = partition.client_tables(tables, pop, counties)
      persons = part["person_data_path"].pid.to_numpy()
      _write_stages(*(os.path.join(out, name, stage, client)
                      for stage in ("train", "test")),
                    part, target_table.iloc[persons].reset_index(drop=True))
      layout[client] = dict(files.FILES)
    for stage in ("train", "test"):
      files.write_json(layout, os.path.join(out, name, stage, "partitions.json"))
    written.append(name)
  with open(os.path.join(out, "scenarios.txt"), "w") as f:
    f.write("".join(f"{name}\n" for name in written))
  meta = dict(profile=dataclasses.asdict(profile), seed=seed,
              epidemic=dataclasses.asdict(config), final_week_rate=final_week_rate,
              count_asymptomatic=count_asymptomatic, scenarios=written,
              statistics=statistics(pop, outbreak, infected),
              seconds=time.perf_counter() - start)
  meta["files_sha256"] = _digests(out)
  files.write_json(meta, os.path.join(out, "synthetic_meta.json"))
  return meta


def _digests(out: str) -> dict:
  digests = {}
  for root, _, names in sorted(os.walk(out)):
    for name in sorted(names):
      if name == "synthetic_meta.json":
        continue
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        digests[os.path.relpath(path, out)] = hashlib.sha256(f.read()).hexdigest()
  return digests


def statistics(pop: Population, outbreak: epidemic.Outbreak, infected) -> dict:
  """The plausibility figures of PANDEMIC.md 4.5 (4): attack rates, the incidence
  curve, the household secondary attack rate, degrees."""
  reported = outbreak.reported
  n = len(pop.age)
  ever = (reported[:, -1] > 0)
  became_i = (reported == 1).any(axis=1)
  asymptomatic = ever & ~became_i
  runs = (reported == 1).sum(axis=1)[became_i]
  new_i = ((reported[:, 1:] == 1) & (reported[:, :-1] == 0)).sum(axis=0)
  # household secondary attack: infected members of households with an infection,
  # beyond the first infected member
  infected_ever = ever.astype(int)
  per_household = np.bincount(pop.person_hid, weights=infected_ever,
                              minlength=len(pop.household_size))
  touched = per_household > 0
  secondary = (per_household[touched] - 1).sum() / max(
      1, (pop.household_size[touched] - 1).sum())
  degree = 2 * len(pop.contacts) / n
  home_hours = pop.contacts.duration[pop.contacts.activity1 == 1].sum()
  return dict(
      persons=n, households=len(pop.household_size), contacts=len(pop.contacts),
      mean_degree=degree, home_share_of_contact_hours=float(
          home_hours / max(1, pop.contacts.duration.sum())),
      ever_infected_by_day_63=float(ever.mean()),
      final_week_positive_rate=float(np.mean(infected)),
      positives=int(np.sum(infected)),
      asymptomatic_share=float(asymptomatic.sum() / max(1, ever.sum())),
      mean_i_days=float(runs.mean()) if len(runs) else math.nan,
      max_i_days=int(runs.max()) if len(runs) else 0,
      household_secondary_attack_rate=float(secondary),
      daily_new_i=[int(v) for v in new_i],
      seeds=int(len(outbreak.seeds)))
