"""The likelihood-ratio membership attack, offline variant (Carlini et al., "Membership
Inference Attacks From First Principles", IEEE S&P 2022, sec. IV and the offline
test of sec. VI-C), against silo models.

Shadow runs train the same federated method on random halves of every silo's
examples (train and test pooled, each example IN with probability 1/2, `splits`).
For each example the attacker fits a Gaussian to its statistic under the shadow
silo models that did not train on it (OUT) and scores the target model's statistic
by the one-sided likelihood of being above them: Phi((s - mu_out) / sigma_out).
The statistic is the logit-scaled confidence log(p_y / (1 - p_y)) for classifiers
(eq. 4) and the negated loss for regression. Members are each silo's training
examples; non-members its test examples.
"""

from __future__ import annotations

import numpy as np
from scipy import stats
import tensorflow as tf

from tff_silo.data.silos import SiloData, make_silos


def splits(silos: SiloData, num_shadows: int, seed: int) -> list:
  """Per shadow run, per silo, a boolean IN mask over the silo's pool (its training
  then test examples), each IN with probability 1/2 (at least one IN per silo)."""
  rng = np.random.default_rng([seed, 7])
  masks = []
  for _ in range(num_shadows):
    run = []
    for y, yt in zip(silos.y_train, silos.y_test):
      mask = rng.random(len(y) + len(yt)) < 0.5
      if not mask.any():
        mask[rng.integers(len(mask))] = True
      run.append(mask)
    masks.append(run)
  return masks


def _pools(silos: SiloData):
  return ([np.concatenate([x, xt]) for x, xt in zip(silos.x_train, silos.x_test)],
          [np.concatenate([y, yt]) for y, yt in zip(silos.y_train, silos.y_test)])


def shadow_silos(silos: SiloData, masks) -> SiloData:
  """The silos a shadow run trains on: each silo's IN examples (tested on its whole
  pool: the shadow's test figure is not used)."""
  xs, ys = _pools(silos)
  return make_silos(f"{silos.name}_shadow", silos.task,
                    [x[m] for x, m in zip(xs, masks)], [y[m] for y, m in zip(ys, masks)],
                    xs, ys, num_classes=silos.num_classes)


def statistic(model, weights, x, y) -> np.ndarray:
  """Per example: log(p_y / (1 - p_y)) of a multi-class model (computed from the
  logits without forming p), else minus the per-example loss."""
  outputs = model.apply_fn([tf.constant(w) for w in weights], tf.constant(x, tf.float32))
  if len(outputs.shape) == 2:
    logits = outputs.numpy().astype(np.float64)
    labels = np.asarray(y, np.int64)
    true = logits[np.arange(len(labels)), labels]
    others = logits.copy()
    others[np.arange(len(labels)), labels] = -np.inf
    return true - np.logaddexp.reduce(others, axis=1)
  return -model.loss_fn(outputs, tf.constant(y, tf.float32)).numpy().astype(np.float64)


def offline_scores(model, target_weights, silos: SiloData, shadow_weights,
                   masks) -> tuple:
  """(scores, is_member) over every silo's pool: the offline LiRA score of each
  example under its silo's target model, from the shadow runs where it was OUT.
  An example OUT in fewer than two shadows is scored against every OUT statistic of
  its silo (a pooled Gaussian)."""
  xs, ys = _pools(silos)
  scores, members = [], []
  for k, (x, y) in enumerate(zip(xs, ys)):
    target = statistic(model, target_weights[k], x, y)
    shadow = np.stack([statistic(model, run[k], x, y) for run in shadow_weights])
    out = ~np.stack([m[k] for m in masks])          # [shadows, examples]
    pooled = shadow[out]
    fallback = (pooled.mean(), max(pooled.std(), 1e-6)) if pooled.size else (0.0, 1.0)
    count = out.sum(axis=0)
    mean = np.where(out, shadow, 0.0).sum(axis=0) / np.maximum(count, 1)
    var = (np.where(out, shadow - mean, 0.0) ** 2).sum(axis=0) / np.maximum(count - 1, 1)
    enough = count >= 2
    mean = np.where(enough, mean, fallback[0])
    sd = np.where(enough, np.maximum(np.sqrt(var), 1e-6), fallback[1])
    score = stats.norm.cdf((target - mean) / sd)
    scores.append(score)
    members.append(np.arange(len(y)) < len(silos.y_train[k]))
  return np.concatenate(scores), np.concatenate(members)


def summary(scores, members, fprs=(0.001, 0.01)) -> dict:
  """ROC AUC and the TPR at each FPR (the largest with FPR at most it)."""
  from attacks import membership   # pylint: disable=g-import-not-at-top
  from sklearn.metrics import roc_auc_score   # pylint: disable=g-import-not-at-top
  return dict(auc=float(roc_auc_score(members, scores)),
              **{f"tpr_at_fpr_{f:g}": tpr for f, tpr in
                 membership.tpr_at_fpr(members, scores, fprs).items()})
