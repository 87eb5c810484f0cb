"""RDP curves of the subsampled Gaussian for many settings at once (numpy).

dp_accounting computes one (q, z) at a time in Python loops (~70 ms a setting over
`accounting.RDP_ORDERS`, most of it in the fractional orders; seconds under
sampling without replacement). Here every function takes arrays of settings and
returns a (settings, orders) array, with the same formulas and the same numerics,
so that a run's distinct silo settings calibrate and account together:
- `poisson_gaussian`: the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019):
  integer orders in closed form (sec. 3.3, eq. for A_alpha), fractional ones by the
  two-sided series that dp_accounting sums until a term is below e^-30;
- `without_replacement_gaussian`: sampling without replacement under replace-one
  (Wang, Balle, Kasiviswanathan 2019, Thm. 27 with the Gaussian's CGF; fractional
  orders by the interpolation of their Cor. 10);
- `event_curve`: the RDP curve of a `DpEvent` built of those (and Gaussians,
  selections, compositions), anything else composed by dp_accounting itself.

tests/privacy/test_rdp_curves.py ties every function to dp_accounting's on grids of
settings; the calibration (`accounting`) still confirms every multiplier with
dp_accounting's own accountant.
"""

from __future__ import annotations

import functools

import dp_accounting
import numpy as np
import scipy.special

_LOG_TERM_FLOOR = -30.0   # dp_accounting stops its fractional series below e^-30


def gaussian(noise_multipliers, orders) -> np.ndarray:
  """alpha / (2 z^2): the Gaussian mechanism's RDP (inf at z = 0)."""
  z = np.asarray(noise_multipliers, np.float64)[:, None]
  with np.errstate(divide="ignore"):
    return np.asarray(orders, np.float64)[None, :] / (2.0 * z * z)


@functools.lru_cache(maxsize=64)
def _segments(alphas: tuple):
  """Flat (alpha, i) pairs, i = 0..alpha for each integer alpha, with each alpha's
  start offset and log C(alpha, i)."""
  alpha = np.concatenate([np.full(int(a) + 1, a) for a in alphas])
  i = np.concatenate([np.arange(int(a) + 1) for a in alphas]).astype(np.float64)
  starts = np.cumsum([0] + [int(a) + 1 for a in alphas[:-1]])
  log_comb = (scipy.special.gammaln(alpha + 1) - scipy.special.gammaln(i + 1)
              - scipy.special.gammaln(alpha - i + 1))
  return alpha, i, starts, log_comb


def _segment_logsumexp(terms, starts):
  """log sum exp of each segment (columns starts[j]..starts[j+1]-1) of each row."""
  top = np.maximum.reduceat(terms, starts, axis=1)
  finite = np.where(np.isfinite(top), top, 0.0)
  index = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, terms.shape[1])))
  with np.errstate(divide="ignore"):
    return np.log(np.add.reduceat(np.exp(terms - finite[:, index]), starts, axis=1)) + finite


def _poisson_log_a_int(q, z, alphas):
  """log A_alpha = log sum_i C(alpha, i) q^i (1-q)^(alpha-i) e^((i^2-i)/(2z^2)),
  integer alphas, 0 < q < 1, z > 0."""
  alpha, i, starts, log_comb = _segments(tuple(int(a) for a in alphas))
  terms = (log_comb + i * np.log(q)[:, None] + (alpha - i) * np.log1p(-q)[:, None]
           + (i * i - i) / (2.0 * z * z)[:, None])
  return _segment_logsumexp(terms, starts)


def _log_erfc(x):
  return np.log(2.0) + scipy.special.log_ndtr(-x * np.sqrt(2.0))


def _poisson_log_a_frac(q, z, alphas):
  """log A_alpha for fractional alphas: the two series (integrals below and above
  z0 = z^2 log(1/q - 1) + 1/2), each term until and including the first whose two
  parts are both below e^-30, as dp_accounting sums them."""
  q, z = q[:, None, None], z[:, None, None]
  alpha = np.asarray(alphas, np.float64)[None, :, None]
  z0 = z * z * np.log(1.0 / q - 1.0) + 0.5
  terms = 64
  while True:
    i = np.arange(terms, dtype=np.float64)[None, None, :]
    j = alpha - i
    coef = scipy.special.binom(alpha, i)
    log_coef = np.log(np.abs(coef))
    s0 = (log_coef + i * np.log(q) + j * np.log1p(-q) + (i * i - i) / (2 * z * z)
          + np.log(0.5) + _log_erfc((i - z0) / (np.sqrt(2.0) * z)))
    s1 = (log_coef + j * np.log(q) + i * np.log1p(-q) + (j * j - j) / (2 * z * z)
          + np.log(0.5) + _log_erfc((z0 - j) / (np.sqrt(2.0) * z)))
    below = np.maximum(s0, s1) < _LOG_TERM_FLOOR
    if below.any(axis=2).all():
      break
    terms *= 2
  last = np.argmax(below, axis=2)[..., None]   # the first term below the floor
  keep = np.arange(terms)[None, None, :] <= last
  sign = np.where(keep, np.sign(coef), 0.0)
  both = np.concatenate([s0, s1], axis=2)
  return scipy.special.logsumexp(both, axis=2, b=np.concatenate([sign, sign], axis=2))


