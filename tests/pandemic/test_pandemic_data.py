"""The synthetic pandemic data (`tff_silo.pandemic.synth`): the challenge's schema,
cross-table integrity, the partition rules, byte-reproducibility and a plausible
outbreak; the loader on generated files and on a hand-written file set; the degree
cap; bad files end in one line naming the file."""

import os

import numpy as np
import pandas as pd
import pytest

from tff_silo.pandemic import epidemic, files, graph, partition, synth
from tff_silo.pandemic.files import DataError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("pandemic"))
  meta = synth.generate(out, "tiny", seed=0, final_week_rate=0.01)
  return out, meta


def _read(folder, argument):
  return pd.read_csv(os.path.join(folder, files.FILES[argument]))


def test_every_file_has_the_challenge_columns_and_the_tables_agree(tiny):
  out, meta = tiny
  folder = os.path.join(out, "centralized", "train")
  tables = {a: _read(folder, a) for a in files.FILES}
  for argument, table in tables.items():
    assert tuple(table.columns) == files.COLUMNS[argument], argument
  person, household = tables["person_data_path"], tables["household_data_path"]
  n = meta["profile"]["persons"]
  assert list(person.pid) == list(range(n)) and set(person.sex) <= {1, 2}
  assert person.hid.isin(household.hid).all()
  assert (person.groupby("hid").size() == household.set_index("hid").hh_size).all()
  assert household.rlid.isin(tables["residence_location_data_path"].rlid).all()
  assert (tables["residence_location_data_path"].rlid > files.RESIDENCE_LID_BASE).all()
  places = tables["activity_location_data_path"]
  assert places.alid.min() == 1 and places.alid.max() < files.RESIDENCE_LID_BASE
  assert (places[list(files.LOCATION_FLAGS)].sum(1) == 1).all()
  visits = tables["activity_location_assignment_data_path"]
  lids = set(places.alid) | set(tables["residence_location_data_path"].rlid)
  assert visits.lid.isin(lids).all() and set(visits.pid) == set(range(n))
  assert visits.activity_type.between(1, 7).all() and (visits.start_time < 86_400).all()
  network = tables["population_network_data_path"]
  assert network.pid1.isin(person.pid).all() and network.pid2.isin(person.pid).all()
  assert network.lid.isin(lids).all() and (network.duration > 0).all()
  assert network.activity1.between(1, 7).all() and (network.pid1 != network.pid2).all()
  pairs = np.sort(network[["pid1", "pid2"]].to_numpy(), 1)
  assert len(np.unique(pairs, axis=0)) == len(pairs)   # each contact once
  outcome = tables["disease_outcome_data_path"]
  assert len(outcome) == n * 57 and set(outcome.state) <= set("SIR")
  assert (outcome.day.to_numpy() == np.repeat(np.arange(57), n)).all()
  assert (outcome.pid.to_numpy() == np.tile(np.arange(n), 57)).all()
  test = os.path.join(out, "centralized", "test")
  target = pd.read_csv(os.path.join(test, files.TARGET))
  assert list(target.columns) == ["pid", "infected"] and len(target) == n
  assert list(pd.read_csv(os.path.join(test, files.PREDICTIONS_FORMAT)).columns) == [
      "pid", "score"]


def test_the_partition_rules_hold(tiny):
  out, meta = tiny
  assert "scenario01" in meta["scenarios"] and "scenario02" not in meta["scenarios"]
  assert sorted(files.read_scenario(out, "scenario01", "train")) == [
      "client01", "client02", "client03"]   # 3 counties: no ten clients
  for scenario in meta["scenarios"]:
    _check_partition(out, scenario, meta["profile"]["persons"])


def _check_partition(out, scenario, num_persons):
  clients = files.read_scenario(out, scenario, "train")
  persons = []
  for name, paths in clients.items():
    mine = set(pd.read_csv(paths["person_data_path"]).pid)
    persons.append(mine)
    network = pd.read_csv(paths["population_network_data_path"])
    assert network.pid1.isin(mine).all() and network.pid2.isin(mine).all()
    outcome = pd.read_csv(paths["disease_outcome_data_path"])
    assert set(outcome.pid) == mine and len(outcome) == 57 * len(mine)
    test = os.path.join(out, scenario, "test", name)
    for argument in files.FILES:   # train and test feature files are identical
      with open(paths[argument], "rb") as a, open(os.path.join(
          test, files.FILES[argument]), "rb") as b:
        assert a.read() == b.read()
    assert set(pd.read_csv(os.path.join(test, files.PREDICTIONS_FORMAT)).pid) == mine
  assert sum(map(len, persons)) == num_persons
  assert not set.intersection(*persons)


