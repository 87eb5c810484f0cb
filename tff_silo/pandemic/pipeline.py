"""The forecasting pipeline of thesis ch. 2 on the library's MR-MTL: a scenario's
clients become silos of neighbourhood examples, each trains a personalized model
with DP-SGD, and every client's predictions for days 57..63 are pooled and scored
by average precision, as the challenge scored them.

Held-out persons: a public split of households (`graph.held_out`, a quarter) is
kept out of training; each client trains on the subgraph of its other persons and
is scored on the held-out persons' subgraph (their days 36..56 and their target),
whose records never enter training. (The challenge scored the training persons
themselves; so did this pipeline before.)

Privacy (`../shared/PANDEMIC.md` 2.10): every run is accounted node-level with
Theorem 2.4.4's exponent (replace one node; `PrivacyProtocol(node_examples=S)`) at
delta = 1/(10 n) per silo (`delta_for`; the thesis' 1/n is the level at which
releasing one random person's record is already (0, delta)-DP). In `honest` mode
that is a guarantee for its unit, a node of the degree-capped graph with its kept
contacts: every node lies in at most S1 + 1 examples, a person's features are its
own records on public constants, and each step draws a batch uniformly without
replacement. Replacing a node changes the examples that held it and those that hold
its replacement: up to S = 2 S1 + 1 (`node_examples`; the theorem as printed counts
S1 + 1, which covers adding or removing it). The degree cap itself reads every
person's contacts without noise and is outside the guarantee; the rows say so. In
`faithful` mode (the authors' pipeline: uncapped in-degree, fitted statistics,
shuffled epochs) the same figure is what the accountant says, not a bound. The
authors' own exponent (add/remove, S1 + 1 examples) is reported beside it, labelled.

One deviation: each person's training window is drawn once per run (a hash of the
seed and its pid), not once per epoch as in the authors' code: the library's drivers
train on fixed examples. With T = 2 rounds of one epoch that is one window per
person where the authors see two; the privacy accounting is unaffected (it counts
examples, whatever their window).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Optional

import numpy as np
from sklearn import metrics

from tff_silo.data.silos import SiloData
from tff_silo.pandemic import features, files, graph
from tff_silo.pandemic.choices import FEATURE_SETS, METHODS
from tff_silo.pandemic.files import DataError

BATCH_SIZE = 512                  # the authors' (thesis Table 2.1)
LEARNING_RATE = 0.2
NUM_WINDOWS = features.LAST_TRAINING_START + 1    # 29 training windows per person
_WINDOW_SALT = 41                 # a person's window: graph.hashed_uniform of its pid


@dataclasses.dataclass(frozen=True)
class Scenario:
  """A scenario's clients as silos (x = [node, window start], y = label)."""
  name: str
  clients: tuple
  tables: features.NodeTables
  silos: SiloData
  max_neighbourhoods: tuple       # per client: the most examples a node lies in
  mode: str
  has_target: bool                # whether the test folders hold the target file


def load_scenario(data_dir: str, scenario: str, *, sample_size: int = 20,
                  mode: str = "honest", seed: int = 0,
                  client_range: Optional[tuple] = None) -> Scenario:
  """Every client of `scenario` (or `centralized`: one silo of everyone), or the
  clients lo..hi of their sorted names (`client_range` (lo, hi): a shard's): the
  graph and tables of its training persons with a random training window each (a
  hash of the seed and the pid), and those of its held-out persons with the last
  window (days 36..56) and the target, for testing. DataError names a bad file."""
  clients = files.read_scenario(data_dir, scenario, "train")
  if client_range is not None:   # only these clients' folders are read
    clients = dict(list(clients.items())[slice(*client_range)])
  trained, scored = [], []
  for paths in clients.values():
    read = graph.read_client(paths)
    trained.append(graph.load_client(paths, sample_size=sample_size, mode=mode,
                                     seed=seed, part="train", tables=read))
    scored.append(graph.load_client(paths, sample_size=sample_size, mode=mode,
                                    seed=seed, part="held_out", tables=read))
  tables = features.stack(trained + scored)
  x_train, y_train, x_test, y_test = [], [], [], []
  has_target = True
  test_dir = os.path.join(data_dir, scenario, "test")
  for k, (name, g, h) in enumerate(zip(clients, trained, scored)):
    starts = np.floor(graph.hashed_uniform(seed, _WINDOW_SALT, g.pids)
                      * NUM_WINDOWS).astype(np.int64)
    x_train.append(np.stack([tables.offsets[k] + np.arange(g.num_nodes), starts],
                            1).astype(np.float32))
    y_train.append(features.labels(g.history, starts))
    x_test.append(np.stack([tables.offsets[len(trained) + k] + np.arange(h.num_nodes),
                            np.full(h.num_nodes, features.PREDICTION_START)],
                           1).astype(np.float32))
    folder = test_dir if scenario == "centralized" else os.path.join(test_dir, name)
    target = _target(os.path.join(folder, files.TARGET), h.pids)
    has_target &= target is not None
    y_test.append(np.zeros(h.num_nodes, np.float32) if target is None else target)
  silos = SiloData(f"pandemic_{scenario}", "binary_01", tuple(x_train), tuple(y_train),
                   tuple(x_test), tuple(y_test))
  return Scenario(scenario, tuple(clients), tables, silos,
                  tuple(g.max_neighbourhoods for g in trained), mode, has_target)


