"""Server aggregators by name: the binaries' `--aggregator` choices, and a user's own
`tff.aggregators` factory given as "module.path:callable".

Built-ins (TFF 0.87's factories; any but the two plain means runs on TFF's runtime
only):
  mean             the mean weighted by the silos' public sizes (the default);
  unweighted_mean  every silo weighs the same;
  robust           `tff.learning.robust_aggregator`: adaptive zeroing of updates with
                   outsized norms and adaptive norm clipping around the weighted mean;
  dp_fixed         central Gaussian DP over silos with a fixed clip (what
                   `DifferentiallyPrivateFactory.gaussian_fixed` computes, on the
                   integer mechanism: `user_level_factory.DPMeanFactory`);
  dp_adaptive      TFF's `gaussian_adaptive`: the same with its clip adapted to a
                   quantile of the update norms (its noise multiplier covers the
                   clipped-count queries too; float noise);
  compressed       the weighted mean of updates whose every tensor is quantized to
                   8 bits (uniform, stochastic rounding: TFF's
                   `EncodedSumFactory.quantize_above_threshold` with threshold 0;
                   `tff.learning.compression_aggregator` leaves tensors of fewer
                   than 20,000 values, all of School's, unquantized).

The DP factories give silo-level DP (thesis Fig. 1.1: a silo's whole update is the
unit, add/remove one silo), another granularity than the silos' example-level DP:
every silo takes part every round, so T rounds are T Gaussian releases of noise
multiplier z, accounted with dp_accounting's RDP (`AggregatorChoice.silo_epsilon`).
What that covers: the server's aggregates (the global model) and whatever is
computed from them alone; not the personalized models each silo computes from its
own data on top, nor their metrics or saved weights (`SILO_GUARANTEE_COVERS`).
dp_fixed's noise is integer (`integer_gaussian`: as private as the Gaussian for the
numbers computed, the table's gap per coordinate its delta tail); dp_adaptive is
TFF's factory, which draws TensorFlow's normals, whose support stops at 5.68
standard deviations (`privacy.gaussian`): the delta that costs is its tail, and
their grid is not accounted (rows label it idealized). The tail,
`AggregatorChoice.silo_delta_tail`, is added to the silo-level delta a run reports.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Optional

SILO_GUARANTEE_COVERS = ("the server's aggregates (the global model) and what is "
                         "computed from them alone; not the personalized models, their "
                         "metrics or saved silo weights")
# TensorFlow's Box-Muller normals: the radius's uniform is clamped at 1e-7
TF_NORMAL_CLAMP = 1e-7
TF_NORMAL_RADIUS = math.sqrt(-2.0 * math.log(TF_NORMAL_CLAMP))   # 5.678
BUILTINS = ("mean", "unweighted_mean", "robust", "dp_fixed", "dp_adaptive", "compressed")
DP_BUILTINS = ("dp_fixed", "dp_adaptive")
PLAIN = ("mean", "unweighted_mean")   # the vectorized backend runs these


@dataclasses.dataclass(frozen=True)
class AggregatorChoice:
  """An aggregator as a run records it.

  Attributes:
    name: the built-in's name, or the "module.path:callable" given.
    factory: what the algorithms take as `aggregator=` (a name for the plain means,
      else a `tff.aggregators` factory).
    params: the settings that determine it (recorded in a run's rows).
    noise_multiplier: DP factories: z of each round's Gaussian release over silos.
  """
  name: str
  factory: object
  params: dict
  noise_multiplier: Optional[float] = None

  @property
  def silo_level_dp(self) -> bool:
    return self.noise_multiplier is not None

  @property
  def plain(self) -> bool:
    """Whether it is one of the plain means (which the vectorized backend runs)."""
    return self.name in PLAIN

  @property
  def weighted(self) -> bool:
    """Whether the silos' public sizes weigh it (IFCA needs a weighted one)."""
    if self.name in PLAIN:
      return self.name == "mean"
    import tensorflow_federated as tff   # pylint: disable=g-import-not-at-top
    return isinstance(self.factory, tff.aggregators.WeightedAggregationFactory)

  def silo_epsilon(self, rounds: int, delta: float) -> float:
    """Silo-level epsilon at `delta` of `rounds` rounds (add/remove one silo); inf
    for an aggregator without DP."""
    if not self.silo_level_dp:
      return math.inf
    return _epsilon(self.noise_multiplier, rounds, delta)

  def silo_delta_tail(self, rounds: int, dimension: int) -> float:
    """What the noise's sampler adds to the silo-level delta over `rounds` releases
    of a `dimension`-value aggregate: dp_fixed, the integer table's gap
    (`integer_law.release_tail`); dp_adaptive, TF's bounded normals (and its
    clipped count's): per round, a union over noise pairs of a radius above
    5.678 - 1/z (where a silo's shift of at most 1/z deviations meets the bound)
    and of the 1e-7 clamped mass."""
    if not self.silo_level_dp:
      return 0.0
    if self.name == "dp_fixed":
      from tff_silo.privacy import integer_law   # pylint: disable=g-import-not-at-top
      return min(1.0, integer_law.release_tail(int(rounds) * int(dimension)))
    pairs = -(-int(dimension) // 2) + 1   # (the count's pair)
    shift = 1.0 / self.noise_multiplier
    if shift >= TF_NORMAL_RADIUS:
      return 1.0
    tail = math.exp(-(TF_NORMAL_RADIUS - shift) ** 2 / 2)
    per_round = pairs * (tail + TF_NORMAL_CLAMP)
    return min(1.0, rounds * per_round)


def _event(noise_multiplier: float, rounds: int):
  import dp_accounting   # pylint: disable=g-import-not-at-top
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.GaussianDpEvent(noise_multiplier), rounds)


def _epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
  """What `silo_noise_multiplier` calibrates: the same RDP computation."""
  from tff_silo.privacy import accounting, tuning   # pylint: disable=g-import-not-at-top
  return tuning.tuned_epsilon(_event(noise_multiplier, rounds), None, delta,
                              orders=accounting.RDP_ORDERS, tail=0.0)


def silo_noise_multiplier(epsilon: float, rounds: int, delta: float) -> float:
  """The least z (never overshooting) with which `rounds` Gaussian releases over
  silos are (epsilon, delta)-DP at the silo level."""
  from tff_silo.privacy import accounting, tuning   # pylint: disable=g-import-not-at-top
  return tuning.calibrate_noise(epsilon, delta, lambda z: _event(z, rounds),
                                orders=accounting.RDP_ORDERS)


def choose(spec: str, *, num_silos: int, rounds: int, silo_epsilon=None,
           silo_delta=None, clip: float = 1.0) -> AggregatorChoice:
  """The aggregator `spec` names (a built-in or "module.path:callable") for a run of
  `rounds` rounds over `num_silos` silos. The DP built-ins need `silo_epsilon` and
  `silo_delta` (their z is calibrated to them); `clip` is dp_fixed's clip of a
  silo's update (dp_adaptive's initial one). Raises ValueError in one line."""
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"aggregator must be one of {', '.join(BUILTINS)} or "
                     f"module.path:callable; got {spec!r}")
  if ":" in spec:
    if silo_epsilon is not None:
      raise ValueError("silo_epsilon applies to the built-in DP aggregators "
                       f"({', '.join(DP_BUILTINS)}) only")
    return AggregatorChoice(spec, user_factory(spec), {})
  if spec not in BUILTINS:
    raise ValueError(f"aggregator must be one of {', '.join(BUILTINS)} or "
                     f"module.path:callable; got {spec!r}")
  if (spec in DP_BUILTINS) != (silo_epsilon is not None):
    raise ValueError(f"aggregator={spec}: " + (
        "give its silo_epsilon (the silo-level budget its noise is calibrated to)"
        if spec in DP_BUILTINS else
        f"silo_epsilon applies to {', '.join(DP_BUILTINS)} only"))
  if spec in PLAIN:
    return AggregatorChoice(spec, spec, {})
  import tensorflow_federated as tff   # pylint: disable=g-import-not-at-top
  if spec == "robust":
    return AggregatorChoice(spec, tff.learning.robust_aggregator(weighted=True),
                            dict(zeroing=True, clipping=True, weighted=True))
  if spec == "compressed":
    encoded = tff.aggregators.EncodedSumFactory.quantize_above_threshold(
        quantization_bits=8, threshold=0)
    return AggregatorChoice(spec, tff.aggregators.MeanFactory(encoded),
                            dict(quantization_bits=8, threshold=0, weighted=True))
  if not (silo_delta is not None and 0 < silo_delta < 1):
    raise ValueError(f"aggregator={spec} needs silo_delta in (0, 1); got {silo_delta}")
  if not clip > 0:
    raise ValueError(f"aggregator={spec} needs a clip > 0; got {clip}")
  z = silo_noise_multiplier(silo_epsilon, rounds, silo_delta)
  dp = tff.aggregators.DifferentiallyPrivateFactory
  if spec == "dp_fixed":
    from tff_silo.privacy import user_level_factory  # pylint: disable=g-import-not-at-top
    factory = user_level_factory.DPMeanFactory(noise_multiplier=z,
                                               clients_per_round=num_silos, clip=clip)
  else:
    # The clipped-count query's noise std z (multiplier 2z: a count's sensitivity
    # is 1/2) leaves the values z / sqrt(3/4); together they compose to z.
    factory = dp.gaussian_adaptive(z, clients_per_round=num_silos,
                                   initial_l2_norm_clip=clip, clipped_count_stddev=z)
  return AggregatorChoice(spec, factory, dict(
      silo_epsilon=silo_epsilon, silo_delta=silo_delta, clip=clip,
      clip_kind="fixed" if spec == "dp_fixed" else "adaptive (median, initial clip)",
      clients_per_round=num_silos,
      **({} if spec == "dp_fixed" else dict(clipped_count_stddev=z))), z)


def user_factory(spec: str):
  """The `tff.aggregators` factory "module.path:callable" names: the attribute
  itself if it is a factory, else what calling it with no arguments returns."""
  import tensorflow_federated as tff   # pylint: disable=g-import-not-at-top
  module_name, _, attribute = spec.partition(":")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"aggregator {spec}: cannot import {module_name} ({e})") from None
  if not hasattr(module, attribute):
    raise ValueError(f"aggregator {spec}: {module_name} has no {attribute!r}")
  value = getattr(module, attribute)
  kinds = (tff.aggregators.WeightedAggregationFactory,
           tff.aggregators.UnweightedAggregationFactory)
  if not isinstance(value, kinds):
    if not callable(value):
      raise ValueError(f"aggregator {spec} is neither a tff.aggregators factory nor "
                       "callable")
    try:
      value = value()
    except TypeError as e:   # it needs arguments
      first = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise ValueError(f"aggregator {spec}: calling it with no arguments failed "
                       f"({first})") from None
  if not isinstance(value, kinds):
    raise ValueError(f"aggregator {spec} gave a {type(value).__name__}, not a "
                     "tff.aggregators factory")
  return value
