"""Training the forecaster (`tff_silo.pandemic`): the closed-form per-example
gradients equal autodiff's, the library's MR-MTL trains it with node-level DP-SGD
on both backends with the same numbers, and the pooled predictions are scored."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_silo import algorithms, sharding, simulation
from tff_silo.pandemic import features, pipeline, synth
from tff_silo.privacy import PrivacyProtocol


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("pandemic"))
  synth.generate(out, "tiny", seed=0, final_week_rate=0.01,
                 scenarios=("scenario01",))
  return out


@pytest.fixture(scope="module")
def scenario(data_dir):
  return pipeline.load_scenario(data_dir, "scenario01", sample_size=20, mode="honest")


@pytest.mark.parametrize("loss", ["focal", "bce"])
def test_closed_form_per_example_gradients_equal_autodiff(scenario, loss):
  model = features.forecaster(scenario.tables, loss=loss)
  rng = np.random.default_rng(0)
  weights = [tf.constant(rng.normal(0, 0.05, s).astype(np.float32))
             for s in model.weight_shapes]
  x = tf.constant(scenario.silos.x_train[1][:16])
  y = tf.constant(np.r_[np.ones(4), np.zeros(12)].astype(np.float32))
  ours = model.per_example_gradients_fn(weights, x, y)
  # saturated logits: finite gradients (the cross-entropy is not focal at gamma 0,
  # whose pow(0, 0) has a NaN gradient)
  big = [tf.fill(s, 5.0) for s in model.weight_shapes]
  with tf.GradientTape() as tape:
    tape.watch(big)
    value = model.batch_loss(big, x, y)
  assert all(np.isfinite(g.numpy()).all() for g in tape.gradient(value, big))
  for i in range(16):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      value = model.per_example_loss(weights, x[i:i + 1], y[i:i + 1])[0]
    for mine, theirs in zip(ours, tape.gradient(value, weights)):
      np.testing.assert_allclose(mine[i].numpy(), theirs.numpy(), rtol=1e-4, atol=1e-7)


def test_gradient_norms_are_each_examples_autodiff_norm(scenario):
  """Fig. 2.9's norms: every training example's, in order, at each silo's own
  weights, the same in chunks as autodiff one example at a time."""
  model = features.forecaster(scenario.tables)
  rng = np.random.default_rng(1)
  silo_weights = [[rng.normal(0, 0.05, s).astype(np.float32) for s in model.weight_shapes]
                  for _ in range(scenario.silos.num_silos)]
  norms = pipeline.gradient_norms(model, silo_weights, scenario.silos, chunk=7)
  assert [len(n) for n in norms] == list(scenario.silos.train_sizes)
  for k in (0, 2):
    weights = [tf.constant(w) for w in silo_weights[k]]
    x, y = scenario.silos.x_train[k], scenario.silos.y_train[k]
    for i in list(range(9)) + list(np.flatnonzero(y)[:2]):
      with tf.GradientTape() as tape:
        tape.watch(weights)
        value = model.per_example_loss(weights, x[i:i + 1], y[i:i + 1])[0]
      want = np.sqrt(sum(float(tf.reduce_sum(g ** 2)) for g in tape.gradient(value, weights)))
      assert norms[k][i] == pytest.approx(want, rel=1e-4)


def test_traced_programs_capture_the_tables_instead_of_copying_them(scenario):
  """A tf.function (and its loop bodies, pfor's included) refers to the node tables;
  only a plain graph (TFF's computations) holds them as constants. (Copying them
  into every program cost ~2 GB and minutes of tracing per program at 400,000
  persons.)"""
  build = features.example_builder(scenario.tables)
  x = tf.constant(scenario.silos.x_train[0][:8][None])
  history_bytes = scenario.tables.history.size * 4

  def in_loop(x):
    return tf.while_loop(lambda i, _: i < 1, lambda i, s: (i + 1, s + tf.reduce_sum(
        tf.vectorized_map(build, x))), (0, 0.0))[1]

  traced = tf.function(in_loop).get_concrete_function(x)
  graph_def = traced.graph.as_graph_def()
  assert graph_def.ByteSize() < history_bytes / 4
  assert scenario.tables.history.shape in [tuple(c.shape) for c in traced.captured_inputs]
  plain = tf.Graph()
  with plain.as_default():
    in_loop(tf.constant(x.numpy()))
  assert plain.as_graph_def().ByteSize() > history_bytes


@pytest.mark.slow
@pytest.mark.tff
def test_node_level_mrmtl_trains_alike_on_both_backends(scenario):
  silos = scenario.silos
  model = features.forecaster(scenario.tables)
  definition = algorithms.silo_definition(
      "mrmtl", model, (2,), client_learning_rate=0.2, batch_size=64, rounds=2,
      lam=0.001, l2_norm_clip=5.0, sampling="without_replacement")
  run = dict(rounds=2, target_epsilon=50.0, target_delta=1 / silos.train_sizes,
             protocol=PrivacyProtocol("replace_one", node_examples=21))
  reference = simulation.run_simulation(definition, silos, backend="tff", **run)
  vectorized = simulation.run_simulation(definition, silos, backend="vectorized", **run)
  for ref, vec in zip(reference.silo_weights, vectorized.silo_weights):
    for a, b in zip(ref, vec):
      np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
  assert (vectorized.privacy.epsilon_spent <= 50.0).all()
  assert vectorized.privacy.protocol.name == "replace_one_node_21"
  scored = pipeline.evaluate(pipeline.scores(model, vectorized.silo_weights, silos),
                             silos.y_test)
  held_out = sum(len(y) for y in silos.y_test)   # a quarter of the households
  assert 0.15 * 2000 < scored["scored"] == held_out < 0.35 * 2000
  assert scored["positives"] == int(sum(y.sum() for y in silos.y_test)) > 0
  assert 0 < scored["average_precision"] <= 1 and math.isfinite(scored["lift"])


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_the_forecaster_sharded_trains_what_it_trains_unsharded(data_dir, scenario,
                                                                num_shards):
  """Each shard loads its own clients' folders; the AP of the pooled predictions
  (scored on the shards) and every silo's epsilon are the unsharded run's."""
  settings = pipeline.Settings(method="mrmtl", noise_multiplier=2.0, clip=5.0,
                               lam=0.001, batch_size=64, seed=4)
  alone = pipeline.train(scenario, settings)
  sharded = pipeline.train_sharded(
      data_dir, "scenario01", settings,
      lambda makes: [sharding.InProcess(m) for m in makes], num_shards)
  assert scenario.silos.num_silos == 3 and sharded["shards"] == num_shards
  assert sharded["average_precision"] == pytest.approx(alone["average_precision"],
                                                       rel=1e-4)
  for name in ("scored", "positives", "silos", "max_neighbourhoods", "epsilon_theorem",
               "epsilon_code", "delta_max", "guarantee", "rounds"):
    assert sharded[name] == alone[name], name
  assert sharded["shard_peak_memory_mb"] > 0


@pytest.mark.slow
def test_the_small_profile_is_plausible_and_learnable(tmp_path):
  """50,000 persons (PANDEMIC.md 4.5): the outbreak's figures in their ranges, 30 or
  more positives among the held-out quarter (a positive in every client), and
  MR-MTL's pooled AP on the held-out persons above the positive rate."""
  meta = synth.generate(str(tmp_path), "small", seed=0, scenarios=("scenario01",))
  stats = meta["statistics"]
  assert 0.01 <= stats["ever_infected_by_day_63"] <= 0.05
  assert 0.001 <= stats["final_week_positive_rate"] <= 0.005
  assert 0.2 <= stats["asymptomatic_share"] <= 0.5
  assert 4 <= stats["mean_i_days"] <= 8 and stats["max_i_days"] <= 14
  assert 0.05 <= stats["household_secondary_attack_rate"] <= 0.3
  assert 35 <= stats["mean_degree"] <= 60
  scenario = pipeline.load_scenario(str(tmp_path), "scenario01", mode="honest")
  positives = [y.sum() for y in scenario.silos.y_test]
  assert min(positives) >= 1 and sum(positives) >= 30
  measured = pipeline.train(scenario, pipeline.Settings(method="mrmtl"))
  assert measured["lift"] > 1.2