def _target(path: str, pids) -> Optional[np.ndarray]:
  """infected (0/1) per pid from the target file; None when there is none."""
  if not os.path.isfile(path):
    return None
  import pandas as pd   # pylint: disable=g-import-not-at-top
  table = pd.read_csv(path)
  if list(table.columns[:2]) != ["pid", "infected"]:
    raise DataError(f"{path}: the columns must be pid, infected")
  infected = table.set_index("pid").infected.reindex(pids)
  if infected.isna().any():
    raise DataError(f"{path}: no target for pid {int(pids[infected.isna().to_numpy()][0])}")
  return (infected.to_numpy() != 0).astype(np.float32)


def scores(model, silo_weights, silos: SiloData) -> list:
  """Each silo's predicted probabilities on its test window, with its own model
  (`evaluation.silo_outputs`: by PJRT where the rounds run there)."""
  from tff_silo import evaluation   # pylint: disable=g-import-not-at-top
  return [1.0 / (1.0 + np.exp(-logits))
          for logits in evaluation.silo_outputs(model, silo_weights, silos.x_test)]


def evaluate(predictions, labels) -> dict:
  """Pooled average precision (the challenge's metric), its lift over the positive
  rate (a constant score's AP) and the recall at 0.5."""
  p, y = np.concatenate(predictions), np.concatenate(labels)
  rate = float(y.mean())
  ap = float(metrics.average_precision_score(y, p)) if y.any() else math.nan
  return dict(average_precision=ap, positive_rate=rate,
              lift=ap / rate if rate > 0 else math.nan,
              recall_at_half=float(((p >= 0.5) & (y > 0)).sum() / max(1, y.sum())),
              positives=int(y.sum()), scored=len(y))


@dataclasses.dataclass(frozen=True)
class Settings:
  """How one forecaster is trained (thesis Table 2.1 defaults; `noise_multiplier`
  0: no DP). `centralized` trains one silo of everyone for two epochs."""
  method: str = "mrmtl"
  noise_multiplier: float = 0.0
  clip: float = 15.0
  lam: float = 0.0003
  rounds: int = 2
  batch_size: int = BATCH_SIZE
  learning_rate: float = LEARNING_RATE
  loss: str = "focal"
  alpha: float = 0.75
  architecture: str = "logistic"
  feature_set: str = features.ALL_FEATURES   # Table 2.3's ablation: fewer groups
  seed: int = 0

  def __post_init__(self):
    if self.feature_set not in FEATURE_SETS:
      raise ValueError(f"feature_set must be one of {FEATURE_SETS}, got "
                       f"{self.feature_set!r}")
    if self.method not in METHODS:
      raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
    if not self.noise_multiplier >= 0 or not self.clip > 0 or not self.lam >= 0:
      raise ValueError("noise_multiplier and lam must be >= 0 and clip > 0")

  @property
  def private(self) -> bool:
    return self.noise_multiplier > 0


def node_examples(sample_size: int) -> int:
  """S, the most examples replacing one node of the capped graph changes: the S1 + 1
  that held it (its own and its kept neighbours') and the S1 that hold its
  replacement: 2 S1 + 1."""
  return 2 * sample_size + 1


def delta_for(num_nodes: int) -> float:
  """A silo's delta: 1 / (10 n), well below the 1/n at which releasing one random
  person's record is already (0, delta)-DP."""
  return 1.0 / (10 * int(num_nodes))


GUARANTEE = ("node-level: replace one node of the degree-capped graph (a person and "
             "its kept contacts; up to {s} examples change), delta 1/(10 n) per silo; "
             "the degree cap reads every person's contacts and lies outside it")


def train(scenario: Scenario, settings: Settings, *, backend: str = "vectorized",
          progress=None) -> dict:
  """Trains `settings.method` on the scenario's silos (the library's MR-MTL family
  on `backend`) and scores the pooled predictions; the measured figures."""
  model, result, epochs = fit(scenario, settings, backend=backend, progress=progress)
  measured = evaluate(scores(model, result.silo_weights, scenario.silos),
                      scenario.silos.y_test) if scenario.has_target else {}
  return _measured(measured, result, epochs, scenario.silos.train_sizes,
                   scenario.tables.sample_size, scenario.mode,
                   max(scenario.max_neighbourhoods))