def test_generation_is_byte_reproducible(tiny, tmp_path):
  out, meta = tiny
  again = synth.generate(str(tmp_path / "a"), "tiny", seed=0, final_week_rate=0.01)
  assert again["files_sha256"] == meta["files_sha256"]
  other = synth.generate(str(tmp_path / "b"), "tiny", seed=1, final_week_rate=0.01)
  assert other["files_sha256"] != meta["files_sha256"]
  with open(os.path.join(out, "centralized", "train", files.FILES["person_data_path"]),
            "rb") as f:
    assert f.read()[4:8] == b"\0\0\0\0"   # gzip mtime 0


def test_the_outbreak_is_plausible(tiny):
  out, meta = tiny
  stats = meta["statistics"]
  outcome = _read(os.path.join(out, "centralized", "train"), "disease_outcome_data_path")
  states = files.states_to_codes(outcome.state).reshape(57, -1).T
  assert (np.diff(states, axis=1) >= 0).all()   # S* I* R* or S* R*, never back
  assert 0.2 <= stats["asymptomatic_share"] <= 0.5
  assert 3 <= stats["mean_i_days"] <= 8 and stats["max_i_days"] <= 14
  assert 0.05 <= stats["ever_infected_by_day_63"] <= 0.5
  assert stats["final_week_positive_rate"] == pytest.approx(0.01, rel=0.5)
  assert 20 <= stats["mean_degree"] <= 60


def test_a_contact_heuristic_beats_random(tiny):
  """Learnability: 'a contact was infectious in the last 7 days' ranks the final
  week's positives above the positive rate (PANDEMIC.md 4.5, 5)."""
  from sklearn.metrics import average_precision_score
  out, _ = tiny
  folder = os.path.join(out, "centralized", "train")
  outcome = _read(folder, "disease_outcome_data_path")
  states = files.states_to_codes(outcome.state).reshape(57, -1).T
  network = _read(folder, "population_network_data_path")
  infectious = (states[:, 50:57] == 1).any(1).astype(float)
  exposure = (np.bincount(network.pid1, infectious[network.pid2], len(states))
              + np.bincount(network.pid2, infectious[network.pid1], len(states)))
  target = pd.read_csv(os.path.join(out, "centralized", "test", files.TARGET)).infected
  ap = average_precision_score(target, exposure * (states[:, 56] == 0))
  assert ap > 2 * target.mean()


def _greedy(a, b, cap, priority):
  order = np.argsort(priority, kind="stable")
  count, kept = {}, []
  for e in order:
    if count.get(a[e], 0) < cap and count.get(b[e], 0) < cap:
      count[a[e]] = count.get(a[e], 0) + 1
      count[b[e]] = count.get(b[e], 0) + 1
      kept.append(e)
  return np.sort(kept)


@pytest.mark.parametrize("nodes, edges, cap", [(50, 400, 3), (200, 3000, 7), (30, 60, 1)])
def test_the_degree_cap_is_the_sequential_greedy(nodes, edges, cap):
  rng = np.random.default_rng(nodes)
  pairs = np.unique(np.sort(rng.integers(0, nodes, (edges, 2)), 1), axis=0)
  a, b = pairs[pairs[:, 0] != pairs[:, 1]].T
  priority = graph.hashed_uniform(5, 31, a, b)
  kept = graph.degree_cap(a, b, cap, priority)
  np.testing.assert_array_equal(kept, _greedy(a, b, cap, priority))
  assert np.bincount(np.r_[a[kept], b[kept]]).max() <= cap


