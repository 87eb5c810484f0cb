"""The `cnn_share` speed part, run in a child of this binary: this machine's float32
GEMM rate, a DP MR-MTL round of CNN silos and the useful FLOP/s it reaches as a
share of that rate, beside the same network's plain step and round, the round
XLA-compiled, and where a DP step's time goes."""

from __future__ import annotations

import json
import statistics
import time

from benchmarks import common
from benchmarks.speed import fresh
from benchmarks.speed.in_process import random_image_silos

# The cnn_share part's DP CNN workloads: (name, silos, images per silo, image
# shape, channels, hidden, batch); the digits as `benchmarks.run`'s default.
CNN_WORKLOADS = (("digits", 40, None, (8, 8, 1), (32, 64), None, 16),
                 ("fmnist_sized", 10, 1500, (28, 28, 1), (16, 32), 64, 64))
GEMM_SIZE = 2048
# Timed rounds of each cnn_share workload (after a traced one; one under XLA).
CNN_TIMED_ROUNDS = 5


def _median_seconds(call, repeats: int) -> float:
  """The median time of `repeats` calls of `call`, after one untimed."""
  call()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _gemm_flops_per_second(repeats=10) -> float:
  """This machine's float32 GEMM rate: the median of `repeats` timed 2048^3
  matmuls (2 n^3 FLOPs each), after one untimed."""
  import tensorflow as tf
  a = tf.random.normal([GEMM_SIZE, GEMM_SIZE])
  matmul = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
  return 2 * GEMM_SIZE ** 3 / _median_seconds(lambda: matmul(a).numpy(), repeats)


def _plain_step_seconds(model, shape, examples: int, repeats=10) -> float:
  """The median time of `model`'s plain training step (one model's gradient of
  its batch loss, no DP) on `examples` random images, after one untimed."""
  import tensorflow as tf
  weights = [tf.constant(w) for w in model.initial_weights(0)]
  x = tf.random.stateless_uniform([examples, *shape], seed=[0, 0])
  y = tf.cast(tf.random.stateless_uniform([examples], [0, 1], 0, 10, tf.int32),
              tf.float32)

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = model.batch_loss(weights, x, y)
    return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(loss, weights)])

  return _median_seconds(lambda: step(x, y).numpy(), repeats)


def _step_pieces_ms(model, shape, num_silos: int, batch: int, repeats=10) -> dict:
  """Where a DP step of `num_silos` silos x `batch` random images goes, each piece
  the median of `repeats` calls (ms): the silos' stacked models' gradient without
  DP (`stacked_plain`); their clipped penalized sums under DP (`clipped`); the
  same with every silo padded to the widest of a Poisson step (`clipped_padded`,
  the median widest of 200 draws); one step's noise (`noise`)."""
  import numpy as np
  import tensorflow as tf
  from tff_silo.privacy import dp_sgd, gaussian
  weights = [tf.constant(np.stack([w] * num_silos)) for w in model.initial_weights(0)]
  penalty = [0.01 * w for w in weights]

  def data(width):
    x = tf.random.stateless_uniform([num_silos, width, *shape], seed=[0, 0])
    y = tf.random.stateless_uniform([num_silos, width], [0, 1], 0, 10, tf.int32)
    return x, tf.cast(y, tf.float32), tf.ones([num_silos, width])

  @tf.function
  def stacked_plain(x, y, mask):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = tf.reduce_sum(model.loss_fn(model.stacked_apply_fn(weights, x), y) * mask)
    return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(loss, weights)])

  @tf.function
  def clipped(x, y, mask):
    return tf.add_n([tf.reduce_sum(s) for s in dp_sgd.clipped_stacked_sums(
        model.stacked_per_example_gradients_fn(weights, x, y), penalty, mask, 1.0)])

  noise = tf.function(
      lambda key: tf.reduce_sum(gaussian.normal(key, model.num_parameters)))
  widest = int(np.median([np.random.default_rng(i).poisson(batch, num_silos).max()
                          for i in range(200)]))
  time_ms = lambda fn, *args: 1e3 * _median_seconds(lambda: fn(*args).numpy(), repeats)
  return dict(stacked_plain=time_ms(stacked_plain, *data(batch)),
              clipped=time_ms(clipped, *data(batch)),
              clipped_padded=time_ms(clipped, *data(widest)), widest=widest,
              noise=time_ms(noise, tf.zeros([num_silos, 2], tf.int32)))


