"""`attacks.lira`: the offline likelihood-ratio attack scores each example against
the shadow runs where it was OUT, as Carlini et al. define it, and finds members a
model memorized."""

import numpy as np
import pytest
from scipy import stats

from attacks import lira
from tff_silo import models
from tff_silo.data import make_silos

W = np.array([1.0, -2.0], np.float32)


def _silos(rng):
  """Two silos whose training targets follow W exactly and whose test targets are
  shifted: a model at W has memorized its members."""
  parts = ([], [], [], [])
  for _ in range(2):
    x, xt = rng.normal(size=(60, 2)), rng.normal(size=(60, 2))
    for part, value in zip(parts, (x, x @ W, xt, xt @ W + rng.uniform(1, 2, 60))):
      part.append(value)
  return make_silos("linear", "regression", *parts)


def _shadow_weights(rng, num_shadows):
  return [[(W + rng.normal(0, 0.3, 2).astype(np.float32), np.zeros([], np.float32))
           for _ in range(2)] for _ in range(num_shadows)]


def test_splits_put_each_example_in_half_the_shadows():
  silos = _silos(np.random.default_rng(0))
  masks = lira.splits(silos, 400, seed=1)
  share = np.mean([m[0] for m in masks], axis=0)   # per example of silo 0
  # 400 fair coins: each share within 4 standard deviations (0.1) of 1/2
  assert np.all(np.abs(share - 0.5) < 0.1) and len(share) == 120
  assert all(m[k].any() for m in masks for k in range(2))


def test_scores_are_the_one_sided_gaussian_likelihood_of_the_out_runs():
  rng = np.random.default_rng(2)
  silos = _silos(rng)
  model = models.linear_regression(2)
  shadows = _shadow_weights(rng, 6)
  masks = lira.splits(silos, 6, seed=3)
  target = [(W, np.zeros([], np.float32))] * 2
  scores, members = lira.offline_scores(model, target, silos, shadows, masks)
  k, i = 1, 70   # silo 1's 71st pool example: a test example (non-member)
  x = np.concatenate([silos.x_train[k], silos.x_test[k]])[i]
  y = np.concatenate([silos.y_train[k], silos.y_test[k]])[i]
  stat = lambda w: -0.5 * float(x @ w[0] + w[1] - y) ** 2
  out = [stat(run[k]) for run, m in zip(shadows, masks) if not m[k][i]]
  expected = stats.norm.cdf((stat(target[k]) - np.mean(out)) / np.std(out, ddof=1))
  assert scores[120 + i] == pytest.approx(expected, rel=1e-5)
  assert not members[120 + i] and members[:60].all()


def test_memorized_members_are_found():
  rng = np.random.default_rng(4)
  silos = _silos(rng)
  model = models.linear_regression(2)
  target = [(W, np.zeros([], np.float32))] * 2
  scores, members = lira.offline_scores(model, target, silos, _shadow_weights(rng, 8),
                                        lira.splits(silos, 8, seed=5))
  result = lira.summary(scores, members)
  assert result["auc"] > 0.9
  assert 0 <= result["tpr_at_fpr_0.001"] <= result["tpr_at_fpr_0.01"] <= 1