def test_generated_clients_load_in_both_modes(tiny):
  out, _ = tiny
  paths = files.read_scenario(out, "centralized")["centralized"]
  honest = graph.load_client(paths, sample_size=20, mode="honest")
  faithful = graph.load_client(paths, sample_size=20, mode="faithful")
  assert honest.max_neighbourhoods <= 21 < faithful.max_neighbourhoods
  assert (honest.static[:, :2] == 0).all() and faithful.static[:, :2].max() == 1.0
  for g in (honest, faithful):
    assert g.static.shape == (2000, 10) and np.isfinite(g.static).all()
    assert g.history.shape == (2000, 57) and g.neighbours.shape == (2000, 20)
  # faithful placeholders carry the authors' quirk, honest ones nothing
  empty = faithful.neighbours < 0
  assert np.allclose(faithful.contact_time[empty], -1 / 86_400)
  assert (honest.contact_place[honest.neighbours < 0] == -1).all()


def _write_tiny_set(folder):
  """Four persons in two households, three contacts, 57 days."""
  tables = {
      "person_data_path": pd.DataFrame(dict(hid=[0, 0, 1, 1], pid=[10, 11, 12, 13],
                                            person_number=[1, 2, 1, 2],
                                            age=[40, 38, 70, 8], sex=[1, 2, 2, 1])),
      "household_data_path": pd.DataFrame(dict(hid=[0, 1], rlid=[1_000_000_001,
                                                                 1_000_000_002],
                                               admin1=51, admin2=[1, 3], hh_size=[2, 2])),
      "residence_location_data_path": pd.DataFrame(dict(
          rlid=[1_000_000_001, 1_000_000_002], longitude=[-77.0, -78.0],
          latitude=[38.0, 37.0], admin1=51, admin2=[1, 3])),
      "activity_location_data_path": pd.DataFrame(dict(
          alid=[1], longitude=[-77.5], latitude=[37.5], work=[1], shopping=[0],
          school=[0], other=[0], college=[0], religion=[0])),
      "activity_location_assignment_data_path": pd.DataFrame(dict(
          hid=[0, 0, 0, 1, 1], pid=[10, 10, 11, 12, 13], activity_number=[1, 2, 1, 1, 1],
          activity_type=[1, 2, 1, 1, 1], start_time=[0, 28_800, 0, 0, 0],
          duration=[28_800, 43_200, 86_400, 86_400, 86_400],
          lid=[1_000_000_001, 1, 1_000_000_001, 1_000_000_002, 1_000_000_002])),
      "population_network_data_path": pd.DataFrame(dict(
          pid1=[10, 12, 10], pid2=[11, 13, 13], lid=[1_000_000_001, 1_000_000_002, 1],
          start_time=[0, 0, 30_000], duration=[28_800, 86_400, 3_600],
          activity1=[1, 1, 2], activity2=[1, 1, 2])),
      "disease_outcome_data_path": pd.DataFrame(dict(
          pid=np.tile([10, 11, 12, 13], 57), day=np.repeat(np.arange(57), 4),
          state=np.where((np.tile([10, 11, 12, 13], 57) == 13)
                         & (np.repeat(np.arange(57), 4) >= 30), "I", "S"))),
  }
  for argument, table in tables.items():
    files.write_csv_gz(table, os.path.join(folder, files.FILES[argument]))
  return files.client_files(folder)