def in_process():
  """The cnn_share part, run here: the GEMM rate, then for each workload a traced
  and `CNN_TIMED_ROUNDS` timed DP MR-MTL rounds (public sizes: a silo's steps times
  B examples expected) and their useful FLOP/s (`cnn.training_flops` per example);
  the same without DP, and XLA-compiled."""
  import numpy as np
  from tff_silo import algorithms, data, models
  from tff_silo.backends.vectorized import programs
  from tff_silo.models import cnn
  from tff_silo.privacy import PrivacyProtocol
  from tff_silo.simulation import run_simulation
  gemm = _gemm_flops_per_second()
  out = dict(gemm_gflops=gemm / 1e9, workloads={})
  for name, num_silos, per_silo, shape, channels, hidden, batch in CNN_WORKLOADS:
    silos = (data.load_rotated_masked_digits(num_silos=num_silos, seed=0)
             if per_silo is None
             else random_image_silos(name, num_silos, per_silo, 10, shape))
    model = models.small_cnn(shape, silos.num_classes, channels=channels, hidden=hidden)
    rounds = {}
    # The DP round, the same round without DP, and the DP round XLA-compiled: the
    # median of the rounds after the first (traced, or compiled, in it).
    for key, clip, xla in (("dp", 1.0, False), ("plain", None, False),
                           ("dp_xla", 1.0, True)):
      definition = algorithms.mrmtl_algorithm(
          model, shape, client_learning_rate=0.05, batch_size=batch, lam=1.0,
          l2_norm_clip=clip)
      privacy = dict(target_epsilon=4.0, target_delta=1e-5) if clip else {}
      with programs.xla_rounds(xla):
        rounds[key] = float(np.median(run_simulation(
            definition, silos, rounds=1 + (1 if xla else CNN_TIMED_ROUNDS),
            backend="vectorized", protocol=PrivacyProtocol(public_silo_sizes=True),
            **privacy).round_seconds[1:]))
    sizes = np.asarray(silos.train_sizes)
    examples = float(np.sum(np.maximum(1, sizes // batch) * np.minimum(batch, sizes)))
    seconds = rounds["dp"]
    achieved = examples * cnn.training_flops(shape, model.weight_shapes) / seconds
    step_examples = num_silos * batch   # a DP step's, as one batch
    plain_seconds = _plain_step_seconds(model, shape, step_examples)
    plain = step_examples * cnn.training_flops(shape, model.weight_shapes) / plain_seconds
    out["workloads"][name] = dict(round_seconds=seconds, examples=examples,
                                  gflops=achieved / 1e9, share_of_gemm=achieved / gemm,
                                  plain_share_of_gemm=plain / gemm,
                                  dp_over_plain=plain / achieved,
                                  plain_round_seconds=rounds["plain"],
                                  dp_over_plain_round=seconds / rounds["plain"],
                                  xla_round_seconds=rounds["dp_xla"],
                                  plain_step_ms=1e3 * plain_seconds,
                                  steps=float(np.max(np.maximum(1, sizes // batch))),
                                  **{f"step_{k}": v for k, v in _step_pieces_ms(
                                      model, shape, num_silos, batch).items()})
  out["peak_memory_mb"] = common.peak_memory_mb()
  print(json.dumps(out))


def part(s, add_row) -> None:
  """The part's rows, from a child that runs `in_process`."""
  del s
  seconds, result = fresh.speed_child("cnn_share part", "--cnn_share_child")
  for name, w in result["workloads"].items():
    add_row(part="cnn_share", backend="vectorized", device="cpu", repeat=0,
            workload=name, end_to_end_seconds=seconds,
            seconds_per_round_median=w["round_seconds"],
            examples_per_round=w["examples"], gflops=w["gflops"],
            gemm_gflops=result["gemm_gflops"], share_of_gemm=w["share_of_gemm"],
            plain_share_of_gemm=w["plain_share_of_gemm"],
            dp_over_plain=w["dp_over_plain"],
            plain_round_seconds=w["plain_round_seconds"],
            dp_over_plain_round=w["dp_over_plain_round"],
            xla_round_seconds=w["xla_round_seconds"],
            **{k: w[k] for k in w if k.startswith("step") or k == "plain_step_ms"},
            peak_memory_mb=result["peak_memory_mb"], rounds=1)
    print(f"cnn_share {name}: DP round {w['round_seconds']:.2f} s, "
          f"{w['gflops']:.2f} GFLOP/s useful = {w['share_of_gemm']:.1%} of the "
          f"GEMM rate ({result['gemm_gflops']:.1f} GFLOP/s; the plain step "
          f"{w['plain_share_of_gemm']:.1%}), dp_over_plain="
          f"{w['dp_over_plain']:.2f}; the round without DP "
          f"{w['plain_round_seconds']:.2f} s (DP round / it: "
          f"{w['dp_over_plain_round']:.2f}); the DP round XLA-compiled "
          f"{w['xla_round_seconds']:.2f} s; peak {result['peak_memory_mb']:.0f} MB",
          flush=True)
    print(f"  a DP step's pieces: one model's plain step {w['plain_step_ms']:.0f} ms; "
          f"the silos' stacked step without DP {w['step_stacked_plain']:.0f} ms; "
          f"clipped {w['step_clipped']:.0f} ms, padded to the widest silo "
          f"({w['step_widest']}) {w['step_clipped_padded']:.0f} ms; noise "
          f"{w['step_noise']:.0f} ms; the DP round's step "
          f"{1e3 * w['round_seconds'] / w['steps']:.0f} ms", flush=True)