def fit(scenario: Scenario, settings: Settings, *, backend: str = "vectorized",
        progress=None):
  """(the forecaster, its `simulation` result, local epochs per round) of
  `settings.method` trained on the scenario's silos."""
  from tff_silo import simulation   # pylint: disable=g-import-not-at-top
  _check_folder(settings, scenario.silos.num_silos == 1
                and scenario.name == "centralized")
  model = _forecaster(scenario.tables, settings)
  definition, rounds, epochs = _definition(model, settings, scenario.mode)
  result = simulation.run_simulation(
      definition, scenario.silos, rounds=rounds, seed=settings.seed, backend=backend,
      progress=progress, **_privacy(settings, scenario.silos.train_sizes,
                                    scenario.tables.sample_size))
  return model, result, epochs


def _check_folder(settings: Settings, centralized_folder: bool) -> None:
  if (settings.method == "centralized") != centralized_folder:
    raise ValueError("the centralized method trains the `centralized` folder, the "
                     "others a scenario's clients")


def _forecaster(tables: features.NodeTables, settings: Settings):
  return features.forecaster(tables, architecture=settings.architecture,
                             loss=settings.loss, alpha=settings.alpha,
                             feature_set=settings.feature_set)


def _definition(model, settings: Settings, mode: str) -> tuple:
  """(the library's definition of `settings.method` over `model`, rounds, local
  epochs per round)."""
  from tff_silo import algorithms   # pylint: disable=g-import-not-at-top
  centralized = settings.method == "centralized"
  epochs, rounds = (2, 1) if centralized else (1, settings.rounds)
  sampling = "without_replacement" if mode == "honest" else "shuffle"
  definition = algorithms.silo_definition(
      "local" if centralized else settings.method, model, (2,),
      client_learning_rate=settings.learning_rate, batch_size=settings.batch_size,
      rounds=rounds, lam=settings.lam, local_epochs=epochs,
      l2_norm_clip=settings.clip if settings.private else None,
      sampling=sampling if settings.private else "poisson")
  return definition, rounds, epochs


def _privacy(settings: Settings, sizes, sample_size: int) -> dict:
  """What a private run's simulation takes: the given noise (each silo's ledger says
  what it spends), delta 1/(10 n) per silo, node-level accounting."""
  from tff_silo.privacy import PrivacyProtocol   # pylint: disable=g-import-not-at-top
  if not settings.private:
    return {}
  return dict(noise_multiplier=settings.noise_multiplier,
              target_delta=np.array([delta_for(m) for m in sizes]),
              protocol=PrivacyProtocol("replace_one",
                                       node_examples=node_examples(sample_size)))


def shard(data_dir: str, scenario: str, lo: int, hi: int, settings: Settings, *,
          sample_size: int, mode: str, data_seed: int) -> tuple:
  """A shard's recipe (`tff_silo.sharding`), run where the shard is: the clients
  lo..hi of `scenario` loaded from their folders alone, the definition over their
  tables, and what a row reports of them."""
  scenario = load_scenario(data_dir, scenario, sample_size=sample_size, mode=mode,
                           seed=data_seed, client_range=(lo, hi))
  definition, _, _ = _definition(_forecaster(scenario.tables, settings), settings, mode)
  return definition, scenario.silos, dict(
      max_neighbourhoods=max(scenario.max_neighbourhoods),
      has_target=scenario.has_target)


def _shard_scores(on_shard, weights) -> tuple:
  """(each silo's test predictions, its labels), on a shard with its silos' models."""
  return (scores(on_shard.definition.model, weights, on_shard.data),
          list(on_shard.data.y_test))