def test_a_hand_written_file_set_gives_the_expected_tables(tmp_path):
  from tff_silo.pandemic import features
  paths = _write_tiny_set(str(tmp_path))
  g = graph.load_client(paths, sample_size=3, mode="honest")
  assert list(g.pids) == [10, 11, 12, 13]
  np.testing.assert_allclose(g.static[:, 3], [-0.5, 0.5, 0.5, -0.5])    # sex - 1.5
  np.testing.assert_allclose(g.static[:, 5], [0.5, -0.5, -0.5, -0.5])   # worked
  np.testing.assert_allclose(g.static[:, 8], [-0.5, 0.5, 0.5, 0.5])     # home only
  np.testing.assert_allclose(g.static[:, 9], [0.5, 0, 0, 0])            # out of home
  assert sorted(g.neighbours[0][g.neighbours[0] >= 0]) == [1, 3]
  assert sorted(g.neighbours[3][g.neighbours[3] >= 0]) == [0, 2]
  # person 13 turns I on day 30: a window of days 8..28 has label 1 (day 30 is in
  # the next 7), one of days 0..20 has 0
  assert list(features.labels(g.history[[3, 3]], np.array([8, 0]))) == [1.0, 0.0]
  tables = features.stack([g])
  x = np.array([[0, 10], [3, 20]], np.float32)
  built = features.example_builder(tables)(x).numpy()
  assert built.shape == (2, features.input_size(3)) == (2, 11 + 83 * 3)
  assert built[0, 10] == 1.0 and built[1, 10] == 0.0   # S all window: 13 is I on 30..
  slot = list(g.neighbours[0]).index(3)                # person 13 as 10's neighbour
  start = 11 + 83 * slot + 10                          # its one-hot history
  onehot = built[0, start:start + 63].reshape(21, 3)
  assert (onehot[:20].argmax(1) == 0).all() and onehot.sum() == 21   # S on 10..29
  assert onehot[20].tolist() == [0.0, 1.0, 0.0]                       # I on day 30
  # Table 2.3's ablation keeps the self part and, per neighbour, the chosen groups'
  # columns of the full vector: node 73, contact 2 (start, duration), location 8
  full = built.reshape(2, -1)
  neighbours = full[:, 11:].reshape(2, 3, 83)
  for feature_set, columns in (("node", slice(0, 73)), ("node+contact", slice(0, 75)),
                               ("node+location", np.r_[0:73, 75:83])):
    ablated = features.example_builder(tables, feature_set)(x).numpy()
    assert ablated.shape == (2, features.input_size(3, feature_set))
    np.testing.assert_array_equal(ablated[:, :11], full[:, :11])
    np.testing.assert_array_equal(ablated[:, 11:].reshape(2, 3, -1),
                                  neighbours[:, :, columns])
  own = features.example_builder(tables, "self")(x).numpy()
  assert own.shape == (2, features.input_size(3, "self")) == (2, 11)
  np.testing.assert_array_equal(own, full[:, :11])
  with pytest.raises(ValueError, match="feature_set must be one of"):
    features.input_size(3, "contact")


@pytest.mark.parametrize("damage, message", [
    (lambda f: os.remove(f["household_data_path"]), "va_household.csv.gz: missing"),
    (lambda f: _rewrite(f["person_data_path"], lambda t: t.drop(columns="age")),
     "va_person.csv.gz: lacks column(s) age"),
    (lambda f: _rewrite(f["population_network_data_path"],
                        lambda t: t.assign(pid2=[11, 13, 99])),
     "va_population_network.csv.gz: a contact with an unknown pid (99"),
    (lambda f: _rewrite(f["disease_outcome_data_path"], lambda t: t[t.day != 12]),
     "va_disease_outcome_training.csv.gz: day 12 is missing"),
    (lambda f: _rewrite(f["population_network_data_path"],
                        lambda t: t[["pid2", "pid1", "lid", "start_time", "duration",
                                     "activity1", "activity2"]]),
     "va_population_network.csv.gz: the columns must be pid1, pid2"),
    (lambda f: open(f["person_data_path"], "wb").write(b"\x1f\x8bnot gzip"),
     "va_person.csv.gz: cannot be read as a CSV"),
])
def test_bad_files_end_in_one_line_naming_the_file(tmp_path, damage, message):
  paths = _write_tiny_set(str(tmp_path))
  damage(paths)
  with pytest.raises(DataError) as raised:
    graph.load_client(paths, sample_size=3)
  assert message in str(raised.value) and "\n" not in str(raised.value)


def _rewrite(path, change):
  files.write_csv_gz(change(pd.read_csv(path)), path)


@pytest.mark.parametrize("share", [0.0, 0.02, 0.5, 1.0])
def test_the_days_pressure_is_the_sum_over_every_contact_to_the_bit(share):
  """`Contacts.pressure` visits only the contacts of spreading persons, in the
  contacts' own order: the same floats as summing force * hours over every contact
  (zeros included), so outbreaks do not depend on the shortcut."""
  rng = np.random.default_rng(7)
  n = 300
  pairs = np.unique(np.sort(rng.integers(0, n, (4000, 2)), 1), axis=0)
  order = rng.permutation(len(pairs))   # contacts in no particular order
  pid1, pid2 = pairs[order].T
  hours = rng.exponential(2.0, len(pid1)) * rng.choice([1.0, 3.0], len(pid1))
  spreading = rng.random(n) < share
  force = np.where(spreading, rng.choice([0.5, 1.0], n), 0.0)
  every = (np.bincount(pid2, weights=force[pid1] * hours, minlength=n)
           + np.bincount(pid1, weights=force[pid2] * hours, minlength=n))
  got = epidemic.Contacts(pid1, pid2, hours, n).pressure(np.flatnonzero(spreading),
                                                         force)
  np.testing.assert_array_equal(got, every)


