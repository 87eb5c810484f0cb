"""A client's files as per-node tables: the contact graph, node features, the
1-hop neighbour sample and contact features (`../shared/PANDEMIC.md` 2.1-2.5).

Everything is vectorized (numpy, scipy.sparse) and memory-light: per node a few
static features, the 57-day state history, S1 neighbour indices and their contact
features; the 1,671-float example vectors are built per batch from these tables
(`features`), never for all n at once.

Two modes:
  faithful  the authors' pipeline: degree (parallel edges counted) and undirected
            PageRank on the whole local graph, min-max scaled; age standardized and
            household size Box-Cox'ed with statistics fitted over the silo's persons,
            place coordinates over its places; each node keeps a random S1 of its
            incident edge slots (parallel edges repeat); placeholders carry the
            authors' contact-feature quirk (start and duration -1/86400, the
            smallest lid's location). A node's own neighbourhood is capped, not the
            number of others it appears in.
  honest    a true degree cap: parallel edges collapsed, edges taken in a seeded
            random order and kept iff both endpoints have fewer than S1 kept edges
            (the greedy of PANDEMIC.md 2.10, computed in rounds that make the same
            decisions), so every node lies in at most S1 + 1 examples
            (`max_neighbourhoods`, measured and checked). A person's features are
            computed from its own records and public constants only (`AGE_CENTER`,
            log household size, coordinates on `VIRGINIA`'s scale), and the
            centralities are zero (a neighbour's degree or PageRank changes with
            nodes two hops away): removing or changing one node of the capped graph
            changes its own example and its kept neighbours' (tests/
            test_pandemic_data.py). The cap itself reads every person's contacts:
            removing a person's contacts can let other edges survive it, so the
            capping lies outside the node-level guarantee, whose unit is a node of
            the capped graph (`pipeline`). The household size is the household
            record's `hh_size`, a fixed attribute of the household (in the
            generator, the size it was drawn with), not counted from its persons
            in the files: removing a person leaves the other members'
            records, `hh_size` included, unchanged, so it is part of each member's
            own record under the node-level relation, not computed from others.

Randomness is the node's own: an edge's place in the greedy order, a neighbour's
slot and a person's training window are hashes of the seed and the persons' ids
(`hashed_uniform`), so removing one person reorders nothing else. `part` keeps the
training persons or the held-out ones (`held_out`: a public split of households, the
same for every seed and method), each as the subgraph of their own contacts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from scipy import sparse, stats

from tff_silo.pandemic import files
from tff_silo.pandemic.choices import MODES
from tff_silo.pandemic.files import DataError

PARTS = ("all", "train", "held_out")
D_CENTRALITY, D_PERSONAL, D_EDGE, WINDOW = 2, 8, 10, 21
D_STATIC = D_CENTRALITY + D_PERSONAL
D_NODE = D_STATIC + 3 * WINDOW          # 73
OUT_OF_HOME = (2, 3, 5, 6)              # work, shopping, school, college
# honest mode's public constants in place of statistics fitted over the persons:
AGE_CENTER, AGE_SCALE = 38.0, 23.0      # about the US population's age mean and sd
VIRGINIA = dict(longitude=(-78.7, 1.8), latitude=(37.9, 0.8))   # centre, half-extent
# the held-out persons: households whose hashed hid falls below this (public rule)
HELD_OUT_FRACTION = 0.25
_HELD_OUT_SALT, _EDGE_SALT, _SLOT_SALT = 43, 31, 37


def hashed_uniform(seed: int, salt: int, *ids) -> np.ndarray:
  """One number in [0, 1) per row of the integer arrays `ids`, a function of (seed,
  salt, that row) alone: splitmix64's finalizer chained over the ids."""
  def mix(z):
    z = (z + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(2 ** 64 - 1)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
  with np.errstate(over="ignore"):
    shape = np.broadcast(*ids).shape if ids else ()
    h = mix(np.full(shape, np.uint64(int(seed) & (2 ** 64 - 1))) ^ np.uint64(salt))
    for column in ids:
      h = mix(h ^ np.asarray(column).astype(np.int64).astype(np.uint64))
  return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def held_out(hids) -> np.ndarray:
  """Whether each household is held out (its persons' labels and records never
  enter training): a public rule of the hid alone."""
  return hashed_uniform(0, _HELD_OUT_SALT, hids) < HELD_OUT_FRACTION


@dataclasses.dataclass(frozen=True)
class ClientGraph:
  """One client's per-node tables (node i is the i-th smallest pid)."""
  pids: np.ndarray           # [n] int64
  static: np.ndarray         # [n, 10] float32: degree, PageRank, 8 personal features
  history: np.ndarray        # [n, 57] int8: 0 S, 1 I, 2 R on days 0..56
  neighbours: np.ndarray     # [n, S1] int32 node indices, -1 padding
  contact_time: np.ndarray   # [n, S1, 2] float32: start, duration (fractions of a day)
  contact_place: np.ndarray  # [n, S1] int32 row of `places`
  places: np.ndarray         # [L, 8] float32: longitude, latitude (standardized), flags
  mode: str
  max_neighbourhoods: int    # the most examples any node lies in (own included)

  @property
  def num_nodes(self) -> int:
    return len(self.pids)

  @property
  def sample_size(self) -> int:
    return self.neighbours.shape[1]


def _index(pids_table, column_values, path, what):
  """Node indices of `column_values` (pids); DataError naming the file for a pid
  not among the client's persons."""
  lookup = np.full(int(pids_table.max()) + 2, -1, np.int64)
  lookup[pids_table] = np.arange(len(pids_table))
  values = np.asarray(column_values, np.int64)
  bad = (values < 0) | (values > pids_table.max())
  idx = np.where(bad, -1, lookup[np.clip(values, 0, len(lookup) - 1)])
  if (idx < 0).any():
    raise DataError(f"{path}: {what} with an unknown pid "
                    f"({int(values[np.flatnonzero(idx < 0)[0]])}; not in the person file)")
  return idx


def _person_features(tables, paths, n, idx_of, mode):
  """[n, 8]: age (standardized), sex - 1.5, Box-Cox(household size), worked,
  schooled, shopped, home-only (each +-0.5) and out-of-home time (days). Honest
  mode: age on public constants and log(household size) (Box-Cox at lambda 0)."""
  person = tables["person_data_path"]
  household = tables["household_data_path"].drop_duplicates("hid").set_index("hid")
  missing = ~person.hid.isin(household.index)
  if missing.any():
    raise DataError(f"{paths['household_data_path']}: no household "
                    f"{int(person.hid[missing].iloc[0])} of a person in "
                    f"{paths['person_data_path']}")
  age = person.age.to_numpy(np.float64)
  size = household.loc[person.hid, "hh_size"].to_numpy(np.float64)
  if mode == "honest":
    boxed = np.log(np.maximum(size, 1.0))
    age = (age - AGE_CENTER) / AGE_SCALE
  else:
    boxed = (stats.boxcox(size)[0] if len(np.unique(size)) > 1 and size.min() > 0
             else np.zeros(n))
    age = (age - age.mean()) / (age.std() if age.std() > 0 else 1.0)
  visits = tables["activity_location_assignment_data_path"]
  node = idx_of(visits.pid, paths["activity_location_assignment_data_path"],
                "an activity")
  kind = visits.activity_type.to_numpy()
  ever = lambda codes: np.bincount(node[np.isin(kind, codes)], minlength=n) > 0
  away = np.bincount(node[kind != 1], minlength=n) > 0
  out_time = np.bincount(node, weights=np.where(np.isin(kind, OUT_OF_HOME),
                                                visits.duration.to_numpy(), 0.0),
                         minlength=n) / 86_400
  return np.stack([age, person.sex.to_numpy(np.float64) - 1.5, boxed,
                   ever([2]) - 0.5, ever([5, 6]) - 0.5, ever([3]) - 0.5,
                   (~away) - 0.5, out_time], 1)


def _history(table, pids, path) -> np.ndarray:
  """[n, 57] int8 states; DataError for a missing day, pid or state."""
  days = files.TRAINING_DAYS
  codes = files.states_to_codes(table.state)
  if (codes < 0).any():
    raise DataError(f"{path}: state {table.state[codes < 0].iloc[0]!r} is not S, I or R")
  day = table.day.to_numpy()
  present = np.unique(day)
  missing = sorted(set(range(days)) - set(present.tolist()))
  if missing:
    raise DataError(f"{path}: day {missing[0]} is missing (days 0..{days - 1} are "
                    "expected for every person)")
  lookup = pd.Index(pids)
  node = lookup.get_indexer(table.pid.to_numpy())
  keep = (day >= 0) & (day < days)
  if (node[keep] < 0).any():
    raise DataError(f"{path}: an outcome row with an unknown pid "
                    f"({int(table.pid[keep & (node < 0)].iloc[0])})")
  history = np.full((len(pids), days), -1, np.int8)
  history[node[keep], day[keep]] = codes[keep]
  if (history < 0).any():
    person, when = np.argwhere(history < 0)[0]
    raise DataError(f"{path}: no state for pid {int(pids[person])} on day {int(when)}")
  return history


def _places(tables, paths, mode):
  """(lid -> row lookup, [L, 8] place features): residences then activity
  locations; coordinates standardized over the client's places (honest mode: on
  Virginia's public centre and extent)."""
  res = tables["residence_location_data_path"]
  act = tables["activity_location_data_path"]
  missing = [f for f in files.LOCATION_FLAGS if f not in act.columns]
  if missing:
    raise DataError(f"{paths['activity_location_data_path']}: lacks {', '.join(missing)}")
  lids = np.concatenate([act.alid.to_numpy(), res.rlid.to_numpy()]).astype(np.int64)
  coords = np.concatenate([act[["longitude", "latitude"]].to_numpy(np.float64),
                           res[["longitude", "latitude"]].to_numpy(np.float64)])
  if mode == "honest":
    centre, scale = np.array(list(VIRGINIA.values())).T
  else:
    centre, scale = coords.mean(0), np.where(coords.std(0) > 0, coords.std(0), 1.0)
  coords = (coords - centre) / scale
  flags = np.concatenate([act[list(files.LOCATION_FLAGS)].to_numpy(np.float64),
                          np.zeros((len(res), len(files.LOCATION_FLAGS)))])
  order = np.argsort(lids, kind="stable")
  return lids[order], np.concatenate([coords, flags], 1)[order].astype(np.float32)


def _place_rows(sorted_lids, lid, path):
  row = np.searchsorted(sorted_lids, lid)
  row = np.minimum(row, len(sorted_lids) - 1)
  bad = sorted_lids[row] != lid
  if bad.any():
    raise DataError(f"{path}: a contact at an unknown location "
                    f"(lid {int(np.asarray(lid)[bad][0])})")
  return row


def _centrality(a, b, n) -> np.ndarray:
  """[n, 2]: total degree (parallel edges counted) and undirected PageRank (damping
  0.85, dangling mass spread evenly), each min-max scaled."""
  adjacency = sparse.coo_matrix((np.ones(2 * len(a)), (np.r_[a, b], np.r_[b, a])),
                                shape=(n, n)).tocsr()
  degree = np.asarray(adjacency.sum(1)).ravel()
  rank = np.full(n, 1.0 / n)
  inverse = np.where(degree > 0, 1.0 / np.maximum(degree, 1), 0.0)
  for _ in range(200):
    dangling = rank[degree == 0].sum()
    new = 0.15 / n + 0.85 * (adjacency.T @ (rank * inverse) + dangling / n)
    done = np.abs(new - rank).sum() < 1e-10
    rank = new
    if done:
      break
  scale = lambda v: (v - v.min()) / (v.max() - v.min()) if v.max() > v.min() else 0 * v
  return np.stack([scale(degree), scale(rank)], 1)


def degree_cap(a, b, cap: int, priority) -> np.ndarray:
  """Indices of the undirected edges (a, b) (no parallel ones) the greedy keeps
  when it visits them by increasing `priority` (one number per edge), keeping an
  edge iff both ends have fewer than `cap` kept edges. Computed in rounds: an edge
  whose rank among each end's undecided edges is below that end's remaining
  capacity is kept (the greedy keeps it whatever it decides before), edges at full
  nodes are dropped."""
  n = int(max(a.max(initial=-1), b.max(initial=-1))) + 1
  order = np.argsort(priority, kind="stable")
  a, b = a[order], b[order]   # greedy order
  capacity = np.full(n, cap, np.int64)
  open_ = np.arange(len(a))
  kept = []

  def ranks(ea, eb):
    """Each open edge's rank among all open edges at its a end and at its b end."""
    ends, ids = np.r_[ea, eb], np.r_[open_, open_]
    by = np.lexsort((ids, ends))   # per node, in greedy order
    r = np.empty(len(ends), np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(ends[by])) + 1]
    r[by] = np.arange(len(by)) - np.repeat(starts, np.diff(np.r_[starts, len(by)]))
    return r[:len(ea)], r[len(ea):]

  while len(open_):
    ea, eb = a[open_], b[open_]
    rank_a, rank_b = ranks(ea, eb)
    accept = (rank_a < capacity[ea]) & (rank_b < capacity[eb])
    chosen = open_[accept]
    kept.append(chosen)
    np.subtract.at(capacity, a[chosen], 1)
    np.subtract.at(capacity, b[chosen], 1)
    rest = open_[~accept]
    open_ = rest[(capacity[a[rest]] > 0) & (capacity[b[rest]] > 0)]
  return np.sort(order[np.concatenate(kept)]) if kept else np.zeros(0, np.int64)


