"""The challenge's files (`../shared/PANDEMIC.md` 3): names, columns, the folder
layout, deterministic writing, and reading with one-line errors.

Layout under a data folder:
  scenarios.txt                              one scenario name per line
  centralized/{train,test}/data.json         argument name -> file name
  centralized/{train,test}/<the seven tables>, test/predictions_format.csv
  scenarioNN/{train,test}/partitions.json    {"client01": {argument: file}, ...}
  scenarioNN/{train,test}/clientXX/<the seven tables> (+ test: predictions_format.csv)
The scoring target `va_disease_outcome_target.csv.gz` sits beside
`predictions_format.csv` in every test folder (the challenge held it out; no loader
of features reads it).
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pandas as pd

# argument name (the runtime's client factory) -> file name
FILES = {
    "person_data_path": "va_person.csv.gz",
    "household_data_path": "va_household.csv.gz",
    "residence_location_data_path": "va_residence_locations.csv.gz",
    "activity_location_data_path": "va_activity_locations.csv.gz",
    "activity_location_assignment_data_path": "va_activity_location_assignment.csv.gz",
    "population_network_data_path": "va_population_network.csv.gz",
    "disease_outcome_data_path": "va_disease_outcome_training.csv.gz",
}
TARGET = "va_disease_outcome_target.csv.gz"
PREDICTIONS_FORMAT = "predictions_format.csv"

# Columns a loader needs, in the order the generator writes them (the network's
# order is positional in the authors' loader; the others are read by name).
COLUMNS = {
    "person_data_path": ("hid", "pid", "person_number", "age", "sex"),
    "household_data_path": ("hid", "rlid", "admin1", "admin2", "hh_size"),
    "residence_location_data_path": ("rlid", "longitude", "latitude", "admin1", "admin2"),
    "activity_location_data_path": ("alid", "longitude", "latitude", "work", "shopping",
                                    "school", "other", "college", "religion"),
    "activity_location_assignment_data_path": ("hid", "pid", "activity_number",
                                               "activity_type", "start_time", "duration",
                                               "lid"),
    "population_network_data_path": ("pid1", "pid2", "lid", "start_time", "duration",
                                     "activity1", "activity2"),
    "disease_outcome_data_path": ("pid", "day", "state"),
}
# Columns a file must have (the others the generator writes follow UVA's format and
# are not confirmed for the challenge files: PANDEMIC.md 3.2).
REQUIRED = dict(COLUMNS, activity_location_assignment_data_path=(
    "pid", "activity_type", "duration", "lid"))
TRAINING_DAYS = 57           # days 0..56 in the training outcome table
PREDICTION_DAYS = 7          # days 57..63 are predicted
RESIDENCE_LID_BASE = 1_000_000_000   # rlid > 1e9 >= alid
ACTIVITY_TYPES = {1: "home", 2: "work", 3: "shopping", 4: "other", 5: "school",
                  6: "college", 7: "religion"}
LOCATION_FLAGS = ("work", "shopping", "school", "other", "college", "religion")
STATES = ("S", "I", "R")


class DataError(ValueError):
  """A file that does not hold what the layout says; the message names it."""


def write_csv_gz(table: pd.DataFrame, path: str) -> None:
  """A gzip CSV with a header, no index, floats as %.6f, gzip mtime 0 (level 3):
  the same table gives the same bytes."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  text = table.to_csv(index=False, float_format="%.6f", lineterminator="\n")
  with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                               mtime=0, compresslevel=3) as f:
    f.write(text.encode())


def write_csv(table: pd.DataFrame, path: str) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", newline="") as f:
    table.to_csv(f, index=False, float_format="%.6f", lineterminator="\n")


def write_json(value, path: str) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=1, sort_keys=True)
    f.write("\n")


def read_table(path: str, argument: str) -> pd.DataFrame:
  """The table `argument` names, read from `path`; DataError (naming the file) when
  it is missing, unreadable or lacks a required column."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: missing ({argument})")
  try:   # states as a category: the outcome panel has 57 rows per person
    table = pd.read_csv(path, dtype={"state": "category"})
  except (OSError, ValueError, EOFError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot be read as a CSV ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''})") from None
  missing = [c for c in REQUIRED[argument] if c not in table.columns]
  if missing:
    raise DataError(f"{path}: lacks column(s) {', '.join(missing)} (has "
                    f"{', '.join(map(str, table.columns))})")
  if argument == "population_network_data_path" and tuple(
      table.columns[:7]) != COLUMNS[argument]:
    raise DataError(f"{path}: the columns must be {', '.join(COLUMNS[argument])} in this "
                    "order (the contact features are read by position)")
  return table


def client_files(folder: str) -> dict:
  """argument -> path of a client (or centralized) folder's seven tables."""
  return {argument: os.path.join(folder, name) for argument, name in FILES.items()}


def read_scenario(data_dir: str, scenario: str, stage: str = "train") -> dict:
  """client name -> its argument -> path, from `partitions.json` (`centralized`:
  one client of that name, from `data.json`)."""
  folder = os.path.join(data_dir, scenario, stage)
  name = "data.json" if scenario == "centralized" else "partitions.json"
  path = os.path.join(folder, name)
  if not os.path.isfile(path):
    raise DataError(f"{path}: missing (the {scenario} {stage} layout)")
  try:
    with open(path) as f:
      layout = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise DataError(f"{path}: not JSON ({e})") from None
  if scenario == "centralized":
    layout = {"centralized": layout}
  clients = {}
  for client, files in sorted(layout.items()):
    base = folder if scenario == "centralized" else os.path.join(folder, client)
    unknown = sorted(set(FILES) - set(files))
    if unknown:
      raise DataError(f"{path}: {client} lacks {', '.join(unknown)}")
    clients[client] = {a: os.path.join(base, files[a]) for a in FILES}
  return clients


def states_to_codes(states) -> np.ndarray:
  """'S', 'I', 'R' -> 0, 1, 2 (int8); DataError-free: callers check the values."""
  codes = np.full(len(states), -1, np.int8)
  values = np.asarray(states).astype(str)
  for code, name in enumerate(STATES):
    codes[values == name] = code
  return codes