def poisson_gaussian(sampling_rates, noise_multipliers, orders) -> np.ndarray:
  """RDP of one Poisson-subsampled Gaussian step at each (q, z) pair and order
  (dp_accounting's `_compute_rdp_poisson_subsampled_gaussian`, vectorized)."""
  q = np.asarray(sampling_rates, np.float64)
  z = np.asarray(noise_multipliers, np.float64)
  orders = np.asarray(orders, np.float64)
  out = gaussian(z, orders)   # q = 1 (and inf where z = 0)
  inner = (q > 0) & (q < 1) & (z > 0)
  if inner.any():
    integer = orders == np.round(orders)
    qi, zi = q[inner], z[inner]
    part = np.empty((len(qi), len(orders)))
    if integer.any():
      part[:, integer] = _poisson_log_a_int(qi, zi, orders[integer])
    if (~integer).any():
      part[:, ~integer] = _poisson_log_a_frac(qi, zi, orders[~integer])
    out[inner] = part / (orders - 1.0)
  out[q == 0] = 0.0
  return out


def _forward_differences(sigma, n):
  """dp_accounting's `_get_forward_diffs` of the Gaussian's CGF x (x+1) / (2 sigma^2)
  for each sigma: log |Delta^(i+1) exp(cgf)| at -1, i = 0..n+1 (signed log-space
  differences, in its arithmetic)."""
  x = np.arange(-1.0, n + 2.0)[None, :]
  vec = x * (x + 1.0) / (2.0 * sigma[:, None] ** 2)
  vec[:, 0] = 0.0
  signs = np.ones_like(vec, dtype=bool)
  deltas = np.empty((len(sigma), n + 2))
  with np.errstate(divide="ignore", invalid="ignore"):
    for level in range(n + 2):
      m = n + 2 - level
      lo, hi, s_lo, s_hi = vec[:, :m], vec[:, 1:m + 1], signs[:, :m], signs[:, 1:m + 1]
      # same signs: log |e^hi - e^lo| (the sign flips with the operands' sign)
      greater = hi > lo
      big, small = np.where(greater, hi, lo), np.where(greater, lo, hi)
      sub = np.where(hi == lo, -np.inf, big + np.log(1 - np.exp(small - big)))
      sub_sign = np.where(s_hi, greater | (hi == lo), ~(greater | (hi == lo)))
      # different signs: log(e^lo + e^hi), the sign of hi
      a, b = np.minimum(lo, hi), np.maximum(lo, hi)
      add = np.where(a == -np.inf, b, np.log1p(np.exp(a - b)) + b)
      same = s_lo == s_hi
      vec[:, :m] = np.where(same, sub, add)
      signs[:, :m] = np.where(same, sub_sign, s_hi)
      deltas[:, level] = vec[:, 0]
  return deltas


def _without_replacement_log_a_int(q, sigma, alphas):
  """log A_alpha of Wang et al.'s Thm. 27 bound for integer alphas in 2..256,
  0 < q < 1: log(1 + sum_{i>=2} q^i C(alpha, i) min(...))."""
  n = int(max(alphas))
  deltas = _forward_differences(sigma, n)
  cgf = lambda x: x * (x + 1.0) / (2.0 * sigma[:, None] ** 2)
  i = np.arange(3, n + 1, dtype=np.float64)
  lo = deltas[:, (2 * np.floor(i / 2) - 1).astype(int)]
  hi = deltas[:, (2 * np.ceil(i / 2) - 1).astype(int)]
  bound = np.minimum(np.log(4.0) + 0.5 * (lo + hi), np.log(2.0) + cgf(i[None, :] - 1))
  f2 = 1.0 / sigma ** 2
  with np.errstate(divide="ignore"):
    bound2 = np.minimum(np.log(4.0) + f2 + np.log(1 - np.exp(-f2)), f2 + np.log(2.0))
  per_i = np.concatenate([np.zeros((len(sigma), 2)), bound2[:, None], bound], axis=1)
  alpha, i, starts, log_comb = _segments(tuple(int(a) for a in alphas))
  # i = 0 carries the 1, i = 1 has no term
  terms = np.where(i == 0, 0.0, -np.inf) + np.zeros((len(q), 1))
  rest = i >= 2
  terms[:, rest] = (i[rest] * np.log(q)[:, None] + log_comb[rest]
                    + per_i[:, i[rest].astype(int)])
  return _segment_logsumexp(terms, starts)


