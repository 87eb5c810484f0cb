"""`tff_silo.runs`: a saved run (silo, server and hypernetwork weights) loads
bit-exactly, is never replaced by another, holds a keyed data check only, versions
1 and 2 still load, and a file of another format or version, or damaged, fails in
one line."""

import json

import numpy as np
import pytest

import hypernet
from benchmarks import datasets
from tff_silo import algorithms, models, runs
from tff_silo.privacy import PrivacyProtocol
from tff_silo.evaluation import SiloEvaluator
from tff_silo.simulation import run_simulation

RECIPE = dict(dataset="synthetic", seed=3)


def _trained():
  silos, _ = datasets.load(RECIPE)
  model = models.model_for(silos)
  definition = algorithms.mrmtl_algorithm(model, silos.feature_shape,
                                          client_learning_rate=0.1, batch_size=8,
                                          lam=1.0, l2_norm_clip=1.0)
  result = run_simulation(definition, silos, rounds=2, target_epsilon=4.0,
                          target_delta=1e-3, backend="vectorized",
                          protocol=PrivacyProtocol(assumed_silo_size=30))
  return silos, model, result


def _save(folder, silos, model, result, key="k1"):
  return runs.save(str(folder), run_key=key, silo_weights=result.silo_weights,
                   server_weights=result.server_weights,
                   model=runs.model_spec(model, silos), data=RECIPE, silos=silos,
                   privacy=result.privacy, info=dict(test_metric=result.test_metric))


def test_a_saved_run_loads_bit_exactly_and_evaluates_the_same(tmp_path):
  silos, model, result = _trained()
  assert _save(tmp_path / "run", silos, model, result)
  saved = runs.load(str(tmp_path / "run"))
  assert len(saved.silo_weights) == silos.num_silos and len(saved.server_weights) == 1
  for ours, theirs in zip(saved.silo_weights + saved.server_weights,
                          result.silo_weights + result.server_weights):
    for a, b in zip(ours, theirs):
      assert a.dtype == np.float32 and np.array_equal(a, b)
  metric, _ = SiloEvaluator(saved.model())(list(saved.silo_weights), silos.x_test,
                                           silos.y_test)
  assert metric == pytest.approx(result.test_metric, rel=1e-6)
  assert saved.meta["privacy"]["epsilon_spent"] == [
      float(e) for e in result.privacy.epsilon_spent]
  saved.check_data(datasets.load(RECIPE)[0])   # the recipe rebuilds the same split
  with pytest.raises(ValueError, match="keras_model needs an image model"):
    saved.keras_model(0)
  with pytest.raises(ValueError, match="fingerprint mismatch"):
    saved.check_data(datasets.load(dict(RECIPE, seed=4))[0])


def test_a_saved_run_is_never_replaced(tmp_path):
  silos, model, result = _trained()
  assert _save(tmp_path / "run", silos, model, result)
  assert not _save(tmp_path / "run", silos, model, result)   # the same run: kept
  with pytest.raises(ValueError, match="holds another run; a saved run is never "
                     "replaced"):
    _save(tmp_path / "run", silos, model, result, key="k2")
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="exists and is not a saved run"):
    _save(tmp_path / "other", silos, model, result)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(version=0), "has format version 0; this tff_silo reads "
     "versions 1, 2, 3"),
    (lambda m: m.pop("version"), "has format version None"),
    (lambda m: m.update(format="other"), "has \"format\": 'other', not "
     "'tff_silo.run': not a run saved by tff_silo"),
    (lambda m: m.update(format=2), "has \"format\": 2, not 'tff_silo.run'"),
    (lambda m: m.pop("fingerprint"), "lacks 'fingerprint': damaged, or not written by "
     "tff_silo.runs.save"),
])
def test_other_formats_and_versions_fail_in_one_line(tmp_path, change, message):
  silos, model, result = _trained()
  _save(tmp_path / "run", silos, model, result)
  path = tmp_path / "run" / "run.json"
  meta = json.loads(path.read_text())
  change(meta)
  path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match=message) as raised:
    runs.load(str(tmp_path / "run"))
  assert "\n" not in str(raised.value)
  with pytest.raises(ValueError, match="is not a saved run"):
    runs.load(str(tmp_path))


def test_the_data_check_is_keyed_and_tells_nothing_without_the_key(tmp_path,
                                                                     monkeypatch):
  """run.json holds no plain hash of any silo's arrays (which would tell
  neighbouring datasets apart); the keyed check still refuses other data, and
  without the key it refuses in one line instead of guessing."""
  silos, model, result = _trained()
  _save(tmp_path / "run", silos, model, result)
  text = (tmp_path / "run" / "run.json").read_text()
  for plain in runs._digests(silos, None):   # pylint: disable=protected-access
    assert plain["train"] not in text and plain["test"] not in text
  saved = runs.load(str(tmp_path / "run"))
  assert saved.meta["version"] == 3
  assert saved.meta["fingerprint"]["scheme"] == "hmac-sha256"
  saved.check_data(silos)
  with pytest.raises(ValueError, match="fingerprint mismatch"):
    saved.check_data(datasets.load(dict(RECIPE, seed=4))[0])
  another = runs.fingerprint(silos, key=b"k" * 32)
  assert another["silos"] != saved.meta["fingerprint"]["silos"]
  monkeypatch.setenv("TFF_SILO_DATA_KEY", str(tmp_path / "elsewhere.key"))
  with pytest.raises(ValueError, match="not found at .*elsewhere.key") as raised:
    saved.check_data(silos)
  assert "\n" not in str(raised.value)
  assert not (tmp_path / "elsewhere.key").exists()   # checking never makes a key