def _sample(a, b, pids, s1, seed, mode):
  """(neighbours [n, S1], the edge of each slot [n, S1], -1 padding). The greedy's
  order and each node's slot order are hashes of the persons' ids."""
  n = len(pids)
  if mode == "honest":
    low, high = np.minimum(a, b), np.maximum(a, b)
    _, first = np.unique(low * n + high, return_index=True)
    first = first[low[first] != high[first]]   # no self-contacts
    priority = hashed_uniform(seed, _EDGE_SALT, pids[low[first]], pids[high[first]])
    edges = first[degree_cap(a[first], b[first], s1, priority)]
  else:
    edges = np.arange(len(a))
  node = np.r_[a[edges], b[edges]]
  other = np.r_[b[edges], a[edges]]
  edge = np.r_[edges, edges]
  # parallel edges (faithful mode) tell their slots apart by their row
  key = hashed_uniform(seed, _SLOT_SALT, pids[node], pids[other],
                       edge * (mode != "honest"))
  order = np.lexsort((key, node))
  node, other, edge = node[order], other[order], edge[order]
  starts = np.r_[0, np.flatnonzero(np.diff(node)) + 1]
  slot = np.arange(len(node)) - np.repeat(starts, np.diff(np.r_[starts, len(node)]))
  keep = slot < s1
  neighbours = np.full((n, s1), -1, np.int32)
  slots = np.full((n, s1), -1, np.int64)
  neighbours[node[keep], slot[keep]] = other[keep]
  slots[node[keep], slot[keep]] = edge[keep]
  return neighbours, slots