def without_replacement_gaussian(sampling_rates, noise_multipliers, orders) -> np.ndarray:
  """RDP of one step of m = q n examples sampled without replacement, Gaussian noise
  multiplier `noise_multipliers` (relative to the replace-one sensitivity), at each
  pair and order (dp_accounting's `_compute_rdp_sample_wor_gaussian`, vectorized)."""
  q = np.asarray(sampling_rates, np.float64)
  sigma = np.asarray(noise_multipliers, np.float64)
  orders = np.asarray(orders, np.float64)
  if orders.max() > 256:
    raise ValueError(f"orders above 256 are not supported, got {orders.max()}")
  out = gaussian(sigma, orders)   # q = 1
  inner = (q > 0) & (q < 1) & (sigma > 0)
  if inner.any():
    floors, ceils = np.floor(orders), np.ceil(orders)
    needed = sorted({int(a) for a in np.concatenate([floors, ceils]) if a >= 2})
    log_a = dict(zip(needed, _without_replacement_log_a_int(
        q[inner], sigma[inner], needed).T))
    zero = np.zeros(int(inner.sum()))
    at = lambda a: log_a[int(a)] if a >= 2 else zero
    t = orders - floors
    out[inner] = np.stack([((1 - ti) * at(f) + ti * at(c)) / (a - 1.0)
                           for a, f, c, ti in zip(orders, floors, ceils, t)], axis=1)
  out[q == 0] = 0.0
  return out


def event_curve(event: dp_accounting.DpEvent, accountant_factory) -> np.ndarray:
  """The RDP curve (at the factory's accountant's orders) of `event`: Gaussians,
  Poisson-sampled and without-replacement Gaussians, self-compositions and
  compositions here; anything else composed by `accountant_factory()` (an empty
  dp_accounting RDP accountant under the relation; it also checks that the event
  may be composed under it)."""
  accountant = accountant_factory()
  orders = np.asarray(accountant._orders)   # pylint: disable=protected-access
  if not accountant.supports(event):
    raise ValueError(f"{event} cannot be accounted under "
                     f"{accountant._neighboring_relation}")   # pylint: disable=protected-access
  return _curve(event, orders, accountant_factory)


def _curve(event, orders, accountant_factory):
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return event.count * _curve(event.event, orders, accountant_factory)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return sum((_curve(e, orders, accountant_factory) for e in event.events),
               np.zeros(len(orders)))
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return np.zeros(len(orders))
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return gaussian([event.noise_multiplier], orders)[0]
  if (isinstance(event, dp_accounting.PoissonSampledDpEvent)
      and type(event.event) is dp_accounting.GaussianDpEvent):   # pylint: disable=unidiomatic-typecheck
    return poisson_gaussian([event.sampling_probability],
                            [event.event.noise_multiplier], orders)[0]
  if (isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent)
      and type(event.event) is dp_accounting.GaussianDpEvent):   # pylint: disable=unidiomatic-typecheck
    return without_replacement_gaussian(
        [event.sample_size / event.source_dataset_size],
        [event.event.noise_multiplier], orders)[0]
  accountant = accountant_factory()
  accountant.compose(event)
  return accountant._rdp.copy()   # pylint: disable=protected-access


def epsilons(orders, rdp, deltas) -> tuple[np.ndarray, np.ndarray]:
  """dp_accounting's `compute_epsilon` for each row of `rdp` (settings, orders) at
  its delta: (epsilon, index of the optimal order) per row; inf where delta <= 0
  (where dp_accounting would give 0 for a zero curve, the callers answer first)."""
  orders = np.asarray(orders, np.float64)[None, :]
  rdp = np.asarray(rdp, np.float64)
  delta = np.asarray(deltas, np.float64)[:, None] + np.zeros((len(rdp), 1))
  with np.errstate(divide="ignore", invalid="ignore"):
    eps = rdp + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0)
    eps = np.where(orders > 1.01, eps, np.inf)
    eps = np.where(delta ** 2 + np.expm1(-rdp) > 0, 0.0, eps)
  eps = np.where(np.isnan(eps), np.inf, eps)
  best = np.argmin(eps, axis=1)
  value = np.maximum(0.0, eps[np.arange(len(eps)), best])
  return np.where(delta[:, 0] > 0, value, np.inf), best
