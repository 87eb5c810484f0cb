"""Neighbourhood examples built per batch from per-node tables, in TensorFlow
(`../shared/PANDEMIC.md` 2.5-2.7), and the forecasting models over them.

An example is (node, window start s): its 21-day window is days s..s+20. Its vector
(d = 11 + 83 S1, 1,671 for S1 = 20):
  self (11)          the node's centrality (2) and personal features (8), and one bit:
                     S on every day of the window (its own history is not a feature);
  each neighbour (83) its centrality and personal features (10), its one-hot S/I/R
                     history over the window (63) and the contact's features (10:
                     start and duration as fractions of a day, the place's
                     standardized longitude and latitude and its six type flags).
Its training label: S on every window day and I or R on some day of the 7 after it.
Table 2.3's ablation keeps fewer groups of each neighbour's part (`feature_set`):
"node" keeps its 73 node features, "contact" adds the contact's start and duration
(2), "location" the place's coordinates and type flags (8); "self" keeps the self
part alone (d = 11).

The tables of every silo sit in one `NodeTables` (node indices offset per silo), so
the library's MR-MTL process and its vectorized backend train a `SiloModel` whose
inputs x = [node, s] are two numbers: the 1,671 floats exist for one batch at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import tensorflow as tf

from tff_silo.models.functional import SiloModel, linear_form_gradients
from tff_silo.pandemic.choices import ARCHITECTURES, FEATURE_SETS, LOSSES
from tff_silo.pandemic.graph import D_NODE, D_STATIC, WINDOW

PREDICTION_START = 36            # days 36..56 predict days 57..63
LAST_TRAINING_START = 28         # label days up to 55 (the authors' indexing)


ALL_FEATURES = FEATURE_SETS[0]
# Each neighbour's columns per feature group
GROUP_WIDTHS = {"node": D_NODE, "contact": 2, "location": 8}


def _groups(feature_set: str) -> tuple:
  if feature_set not in FEATURE_SETS:
    raise ValueError(f"feature_set must be one of {FEATURE_SETS}, got {feature_set!r}")
  return () if feature_set == "self" else tuple(feature_set.split("+"))


def input_size(sample_size: int, feature_set: str = ALL_FEATURES) -> int:
  """d: 11 + 83 S1 with every group (1,671 at S1 = 20); 11 + 73 S1 with node
  features alone."""
  return D_STATIC + 1 + sample_size * sum(GROUP_WIDTHS[g] for g in _groups(feature_set))


@dataclasses.dataclass(frozen=True)
class NodeTables:
  """The per-node tables of all silos, concatenated (`stack`)."""
  static: np.ndarray
  history: np.ndarray
  neighbours: np.ndarray        # global node indices, -1 padding
  contact_time: np.ndarray
  contact_place: np.ndarray     # global place rows, -1: none (zero features)
  places: np.ndarray
  offsets: np.ndarray           # first global node index of each silo

  @property
  def sample_size(self) -> int:
    return self.neighbours.shape[1]

  @property
  def digest(self) -> str:
    """What the tables hold (a model's traced functions are keyed by it)."""
    h = hashlib.sha256()
    for name in ("static", "history", "neighbours", "contact_time", "contact_place",
                 "places"):
      h.update(np.ascontiguousarray(getattr(self, name)).tobytes())
    return h.hexdigest()[:16]


def stack(graphs) -> NodeTables:
  """One `NodeTables` of several silos' `graph.ClientGraph`s."""
  offsets = np.cumsum([0] + [g.num_nodes for g in graphs])[:-1]
  place_offsets = np.cumsum([0] + [len(g.places) for g in graphs])[:-1]
  shift = lambda a, by: np.where(a >= 0, a + by, -1).astype(np.int32)
  return NodeTables(
      np.concatenate([g.static for g in graphs]),
      np.concatenate([g.history for g in graphs]),
      np.concatenate([shift(g.neighbours, o) for g, o in zip(graphs, offsets)]),
      np.concatenate([g.contact_time for g in graphs]),
      np.concatenate([shift(g.contact_place, o) for g, o in zip(graphs, place_offsets)]),
      np.concatenate([g.places for g in graphs]), offsets.astype(np.int64))


def shapes_only(sample_size: int) -> NodeTables:
  """Tables of no nodes with S1 = `sample_size`: a forecaster over them has the
  weights of one over real tables (a sharded run's driver, which holds no data)."""
  empty = lambda *shape, dtype=np.float32: np.zeros((0, *shape), dtype)
  return NodeTables(empty(D_STATIC), empty(57, dtype=np.int8),
                    empty(sample_size, dtype=np.int32), empty(sample_size, 2),
                    empty(sample_size, dtype=np.int32), empty(8), np.zeros(0, np.int64))


def labels(history: np.ndarray, starts: np.ndarray) -> np.ndarray:
  """Per node (rows of `history`) and window start: S on all 21 window days and I or
  R on some day of the 7 after."""
  days = starts[:, None] + np.arange(WINDOW + 7)
  states = np.take_along_axis(history, days, axis=1)
  return ((states[:, :WINDOW] == 0).all(1) & (states[:, WINDOW:] > 0).any(1)).astype(
      np.float32)


def example_builder(tables: NodeTables, feature_set: str = ALL_FEATURES):
  """`x [b, 2] (node, start) -> features [b, d]` of `feature_set`'s groups
  (`input_size`), gathering from `tables`: eager
  tensors made once (captured by eager code and tf.functions), or graph constants in
  a plain graph (TFF's computations, which cannot capture eager tensors)."""
  arrays = dict(static=tables.static, history=tables.history.astype(np.int32),
                neighbours=tables.neighbours, contact_time=tables.contact_time,
                contact_place=tables.contact_place, places=tables.places)
  with tf.init_scope():   # eager code, and the graph tf.functions hang from
    eager = {name: tf.constant(value) for name, value in arrays.items()}
    eager_graph = tf.compat.v1.get_default_graph()
  s1 = tables.sample_size
  groups = _groups(feature_set)
  width = input_size(s1, feature_set) - D_STATIC - 1   # all neighbours' columns

  def build(x):
    # A function graph (a tf.function, its loop bodies, pfor's) hangs from the graph
    # it was made in; one made from eager code captures the eager tensors. TFF
    # traces its computations in a plain graph of its own: constants there.
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:
      graph = graph.outer_graph
    plain_graph = graph is not eager_graph
    t = {name: tf.constant(value) for name, value in arrays.items()} if plain_graph else eager
    static, history, neighbours = t["static"], t["history"], t["neighbours"]
    contact_time, contact_place, places = (t["contact_time"], t["contact_place"],
                                           t["places"])
    node = tf.cast(x[:, 0], tf.int32)
    days = tf.cast(x[:, 1], tf.int32)[:, None] + tf.range(WINDOW)   # [b, 21]
    own = tf.gather(tf.gather(history, node), days, batch_dims=1)
    susceptible = tf.cast(tf.reduce_all(tf.equal(own, 0), axis=1), tf.float32)
    own_part = tf.concat([tf.gather(static, node), susceptible[:, None]], 1)
    if not groups:
      return own_part
    nb = tf.gather(neighbours, node)                                  # [b, S1]
    valid = tf.cast(nb >= 0, tf.float32)[..., None]
    nb = tf.maximum(nb, 0)
    windows = tf.gather(tf.gather(history, nb), tf.tile(days[:, None], [1, s1, 1]),
                        batch_dims=2)                                 # [b, S1, 21]
    onehot = tf.reshape(tf.one_hot(windows, 3), [-1, s1, 3 * WINDOW])
    parts = [tf.gather(static, nb) * valid, onehot * valid]
    if "contact" in groups:
      parts.append(tf.gather(contact_time, node))
    if "location" in groups:
      place = tf.gather(contact_place, node)
      parts.append(tf.gather(places, tf.maximum(place, 0)) * tf.cast(
          place >= 0, tf.float32)[..., None])
    return tf.concat([own_part, tf.reshape(tf.concat(parts, -1), [-1, width])], 1)

  return build


def _focal_terms(logits, y, alpha):
  """(p_t, alpha_t, -log p_t): the probability of the true class, its weight and
  its cross-entropy."""
  p = tf.sigmoid(logits)
  return (y * p + (1 - y) * (1 - p), y * alpha + (1 - y) * (1 - alpha),
          tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))


