"""Membership inference against the silo models this library trains (Shokri et al.
2017; the loss-threshold attack of Yeom et al. 2018), run with tensorflow-privacy's
membership inference tools (published as tensorflow-empirical-privacy since 0.9.0).

Each silo's members are its training examples and its non-members its held-out test
examples; the attacker scores every example with that silo's own final model (loss,
and logits for classifiers). Reported per silo and overall (all silos' examples
pooled, each scored by its own silo's model): the ROC AUC of the best attack and its
attacker advantage max_t |TPR - FPR| (Yeom et al.). 0.5 / 0 is a coin flip.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pandas as pd
import tensorflow as tf

from attacks import choices
from tff_silo.data.silos import SiloData
from tff_silo.models.functional import SiloModel

# Our names for the tool's AttackType members.
_ATTACK_TYPES = choices.MIA_ATTACK_TYPES
ATTACKS = choices.MIA_ATTACKS
ALL_SILOS = "all"


def _mia():
  """tensorflow-privacy's MIA modules (imported late: they pull in sklearn)."""
  from tensorflow_privacy.privacy.privacy_tests.membership_inference_attack import \
      data_structures, membership_inference_attack
  return data_structures, membership_inference_attack


def _check_attacks(attacks):
  if not attacks or any(a not in ATTACKS for a in attacks):
    raise ValueError(f"attacks must be among {', '.join(ATTACKS)}; got {attacks}")


def _scores(model: SiloModel, weights, x, y):
  """Per-example loss, and logits and integer labels for a multi-class model."""
  outputs = model.apply_fn([tf.constant(w) for w in weights], tf.constant(x, tf.float32))
  loss = model.loss_fn(outputs, tf.constant(y, tf.float32)).numpy()
  if len(outputs.shape) == 2:
    return dict(loss=loss, logits=outputs.numpy(), labels=np.asarray(y, np.int64))
  return dict(loss=loss)


def _attack(member, non_member, attacks):
  data_structures, mia = _mia()
  kind = data_structures.AttackType
  types = [getattr(kind, _ATTACK_TYPES[a]) for a in attacks]
  if "logits" not in member and set(attacks) != {"threshold"}:
    raise ValueError("attacks other than threshold need a multi-class model's logits; "
                     "this model has one output: use attacks=('threshold',)")
  inputs = data_structures.AttackInputData(
      loss_train=member["loss"], loss_test=non_member["loss"],
      logits_train=member.get("logits"), logits_test=non_member.get("logits"),
      labels_train=member.get("labels"), labels_test=non_member.get("labels"))
  logger = logging.getLogger()
  level = logger.level
  logger.setLevel(logging.ERROR)   # the tool logs every slice and low AUCs
  try:
    with warnings.catch_warnings():   # and warns in its epsilon lower bounds
      warnings.simplefilter("ignore", RuntimeWarning)
      results = mia.run_attacks(
          inputs, data_structures.SlicingSpec(entire_dataset=True), attack_types=types)
      best = results.get_result_with_max_auc()
      auc, advantage = float(best.get_auc()), float(best.get_attacker_advantage())
  finally:
    logger.setLevel(level)
  return dict(auc=auc, advantage=advantage, best_attack=best.attack_type.value,
              members=len(member["loss"]), non_members=len(non_member["loss"]))


def attack_silo_models(model: SiloModel, silo_weights, data: SiloData, *,
                       attacks=("threshold",)) -> pd.DataFrame:
  """Attacks every silo's model on its own train (members) vs test (non-members).

  Args:
    model: the silos' model (`SimulationResult` of `run_simulation` was trained
      with it).
    silo_weights: one weight tuple per silo (`SimulationResult.silo_weights`).
    data: the silos the models were trained on.
    attacks: names from `ATTACKS`; the best AUC among them is reported. Trained
      attacks need a few examples of each kind per silo.

  Returns:
    One row per silo and a last row `silo == "all"`: auc, advantage, best_attack,
    members, non_members.
  """
  _check_attacks(attacks)
  if len(silo_weights) != data.num_silos:
    raise ValueError(f"silo_weights has {len(silo_weights)} models for "
                     f"{data.num_silos} silos")
  rows, members, non_members = [], [], []
  for k, weights in enumerate(silo_weights):
    member = _scores(model, weights, data.x_train[k], data.y_train[k])
    non_member = _scores(model, weights, data.x_test[k], data.y_test[k])
    if len(member["loss"]) and len(non_member["loss"]):
      rows.append(dict(silo=str(k), **_attack(member, non_member, attacks)))
    members.append(member)
    non_members.append(non_member)
  pooled = [{key: np.concatenate([s[key] for s in part]) for key in part[0]}
            for part in (members, non_members)]
  rows.append(dict(silo=ALL_SILOS, **_attack(*pooled, attacks)))
  return pd.DataFrame(rows)


def loss_threshold_tpr(model: SiloModel, silo_weights, data: SiloData,
                       fprs=(0.001, 0.01)) -> dict:
  """The loss-threshold attack over all silos pooled (each example scored by its
  own silo's model; lower loss: member) at low false-positive rates, as the field
  now reports (Carlini et al. 2022): {fpr: the largest TPR of a threshold whose FPR
  is at most fpr}. With n non-members an FPR below 1/n is reached only at FPR 0."""
  scores, labels = [], []
  for k, weights in enumerate(silo_weights):
    for x, y, member in ((data.x_train[k], data.y_train[k], 1),
                         (data.x_test[k], data.y_test[k], 0)):
      if len(y):
        scores.append(-_scores(model, weights, x, y)["loss"])
        labels.append(np.full(len(y), member))
  return tpr_at_fpr(np.concatenate(labels), np.concatenate(scores), fprs)


def tpr_at_fpr(is_member, scores, fprs) -> dict:
  """{fpr: the largest TPR of a threshold on `scores` (higher: member) whose FPR is
  at most fpr}."""
  from sklearn.metrics import roc_curve   # pylint: disable=g-import-not-at-top
  fpr, tpr, _ = roc_curve(is_member, scores)
  return {target: float(tpr[fpr <= target].max()) for target in fprs}
