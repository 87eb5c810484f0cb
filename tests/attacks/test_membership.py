"""Membership inference against silo models (tensorflow-privacy's tools)."""

import numpy as np
import pytest

from attacks import membership
from tff_silo import algorithms, evaluation, models, simulation
from tff_silo.backends.tff import process_for
from tff_silo.data import load_rotated_masked_digits, make_silos


def _linear_silos(rng, memorized: bool):
  """Two silos of y = x^T w; with `memorized`, only the training labels follow w
  (the test labels are shifted), so members have zero loss and non-members do not."""
  w = np.array([1.0, -2.0], np.float32)
  parts = ([], [], [], [])
  for _ in range(2):
    x_train, x_test = rng.normal(size=(200, 2)), rng.normal(size=(200, 2))
    shift = rng.uniform(1, 2, 200) if memorized else rng.normal(0, 0.5, 200)
    y_train = x_train @ w + (0 if memorized else rng.normal(0, 0.5, 200))
    for part, value in zip(parts, (x_train, y_train, x_test, x_test @ w + shift)):
      part.append(value)
  silos = make_silos("linear", "regression", *parts)
  return silos, [(w, np.zeros([], np.float32))] * 2


def test_members_with_zero_loss_are_found_in_every_silo():
  model = models.linear_regression(2)
  silos, weights = _linear_silos(np.random.default_rng(0), memorized=True)
  table = membership.attack_silo_models(model, weights, silos)
  assert list(table.silo) == ["0", "1", membership.ALL_SILOS]
  np.testing.assert_allclose(table.auc, 1.0)
  np.testing.assert_allclose(table.advantage, 1.0)
  assert list(table.members) == [200, 200, 400]


def test_a_model_that_did_not_memorize_leaves_a_coin_flip():
  model = models.linear_regression(2)
  silos, weights = _linear_silos(np.random.default_rng(1), memorized=False)
  overall = membership.attack_silo_models(model, weights, silos).iloc[-1]
  assert abs(overall.auc - 0.5) < 0.08 and overall.advantage < 0.15


def _brute_force_tpr(member, non_member, target):
  """The largest TPR over every threshold t (member if score >= t) with FPR <= target."""
  best = 0.0
  for t in np.concatenate([member, non_member]):
    if np.mean(non_member >= t) <= target:
      best = max(best, float(np.mean(member >= t)))
  return best


@pytest.mark.parametrize("memorized", [True, False])
def test_tpr_at_low_fpr_is_the_best_threshold_within_the_fpr(memorized):
  model = models.linear_regression(2)
  silos, weights = _linear_silos(np.random.default_rng(2), memorized=memorized)
  got = membership.loss_threshold_tpr(model, weights, silos, fprs=(0.0025, 0.01, 0.1))
  member = np.concatenate([-membership._scores(model, w, x, y)["loss"] for w, x, y in
                           zip(weights, silos.x_train, silos.y_train)])
  non_member = np.concatenate([-membership._scores(model, w, x, y)["loss"] for w, x, y
                               in zip(weights, silos.x_test, silos.y_test)])
  for target, tpr in got.items():
    assert tpr == pytest.approx(_brute_force_tpr(member, non_member, target))
  if memorized:   # zero-loss members: all found before any non-member
    assert got[0.0025] == 1.0
  else:
    assert got[0.1] < 0.3


@pytest.mark.tff
def test_silo_models_of_a_simulation_are_attacked_with_logits():
  silos = load_rotated_masked_digits(num_silos=4, test_fraction=0.5, seed=0)
  model = models.model_for(silos)
  process = process_for(
      algorithms.local_algorithm(model, silos.feature_shape,
                                 client_learning_rate=0.3, batch_size=16))
  result = simulation.run_simulation(process, silos, rounds=2)
  assert len(result.silo_weights) == 4
  # The returned weights are the ones the silos were evaluated with.
  evaluator = evaluation.SiloEvaluator(model)
  _, per_silo = evaluator(result.silo_weights, silos.x_test, silos.y_test)
  np.testing.assert_allclose(per_silo, result.silo_test_metric)
  table = membership.attack_silo_models(
      model, result.silo_weights, silos, attacks=("threshold", "threshold_entropy"))
  assert len(table) == 5 and table.auc.between(0, 1).all()
  assert set(table.best_attack) <= {"threshold", "threshold-entropy"}


def test_bad_inputs_are_one_line_errors():
  model = models.linear_regression(2)
  silos, weights = _linear_silos(np.random.default_rng(0), memorized=True)
  with pytest.raises(ValueError, match="attacks must be among threshold"):
    membership.attack_silo_models(model, weights, silos, attacks=("shadow",))
  with pytest.raises(ValueError, match="other than threshold need a multi-class model.s logits"):
    membership.attack_silo_models(model, weights, silos, attacks=("threshold_entropy",))
  with pytest.raises(ValueError, match="silo_weights has 1 models for 2 silos"):
    membership.attack_silo_models(model, weights[:1], silos)