def focal_loss(alpha: float = 0.75, gamma: float = 2.0):
  """Lin et al.'s focal loss on logits: -alpha_t (1 - p_t)^gamma log p_t."""
  def loss(logits, y):
    p_t, alpha_t, bce = _focal_terms(logits, y, alpha)
    return alpha_t * tf.pow(1 - p_t, gamma) * bce
  return loss


def forecaster(tables: NodeTables, *, architecture: str = "logistic",
               loss: str = "focal", alpha: float = 0.75, gamma: float = 2.0,
               hidden: int = 64, feature_set: str = ALL_FEATURES) -> SiloModel:
  """The forecasting model over `tables`' examples of `feature_set` (outputs:
  logits): logistic regression with zero initial weights (the authors'), or a
  3-layer MLP (Table 2.4's ablation); focal loss or binary cross-entropy."""
  if architecture not in ARCHITECTURES:
    raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
  if loss not in LOSSES:
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
  build = example_builder(tables, feature_set)
  d = input_size(tables.sample_size, feature_set)
  if loss == "bce":   # (not focal with gamma 0: pow(0, 0)'s gradient is NaN)
    loss_fn = lambda z, y: tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z)
  else:
    loss_fn = focal_loss(alpha, gamma)

  def loss_slope(logits, y):
    """d loss / d logit per example, in closed form (no tape inside the vectorized
    backend's pfor): sigmoid(z) - y for cross-entropy; for focal loss
    -alpha_t (2y - 1) [(1 - p_t)^(gamma + 1) - gamma (1 - p_t)^gamma p_t log p_t]."""
    if loss == "bce":
      return tf.sigmoid(logits) - y
    p_t, alpha_t, bce = _focal_terms(logits, y, alpha)
    inner = tf.pow(1 - p_t, gamma + 1) + gamma * tf.pow(1 - p_t, gamma) * p_t * bce
    return -alpha_t * (2 * y - 1) * inner
  name = (f"pandemic_{architecture}_{loss}_{alpha:g}_{gamma:g}_{feature_set}_"
          f"{tables.digest}")
  if architecture == "logistic":
    shapes = ((d,), ())

    def apply(weights, x):
      return tf.linalg.matvec(build(x), weights[0]) + weights[1]

    def linear_form(weights, x, y):
      # weights one model's ([d], []) or one per example ([m, d], [m])
      features = build(x)
      return features, loss_slope(tf.reduce_sum(features * weights[0], -1)
                                  + weights[1], y)

    return SiloModel(name, shapes, lambda seed: (np.zeros(d, np.float32),
                                                 np.float32(0.0)),
                     apply, loss_fn, "accuracy",
                     predict_fn=lambda z: tf.cast(z >= 0.0, tf.float32),
                     per_example_gradients_fn=linear_form_gradients(linear_form),
                     linear_form_fn=linear_form)
  shapes = ((d, hidden), (hidden,), (hidden, hidden), (hidden,), (hidden, 1), (1,))

  def init(seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.uniform(-1, 1, s).astype(np.float32) * np.sqrt(6 / sum(s))
                 if len(s) == 2 else np.zeros(s, np.float32) for s in shapes)

  def apply_mlp(weights, x):
    h = build(x)
    for i in (0, 2):
      h = tf.nn.relu(tf.matmul(h, weights[i]) + weights[i + 1])
    return tf.matmul(h, weights[4])[:, 0] + weights[5][0]

  return SiloModel(name, shapes, init, apply_mlp, loss_fn, "accuracy",
                   predict_fn=lambda z: tf.cast(z >= 0.0, tf.float32))