def train_sharded(data_dir: str, scenario: str, settings: Settings, make_shards,
                  num_shards: int, *, sample_size: int = 20, mode: str = "honest",
                  data_seed: int = 0, progress=None) -> dict:
  """`train` with the scenario's clients split across `num_shards` shards
  (`tff_silo.sharding`), each loading its own clients' folders where it runs
  (`make_shards(recipes)` -> shards: `sharding.InProcess`, or Ray actors); this
  process holds their sizes, the server model and the ledgers. The same figures as
  `train` (to float32 rounding), with `shard_peak_memory_mb` (the largest shard
  process's peak; `shard_peaks_mb` each one's, "/"-joined) and `load_seconds`
  (until every shard has loaded)."""
  from tff_silo import sharding   # pylint: disable=g-import-not-at-top
  names = files.read_scenario(data_dir, scenario, "train")
  edges = sharding.bounds(len(names), num_shards)
  _check_folder(settings, scenario == "centralized")
  start = time.perf_counter()
  shards = make_shards([functools.partial(
      shard, data_dir, scenario, lo, hi, settings, sample_size=sample_size, mode=mode,
      data_seed=data_seed) for lo, hi in edges])
  described = sharding.gather(shards, "describe")   # once each has loaded its clients
  load_seconds = time.perf_counter() - start
  sizes = np.concatenate([d["train_sizes"] for d in described])
  definition, rounds, epochs = _definition(
      _forecaster(features.shapes_only(sample_size), settings), settings, mode)
  result = sharding.run_sharded(
      definition, shards, rounds=rounds, seed=settings.seed, progress=progress,
      name=f"pandemic_{scenario}", described=described,
      **_privacy(settings, sizes, sample_size))
  measured = {}
  if all(d["info"]["has_target"] for d in described):
    starts = np.cumsum([0] + [len(d["train_sizes"]) for d in described])
    parts = sharding.gather(shards, "apply", [_shard_scores] * len(shards),
                            [result.silo_weights[a:b]
                             for a, b in zip(starts[:-1], starts[1:])])
    measured = evaluate([p for part in parts for p in part[0]],
                        [y for part in parts for y in part[1]])
  memory = sharding.gather(shards, "peak_memory_mb")
  return dict(_measured(measured, result, epochs, sizes, sample_size, mode,
                        max(d["info"]["max_neighbourhoods"] for d in described)),
              shards=len(shards), shard_peak_memory_mb=max(memory),
              shard_peaks_mb="/".join(f"{m:.0f}" for m in memory),
              load_seconds=load_seconds)


def gradient_norms(model, silo_weights, silos: SiloData, chunk: int = 8192) -> list:
  """Each silo's per-example L2 norms of the loss gradient at its own weights, over
  its training examples, in order (thesis Fig. 2.9; the MR-MTL term, data
  independent, is left out). Reads private data without noise: a diagnostic."""
  import tensorflow as tf   # pylint: disable=g-import-not-at-top
  from tff_silo.algorithms.local_training import per_example_gradients   # pylint: disable=g-import-not-at-top
  out = []
  for weights, x, y in zip(silo_weights, silos.x_train, silos.y_train):
    weights = [tf.constant(w) for w in weights]
    norms = []
    for i in range(0, len(y), chunk):
      grads = per_example_gradients(model, weights, tf.constant(x[i:i + chunk]),
                                    tf.constant(y[i:i + chunk]))
      norms.append(tf.sqrt(tf.add_n([tf.reduce_sum(tf.reshape(g, [tf.shape(g)[0], -1]) ** 2,
                                                   axis=1) for g in grads])).numpy())
    out.append(np.concatenate(norms))
  return out


def _measured(measured: dict, result, epochs: int, sizes, sample_size: int, mode: str,
              max_neighbourhoods: int) -> dict:
  """A `train` row's figures: the AP (`measured`) and the privacy each silo spent."""
  from tff_silo.privacy import node_level   # pylint: disable=g-import-not-at-top
  s = node_examples(sample_size)
  privacy = result.privacy
  out = dict(measured, rounds=result.rounds, epochs=epochs,
             train_seconds=result.wall_seconds, silos=len(sizes),
             max_neighbourhoods=max_neighbourhoods, node_examples=s,
             delta_rule="1/(10 n)", scored_on="held-out households")
  if privacy is None:
    return dict(out, epsilon_theorem=math.inf, epsilon_code=math.inf,
                noise_multiplier=0.0, guarantee="none (no DP)")
  own = sample_size + 1   # adding or removing a node: S1 + 1
  code = [node_level.epsilon(z, int(m), own, int(round(q * m)), int(t), d,
                             neighbouring="add_remove")
          for z, q, t, m, d in zip(privacy.noise_multipliers, privacy.sampling_rates,
                                   privacy.steps, sizes, privacy.target_delta)]
  bounded = mode == "honest" and max_neighbourhoods <= sample_size + 1
  epsilon = float(np.max(privacy.epsilon_spent))
  guarantee = (GUARANTEE.format(s=s) if bounded else "none: the accountant's figure "
               "for an uncapped in-degree, fitted statistics and shuffled batches "
               "(the authors' pipeline)")
  if not math.isfinite(epsilon):
    guarantee = ("none: no finite node-level epsilon at this noise (a node's change "
                 "can move a batch past the noise's support)")
  return dict(
      out, epsilon_theorem=epsilon, epsilon_code=float(max(code)),
      delta_max=float(np.max(privacy.target_delta)),
      noise_multiplier=float(np.min(privacy.noise_multipliers)), guarantee=guarantee)