def test_the_epidemic_target_counts_new_symptomatic_cases():
  reported = np.zeros((3, 64), np.int8)
  reported[0, 60:] = 1        # S on day 56, I on day 60: positive
  reported[1, 50:] = 1        # already I on day 56: not new
  reported[2, 58:] = 2        # asymptomatic: S -> R
  assert list(epidemic.target(reported)) == [1, 0, 0]
  assert list(epidemic.target(reported, count_asymptomatic=True)) == [1, 0, 1]


# --- the honest mode's unit: a node of the capped graph -----------------------------

def _copy_tables(paths, folder, change):
  """The client's seven tables written to `folder` after `change(tables)`."""
  tables = {argument: pd.read_csv(path) for argument, path in paths.items()}
  change(tables)
  for argument, table in tables.items():
    files.write_csv_gz(table, os.path.join(folder, files.FILES[argument]))
  return files.client_files(folder)


def _examples(g):
  """pid -> the example vector of its prediction window."""
  from tff_silo.pandemic import features
  x = np.stack([np.arange(g.num_nodes), np.full(g.num_nodes, features.PREDICTION_START)],
               1).astype(np.float32)
  built = features.example_builder(features.stack([g]))(x).numpy()
  return dict(zip(g.pids.tolist(), built))


def _changed(before, after):
  """The pids whose example differs (or exists on one side only)."""
  return {p for p in before.keys() | after.keys()
          if p not in before or p not in after or not np.array_equal(before[p], after[p])}


@pytest.fixture(scope="module")
def capped(tiny, tmp_path_factory):
  """The centralized tiny set with its contacts reduced to what the honest cap
  keeps (so loading it caps nothing more): the capped graph as files."""
  paths = files.read_scenario(tiny[0], "centralized")["centralized"]
  tables = graph.read_client(paths)
  pids = tables["person_data_path"].pid.to_numpy()
  network = tables["population_network_data_path"]
  index = pd.Index(pids)
  a, b = index.get_indexer(network.pid1), index.get_indexer(network.pid2)
  _, slots = graph._sample(a, b, pids, 20, 0, "honest")   # pylint: disable=protected-access
  kept = np.unique(slots[slots >= 0])
  folder = str(tmp_path_factory.mktemp("capped"))
  def keep_capped(t):
    t["population_network_data_path"] = t["population_network_data_path"].iloc[kept]
  return _copy_tables(paths, folder, keep_capped)


@pytest.mark.parametrize("mode, local", [("honest", True), ("faithful", False)])
def test_one_persons_attributes_change_at_most_the_examples_holding_them(
    capped, tmp_path, mode, local):
  """Honest mode: a person's features are its own records on public constants, so
  changing one person's age changes its own example and its kept neighbours' (at
  most S1 + 1). Faithful mode standardizes age over the silo's persons: every
  example changes, the failure the test exists to catch."""
  before = graph.load_client(capped, sample_size=20, mode=mode)
  person = int(before.pids[np.argmax((before.neighbours >= 0).sum(1))])
  def older(t):
    p = t["person_data_path"]
    p.loc[p.pid == person, "age"] += 30
  after = graph.load_client(_copy_tables(capped, str(tmp_path), older), sample_size=20,
                            mode=mode)
  changed = _changed(_examples(before), _examples(after))
  holders = {int(before.pids[i]) for i in np.flatnonzero(
      (before.neighbours == np.flatnonzero(before.pids == person)[0]).any(1))}
  if local:
    assert changed == {person} | holders and len(changed) <= 21
  else:
    assert len(changed) > 21


