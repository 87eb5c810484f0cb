"""What the server observes from a client's one local step under each defense.

* `none`: the update delta = -lr * g of the mean cross-entropy gradient g.
* `dp_sgd`: DP-SGD's step (Abadi et al. 2016): each example's gradient clipped to
  L2 norm C, summed, N(0, (z C)^2) added, divided by the batch size
  (`tff_silo.privacy.dp_sgd.privatize`).
* `clip`: the same clipping with no noise (z = 0).
* `laplace`: the exact update sanitized layer by layer with the Euclidean Laplace
  mechanism at noise multiplier nu (Galli et al. Algorithm 2 and sec. 5.3;
  `tff_silo.privacy.d_privacy.sanitize_update`).

Each defense reports what it spent: `dp_sgd` the (epsilon, delta) of one unsampled
Gaussian mechanism (a client holding only this batch), `laplace` the d-privacy
leakage sum_layers n_l / nu, the factor by which the update's own neighbourhood is
distinguishable (Theorem 1 composed over layers); `none` and `clip` spend infinity.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import tensorflow as tf

from attacks import models
from attacks.choices import DEFENSES
from tff_silo.privacy import accounting, d_privacy, dp_sgd


@dataclasses.dataclass(frozen=True)
class Defense:
  """A defense and its parameter: `l2_norm_clip` (C) and `noise_multiplier` (z) for
  `dp_sgd` and `clip`, `nu` for `laplace`."""

  name: str = "none"
  l2_norm_clip: Optional[float] = None
  noise_multiplier: float = 0.0
  nu: Optional[float] = None

  def __post_init__(self):
    if self.name not in DEFENSES:
      raise ValueError(f"defense must be one of {', '.join(DEFENSES)}; got {self.name!r}")
    clipped = self.name in ("dp_sgd", "clip")
    if clipped and not (self.l2_norm_clip is not None and self.l2_norm_clip > 0):
      raise ValueError(f"{self.name} needs l2_norm_clip > 0, got {self.l2_norm_clip}")
    if self.name == "dp_sgd" and not self.noise_multiplier > 0:
      raise ValueError(f"dp_sgd needs noise_multiplier > 0 (clip alone is 'clip'), got "
                       f"{self.noise_multiplier}")
    if self.name != "dp_sgd" and self.noise_multiplier:
      raise ValueError(f"noise_multiplier is for dp_sgd only, not {self.name}")
    if self.name == "laplace" and not (self.nu is not None and self.nu > 0):
      raise ValueError(f"laplace needs nu > 0, got {self.nu}")

  @property
  def parameter(self) -> float:
    """The knob a sweep varies: z for dp_sgd, C for clip, nu for laplace."""
    return {"none": 0.0, "dp_sgd": self.noise_multiplier, "clip": self.l2_norm_clip,
            "laplace": self.nu}[self.name]

  def epsilon(self, delta: float, model: tf.keras.Model) -> float:
    """(epsilon at `delta`) of dp_sgd's one step on `model` (integer noise over its
    trainable coordinates); inf for none and clip; NaN for laplace (its guarantee is
    the leakage, not (epsilon, delta))."""
    if self.name == "dp_sgd":
      coordinates = sum(int(tf.size(v)) for v in model.trainable_variables)
      return accounting.epsilon_spent(self.noise_multiplier, 1.0, 1, delta,
                                      integer_coordinates=coordinates)
    return math.nan if self.name == "laplace" else math.inf

  def leakage(self, model: tf.keras.Model) -> float:
    """laplace's d-privacy leakage sum_l n_l / nu; NaN for the other defenses."""
    if self.name != "laplace":
      return math.nan
    return sum(int(tf.size(v)) for v in model.trainable_variables) / self.nu


def observed_update(model: tf.keras.Model, x, labels, *, learning_rate: float,
                    defense: Defense = Defense(), seed=(0, 0)):
  """The update -lr * g' a client sends after one SGD step on batch (x, labels),
  where g' is the gradient after `defense`; noise is seeded by int32[2] `seed`."""
  seed = tf.constant(seed, tf.int32)
  if defense.name in ("dp_sgd", "clip"):
    grads = dp_sgd.privatize(
        models.per_example_gradients(model, x, labels),
        l2_norm_clip=defense.l2_norm_clip, noise_multiplier=defense.noise_multiplier,
        normalizer=float(len(x)), seed=seed)
    return models.one_step_update(grads, learning_rate)
  update = models.one_step_update(models.gradients(model, x, labels), learning_rate)
  if defense.name == "laplace":
    update, _ = d_privacy.sanitize_update(update, defense.nu, seed)
  return update
