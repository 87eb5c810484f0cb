"""A coordinate-wise trimmed mean as a `tff.aggregators.UnweightedAggregationFactory`:
the worked example of a new aggregator in `tff_silo/README.md` ("Writing a new
aggregator"), usable as `--aggregator=tff_silo.trimmed_mean:TrimmedMeanFactory`.

For every coordinate the server drops the floor(beta n) smallest and the
floor(beta n) largest of the n silos' values and averages the rest (Yin et al.,
ICML 2018, "Byzantine-robust distributed learning", Def. 2): with beta above the
share of misbehaving silos, no single silo moves a coordinate beyond the range of
the honest ones. It needs every silo's value at the server, so it is built from
`tff.federated_aggregate` whose accumulator stacks the values (a tensor of unknown
leading dimension per leaf) and whose report sorts them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class TrimmedMeanFactory(tff.aggregators.UnweightedAggregationFactory):
  """Coordinate-wise beta-trimmed mean of the silos' float tensors."""

  def __init__(self, trim_fraction: float = 0.2):
    if not 0 <= trim_fraction < 0.5:
      raise ValueError(f"trim_fraction must be in [0, 0.5); got {trim_fraction}")
    self._trim_fraction = float(trim_fraction)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    leaves = tff.structure.flatten(value_type)
    if not all(isinstance(t, tff.TensorType) and t.dtype == np.float32
               for t in leaves):
      raise TypeError(f"TrimmedMeanFactory averages float32 tensors; got {value_type}")
    shapes = [list(t.shape) for t in leaves]
    beta = self._trim_fraction
    flatten = lambda value: (tf.nest.flatten(value) if not isinstance(
        value, tff.structure.Struct) else tff.structure.flatten(value))

    @tff.tensorflow.computation
    def zero():
      # no silo yet: every leaf a stack of 0 values, of unknown length
      return [tf.compat.v1.placeholder_with_default(tf.zeros([0, *s]), [None, *s])
              for s in shapes]

    stacked = zero.type_signature.result

    @tff.tensorflow.computation(stacked, value_type)
    def accumulate(stack, value):
      return [tf.concat([a, v[tf.newaxis]], 0) for a, v in zip(stack, flatten(value))]

    @tff.tensorflow.computation(stacked, stacked)
    def merge(a, b):
      return [tf.concat([x, y], 0) for x, y in zip(a, b)]

    @tff.tensorflow.computation(stacked)
    def report(stack):
      out = []
      for values in stack:
        n = tf.shape(values)[0]
        k = tf.cast(tf.floor(beta * tf.cast(n, tf.float32)), tf.int32)
        kept = tf.sort(values, axis=0)[k:n - k]
        out.append(tf.reduce_mean(kept, axis=0))
      return out

    @tff.tensorflow.computation(report.type_signature.result)
    def repack(leaves_out):
      return tff.types.type_to_py_container(
          tff.structure.pack_sequence_as(value_type, leaves_out)
          if isinstance(value_type, tff.StructType) else leaves_out[0], value_type)

    @tff.federated_computation()
    def initialize():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      trimmed = tff.federated_aggregate(value, zero(), accumulate, merge, report)
      return tff.templates.MeasuredProcessOutput(
          state=state, result=tff.federated_map(repack, trimmed),
          measurements=tff.federated_value((), tff.SERVER))

    return tff.templates.AggregationProcess(initialize, next_fn)