def test_a_version_2_run_with_a_plain_fingerprint_still_loads_and_checks(tmp_path):
  silos, model, result = _trained()
  _save(tmp_path / "run", silos, model, result)
  path = tmp_path / "run" / "run.json"
  meta = json.loads(path.read_text())
  plain = runs._digests(silos, None)   # pylint: disable=protected-access
  meta.update(version=2, fingerprint=plain)
  path.write_text(json.dumps(meta))
  saved = runs.load(str(tmp_path / "run"))
  saved.check_data(silos)
  with pytest.raises(ValueError, match="fingerprint mismatch"):
    saved.check_data(datasets.load(dict(RECIPE, seed=4))[0])


@pytest.mark.parametrize("damage", ["truncate", "garble", "empty"])
def test_a_damaged_weights_file_fails_in_one_line_naming_it(tmp_path, damage):
  silos, model, result = _trained()
  _save(tmp_path / "run", silos, model, result)
  path = tmp_path / "run" / "weights.npz"
  content = path.read_bytes()
  path.write_bytes({"truncate": content[:len(content) // 2],
                    "garble": content[:200] + bytes(len(content) - 200),
                    "empty": b""}[damage])
  with pytest.raises(ValueError, match="weights.npz") as raised:
    runs.load(str(tmp_path / "run"))
  assert "\n" not in str(raised.value)


def test_a_version_1_run_loads_without_server_models(tmp_path):
  """Version 1 wrote silo models only: it loads, with no server models."""
  silos, model, result = _trained()
  folder = tmp_path / "run"
  runs.save(str(folder), run_key="k1", silo_weights=result.silo_weights,
            model=runs.model_spec(model, silos), data=RECIPE, silos=silos)
  meta = json.loads((folder / "run.json").read_text())
  (folder / "run.json").write_text(json.dumps(dict(meta, version=1)))
  saved = runs.load(str(folder))
  assert saved.server_weights == () and saved.hypernetwork_weights is None
  assert np.array_equal(saved.silo_weights[2][0], result.silo_weights[2][0])
  with pytest.raises(ValueError, match="holds no hypernetwork"):
    hypernet.from_saved_run(saved)


def test_fedavg_saves_the_global_model_every_silo_is_evaluated_with():
  """(The backends' server models are tied by tests/backends/test_vectorized.py.)"""
  silos, _ = datasets.load(RECIPE)
  definition = algorithms.fedavg_algorithm(models.model_for(silos), silos.feature_shape,
                                           client_learning_rate=0.1, batch_size=8)
  result = run_simulation(definition, silos, rounds=2, backend="vectorized")
  assert len(result.server_weights) == 1
  for a, b in zip(result.server_weights[0], result.silo_weights[4]):
    assert np.array_equal(a, b)


def test_a_hypernetwork_run_round_trips_and_regenerates_its_users(tmp_path):
  from tff_silo.privacy.user_level import UserDPSettings
  silos = datasets.hypernet_users(dict(hypernet_dataset="digits", seed=0, num_users=4,
                                       classes_per_user=2))
  target = models.small_cnn(silos.feature_shape, 10, channels=(2, 4), hidden=8)
  network = hypernet.Hypernetwork(target, 4, 2, hidden_width=8)
  settings = UserDPSettings(sampling_rate=0.5, l2_norm_clip=0.1, noise_multiplier=1.0)
  algorithm = hypernet.hypernet_algorithm(
      network, silos.feature_shape, silos.train_sizes, settings,
      client_learning_rate=0.05, batch_size=8, local_steps=1,
      hypernet_learning_rate=0.1, embedding_learning_rate=0.1)
  result = hypernet.run_hypernet(algorithm, silos, rounds=2, target_delta=1e-5,
                                 backend="vectorized")
  model = runs.model_spec(target, silos, name="small_cnn", channels=[2, 4], hidden=8)
  model["hypernetwork"] = dict(num_users=4, embedding_dim=2, hidden_width=8)
  privacy = runs.user_level_privacy(settings, result.epsilon, 1e-5, 4)
  runs.save(str(tmp_path / "hn"), run_key="hn", silo_weights=result.silo_weights,
            model=model, hypernetwork=(result.phi, result.embeddings),
            data=dict(hypernet_dataset="digits", seed=0, num_users=4,
                      classes_per_user=2), silos=silos, privacy=privacy)
  saved = runs.load(str(tmp_path / "hn"))
  network, phi, embeddings = hypernet.from_saved_run(saved)
  assert np.array_equal(embeddings, result.embeddings)
  regenerated = network.generate(phi, embeddings[3])
  for ours, theirs in zip(regenerated, saved.silo_weights[3]):
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-5, atol=1e-6)
  assert saved.meta["privacy"]["unit"] == "user"
  assert saved.meta["privacy"]["epsilon_spent"] == [result.epsilon] * 4
  assert saved.keras_model(0)(silos.x_test[0][:2]).shape == (2, 10)
  with pytest.raises(ValueError, match="saved together"):
    runs.save(str(tmp_path / "bad"), run_key="x", silo_weights=result.silo_weights,
              model=model, data={}, silos=silos)


@pytest.mark.parametrize("shape, hidden", [((8, 8, 1), None), ((28, 28, 1), 16)])
def test_the_keras_model_computes_what_the_cnn_computes(shape, hidden):
  import tensorflow as tf
  from tff_silo.models import cnn
  model = models.small_cnn(shape, 10, channels=(4, 8), hidden=hidden)
  weights = model.init_fn(3)
  x = np.random.default_rng(0).uniform(size=(5, *shape)).astype(np.float32)
  ours = model.apply_fn([tf.constant(w) for w in weights], tf.constant(x)).numpy()
  theirs = cnn.to_keras(weights, shape)(x).numpy()
  np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-6)
