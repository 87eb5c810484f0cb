"""Attacks against the models and updates tff_silo produces.

* `attacks.dlg`: gradient inversion, DLG (Zhu et al. 2019) and iDLG (Zhao et al.
  2020): `reconstruct(model, gradients, method=..., iterations=..., seed=...)`.
* `attacks.models`: the sigmoid LeNet of the DLG setting, a client's gradient and
  its one-step update (-lr * gradient) and back.
* `attacks.defenses`: what the server observes under no defense, DP-SGD, clipping
  alone, or the Euclidean Laplace mechanism per layer (Galli et al. sec. 5.3).
* `attacks.metrics`: MSE, PSNR, SSIM, label accuracy, batch matching.
* `attacks.membership`: membership inference against trained silo models with
  tensorflow-privacy's tools (AUC and attacker advantage per silo and overall).

`python -m benchmarks.attacks` runs them against each defense. (In an absl binary,
import TensorFlow before `app.run` calls main: imported inside it, TF 2.14's Keras
cannot build the LeNet; `benchmarks.common.run_main(main, check_first=...)` does.)
"""