def read_client(paths: dict) -> dict:
  """A client's seven tables (`files.client_files`, or a scenario's
  `files.read_scenario`), persons sorted by pid, checked; DataError in one line
  naming the file and the problem."""
  tables = {argument: files.read_table(path, argument) for argument, path in paths.items()}
  person = tables["person_data_path"].sort_values("pid").reset_index(drop=True)
  if person.pid.duplicated().any() or (person.pid < 0).any():
    raise DataError(f"{paths['person_data_path']}: pids must be distinct non-negative "
                    "integers")
  tables["person_data_path"] = person
  return tables


def _part(tables: dict, part: str) -> dict:
  """The tables of the persons of `part` and of their contacts with each other."""
  if part == "all":
    return tables
  person = tables["person_data_path"]
  keep = held_out(person.hid.to_numpy()) == (part == "held_out")
  pids = person.pid[keep]
  out = dict(tables, person_data_path=person[keep].reset_index(drop=True))
  for argument in ("activity_location_assignment_data_path", "disease_outcome_data_path"):
    table = tables[argument]
    out[argument] = table[table.pid.isin(pids)]
  network = tables["population_network_data_path"]
  out["population_network_data_path"] = network[network.pid1.isin(pids)
                                                & network.pid2.isin(pids)]
  return out


