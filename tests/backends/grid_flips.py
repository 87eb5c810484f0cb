"""How far integer noise's grid flips may move two computations of one DP-SGD run
apart (`tff_silo.privacy.integer_law`).

Two programs that compute a per-example gradient with other float roundings (other
kernels, fused multiply-adds, summation orders) round a contribution that lies within
those roundings of a half-integer of the grid one way and the other, a grid step
apart. Each such flip moves a step's update by lr grid / B per example and
coordinate, so the models agree within steps lr grid (all B examples flipping), twice
for what later steps inherit. The bound stays below half of one step's noise
(lr z C / B), a wrong draw's smallest effect, so a parity test within it still fails
on any other noise."""

from tff_silo.privacy import integer_law


def tolerance(privacy, lr: float, clip: float, batch: int) -> float:
  """The bound for a run's `SiloPrivacy` trained at (lr, clip, B)."""
  z = [integer_law.grid_noise_multiplier(float(v), privacy.integer_coordinates)
       for v in privacy.noise_multipliers]
  bound = 2.0 * float(privacy.steps.max()) * lr * max(z) * clip / integer_law.SIGMA
  assert bound < 0.5 * lr * min(z) * clip / batch, (bound, z)
  return bound
