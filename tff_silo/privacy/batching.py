"""How many examples a silo's DP-SGD step takes and how many steps an epoch has: the
one arithmetic the accounting charges (`silo_accounts.calibrate_silos`) and the
training runs (`tff_silo.algorithms.local_training.batch_plan`), written once for
numpy (the accounting's arrays) and TensorFlow (the training's tensors).

Poisson batches follow the silo's public size m (the protocol's: its n when sizes
are public, an assumed size otherwise), so nothing depends on a private n; batches
drawn without replacement (replace-one, n public) and shuffled epochs follow n.
"""

from __future__ import annotations


def batch_plan(xp, batches: str, batch_size: int, n, m):
  """(the size the steps follow, batch size min(B, it), steps per epoch
  max(1, floor(it / batch))), elementwise over the silos' true sizes `n` and public
  sizes `m` (integers of either library; `xp` is `numpy` or `tensorflow`). The
  sampling rate is batch / size, in the caller's precision."""
  size = m if batches == "poisson" else n
  batch = xp.minimum(batch_size, size)
  return size, batch, xp.maximum(1, size // batch)