def load_client(paths: dict, *, sample_size: int = 20, mode: str = "honest",
                seed: int = 0, part: str = "all", tables: dict = None) -> ClientGraph:
  """A client's per-node tables from its seven files (or their `read_client`
  `tables`): every person, the training ones or the held-out ones (`part`), with
  their contacts among themselves; DataError in one line naming a bad file."""
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  if part not in PARTS:
    raise ValueError(f"part must be one of {PARTS}, got {part!r}")
  if int(sample_size) != sample_size or sample_size < 1:
    raise ValueError(f"sample_size (S1) must be a positive integer, got {sample_size}")
  tables = _part(read_client(paths) if tables is None else tables, part)
  person = tables["person_data_path"]
  pids = person.pid.to_numpy(np.int64)
  n = len(pids)
  if n == 0:
    raise DataError(f"{paths['person_data_path']}: no persons ({part})")
  idx_of = lambda values, path, what: _index(pids, values, path, what)
  personal = _person_features(tables, paths, n, idx_of, mode)
  history = _history(tables["disease_outcome_data_path"], pids,
                     paths["disease_outcome_data_path"])
  network = tables["population_network_data_path"]
  path = paths["population_network_data_path"]
  a = idx_of(network.pid1, path, "a contact")
  b = idx_of(network.pid2, path, "a contact")
  lids, places = _places(tables, paths, mode)
  rows = _place_rows(lids, network.lid.to_numpy(np.int64), path)
  centrality = (_centrality(a, b, n) if mode == "faithful" else np.zeros((n, 2)))
  neighbours, slots = _sample(a, b, pids, sample_size, seed, mode)
  valid = slots >= 0
  edge = np.where(valid, slots, 0)
  time = np.stack([network.start_time.to_numpy(np.float64)[edge],
                   network.duration.to_numpy(np.float64)[edge]], -1) / 86_400
  place = rows[edge]
  if mode == "faithful":   # the authors' placeholders: -1 / 86400, the smallest lid
    time = np.where(valid[..., None], time, -1.0 / 86_400)
    place = np.where(valid, place, 0)
  else:
    time = np.where(valid[..., None], time, 0.0)
    place = np.where(valid, place, -1)
  appearances = 1 + np.bincount(neighbours[valid], minlength=n)
  most = int(appearances.max(initial=1))
  if mode == "honest" and most > sample_size + 1:
    raise AssertionError(f"the degree cap failed: a node lies in {most} examples")
  return ClientGraph(pids, np.concatenate([centrality, personal], 1).astype(np.float32),
                     history, neighbours, time.astype(np.float32),
                     place.astype(np.int32), places, mode, most)
