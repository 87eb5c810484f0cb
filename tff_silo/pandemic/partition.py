"""The official partition rules (`../shared/PANDEMIC.md` 1.4, the DrivenData
partitioning notebook): counties are grouped into clients; a person belongs to the
client of their household's county; a client gets every residence in its counties
and every location its residents visit; a contact is kept only if both persons
live in the client.

Scenarios: scenario01, three clients by county centroid (lat >= 38.5; else
lon < -77.5; else the rest); scenario02, ten clients of randomly grouped counties
(seed 8); scenario03, two clients whose sizes differ more than tenfold (the
smallest counties against the rest).
"""

from __future__ import annotations

import numpy as np

SCENARIOS = ("scenario01", "scenario02", "scenario03")


def official_regions(lon, lat) -> np.ndarray:
  """Each county's region of the official three-way partition (scenario01), by its
  centroid: 0 where lat >= 38.5, else 1 where lon < -77.5, else 2."""
  return np.where(np.asarray(lat) >= 38.5, 0, np.where(np.asarray(lon) < -77.5, 1, 2))


def scenario_clients(name: str, lon, lat, county_persons):
  """client name -> county indices of scenario `name` (None where the counties
  cannot form it: fewer counties than clients, or no tenfold split)."""
  k = len(lon)
  if name == "scenario01":
    group = official_regions(lon, lat)
    groups = [np.flatnonzero(group == g) for g in range(3)]
  elif name == "scenario02":
    if k < 10:
      return None
    groups = np.array_split(np.random.default_rng(8).permutation(k), 10)
  elif name == "scenario03":
    order = np.argsort(county_persons, kind="stable")
    small = np.cumsum(county_persons[order]) * 11 < county_persons.sum()
    if not small.any():
      return None
    groups = [order[~small], order[small]]
  else:
    raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")
  groups = [np.sort(g) for g in groups if len(g)]
  if len(groups) < 2:
    return None
  return {f"client{i + 1:02d}": g for i, g in enumerate(groups)}


def client_tables(tables: dict, pop, counties) -> dict:
  """The seven tables of the client made of `counties` (indices), from the full
  ones (`synth._tables`)."""
  persons = np.flatnonzero(np.isin(pop.person_county, counties))
  member = np.zeros(len(pop.age), bool)
  member[persons] = True
  person = tables["person_data_path"]
  households = np.unique(pop.person_hid[persons])
  assignments = tables["activity_location_assignment_data_path"]
  visits = assignments[member[assignments.pid.to_numpy()]]
  residences = tables["residence_location_data_path"]
  codes = pop.county_code[counties]
  visited = set(visits.lid.to_numpy().tolist())
  in_client = residences.admin2.isin(codes) | residences.rlid.isin(visited)
  places = tables["activity_location_data_path"]
  network = tables["population_network_data_path"]
  both = member[network.pid1.to_numpy()] & member[network.pid2.to_numpy()]
  outcome = tables["disease_outcome_data_path"]
  return {
      "person_data_path": person[member[person.pid.to_numpy()]].reset_index(drop=True),
      "household_data_path": tables["household_data_path"].iloc[households].reset_index(
          drop=True),
      "residence_location_data_path": residences[in_client].reset_index(drop=True),
      "activity_location_data_path": places[places.alid.isin(visited)].reset_index(
          drop=True),
      "activity_location_assignment_data_path": visits.reset_index(drop=True),
      "population_network_data_path": network[both].reset_index(drop=True),
      "disease_outcome_data_path": outcome[member[outcome.pid.to_numpy()]].reset_index(
          drop=True),
  }