@pytest.mark.parametrize("mode, local", [("honest", True), ("faithful", False)])
def test_removing_one_node_of_the_capped_graph_changes_at_most_its_examples(
    capped, tmp_path, mode, local):
  """Removing a person with its (kept) contacts from the capped graph changes only
  the examples that held it (its own, gone, and its neighbours'): the slot order and
  windows are the persons' own hashes, not draws in file order. Faithful mode's
  fitted statistics and centralities move everyone's."""
  before = graph.load_client(capped, sample_size=20, mode=mode)
  person = int(before.pids[np.argmax((before.neighbours >= 0).sum(1))])
  def without(t):
    for argument in ("person_data_path", "activity_location_assignment_data_path",
                     "disease_outcome_data_path"):
      t[argument] = t[argument][t[argument].pid != person]
    n = t["population_network_data_path"]
    t["population_network_data_path"] = n[(n.pid1 != person) & (n.pid2 != person)]
  after = graph.load_client(_copy_tables(capped, str(tmp_path), without),
                            sample_size=20, mode=mode)
  changed = _changed(_examples(before), _examples(after))
  if local:
    index = np.flatnonzero(before.pids == person)[0]
    holders = {int(before.pids[i]) for i in np.flatnonzero(
        (before.neighbours == index).any(1))}
    assert changed == {person} | holders and 1 < len(changed) <= 21
  else:
    assert len(changed) > 21


def test_held_out_households_never_enter_training(tiny):
  """The scenario's test persons are a public split of households: none of them is
  a training node, and their examples are built from held-out persons alone."""
  from tff_silo.pandemic import pipeline
  scenario = pipeline.load_scenario(tiny[0], "scenario01", sample_size=20)
  t = scenario.tables
  k = len(scenario.clients)
  train_nodes = np.concatenate([x[:, 0] for x in scenario.silos.x_train]).astype(int)
  test_nodes = np.concatenate([x[:, 0] for x in scenario.silos.x_test]).astype(int)
  assert not set(train_nodes) & set(test_nodes)
  first_test = t.offsets[k]   # the held-out graphs follow the training ones
  assert train_nodes.max() < first_test <= test_nodes.min()
  neighbours = t.neighbours[test_nodes]
  assert (neighbours[neighbours >= 0] >= first_test).all()
  trained = t.neighbours[train_nodes]
  assert (trained[trained >= 0] < first_test).all()
  persons = _read(os.path.join(tiny[0], "centralized", "train"), "person_data_path")
  share = graph.held_out(persons.drop_duplicates("hid").hid.to_numpy()).mean()
  assert 0.2 < share < 0.3


def test_heterogeneous_regions_change_where_the_outbreak_spreads(tmp_path):
  """Region 2's susceptibles infected 4x as easily as region 0's (and its household
  hours weighted 4x), the outbreak calibrated to the same overall final-week rate:
  region 2's share of persons ever infected, over region 0's, is more than 3x what
  it is in the homogeneous tiny profile (the same seeds, so the same day draws)."""
  def infected_share(config, folder):
    meta = synth.generate(str(folder), "tiny", seed=0, final_week_rate=0.01,
                          config=config, scenarios=())
    pop = synth.population(synth.PROFILES["tiny"], 0)
    region = partition.official_regions(pop.county_lon, pop.county_lat)[
        pop.person_county]
    outcome = _read(os.path.join(str(folder), "centralized", "train"),
                    "disease_outcome_data_path")
    states = files.states_to_codes(outcome.state).reshape(57, -1).T
    ever = (states > 0).any(axis=1)
    return meta, [ever[region == r].mean() for r in range(3)]
  _, same = infected_share(None, tmp_path / "same")
  meta, apart = infected_share(epidemic.EpidemicConfig(
      region_transmission=(0.5, 1.0, 2.0), region_home_weight=(0.5, 1.0, 2.0)),
                               tmp_path / "apart")
  assert apart[2] / apart[0] > 3 * same[2] / same[0]   # 0.52 against 0.10
  assert tuple(meta["epidemic"]["region_transmission"]) == (0.5, 1.0, 2.0)


@pytest.mark.parametrize("factors", [(1.0, 2.0), (1.0, 0.0, 1.0), (1.0, np.inf, 1.0)])
def test_region_factors_are_three_positive_numbers(factors):
  with pytest.raises(ValueError, match="region_transmission must be 3 positive"):
    epidemic.EpidemicConfig(region_transmission=factors)
