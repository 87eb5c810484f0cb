"""The vectorized backend: every silo's round as one TensorFlow program.

TFF's runtime runs each client's work as its own session call in a CPU-only worker
(measured: ~0.7 ms per client per intrinsic, no GPU). Here the silos' tensors
are stacked along a leading silo axis (padded to the largest silo, with each silo's
n_k, public size, noise multiplier and key kept apart) and a round of the MR-MTL
family is one `tf.function` on whatever device TensorFlow has. It computes what the
TFF process computes, from the same definitions: the round's logic
(`rounds.client_round`, `rounds.server_step`), the batch plan and the step's
gradient (`local_training.batch_plan`; without DP `step_gradient`, under DP its
`clipped_penalized_sum` and `noised_step`: `training`), and the same random numbers:
`tff_silo.batched_random` draws row k exactly as TF's stateless ops draw with silo
k's key, the DP noise is `privacy.gaussian.normal` of those keys (as the TFF process
draws it), and a padded silo's draw of N values starts with its own n values. Parity
with the TFF backend is tested in tests/backends/test_vectorized.py.

Padding: silo k's rows past n_k are never sampled (Poisson keeps only i < n_k;
permutations sort them last).

Gradients without DP: a step's batches are [K', b] (the K' silos within their
steps; b the widest, padded slots masked), through the model's `stacked_apply_fn`
(the CNN: each convolution a batched matmul of patches and filters) or
`step_gradient` mapped over silos. Under DP a
step's examples of all silos are one flat list (Poisson batches vary, so its length
is the sum of the batches, not K times the widest). A linear model's
(`linear_form_fn`) are clipped and summed from each example's slope and features
(`dp_sgd.clipped_linear_sums`, gradients never formed), in a function XLA
compiles even in an uncompiled round (the gathers, norms and per-silo sums fused;
chunk lengths rounded up to a few sizes, so few compilations). With the model's
`stacked_per_example_gradients_fn` (the CNN) the list is laid out one row per silo
and each silo's forward pass is one batched matmul per layer over its examples,
the per-example gradients kept factored (`dp_sgd.OuterProduct`: formed, or their
norms from Gram matrices, whichever the layer's shape makes cheaper; the clipped
sum one weighted matmul); otherwise each example gets its own copy of its silo's
weights. The clipped gradients are summed per silo. Memory:
about `WORKING_SET_STACKED` (or `WORKING_SET_PER_COPY`) x parameters floats per
example; when a step's examples would pass `MEMORY_BUDGET_FLOATS` they go through in
even chunks that fit (`chunk_examples`), one after another.

XLA (`programs.xla_rounds`, the binaries' --xla): every round (the MR-MTL family,
IFCA, Mocha, d-private clustering and the hypernetwork, whose rounds' users are
padded to a power of two and masked: `padded_ids`, and the pandemic forecaster)
compiles with `jit_compile=True`. Traced for
XLA, `train_silos` keeps shapes static: batches B wide, a Poisson sample as a mask
over the padded rows (the same sample: `PoissonSampler.kept_mask`), a DP step's
examples compacted to the front of a list of every (silo, slot) pair and taken in
chunks of `STATIC_CHUNK_EXAMPLES` until their count is covered (exact: no bound on
a batch, nothing truncated). Parity with the uncompiled rounds: tests/backends/
test_xla.py.

Modules: `stacking` (silos on a leading axis), `training` (`train_silos`: batches,
per-example gradients, DP noise), `programs` (the traced rounds, one per
definition; `RunStackingRunner`, what a runner whose runs stack shares), and one module per family's round and runner:
- `family`: local, FedAvg, finetune, MR-MTL and Ditto (`SiloAlgorithm`s) with the
  weighted or unweighted mean (`rounds.plain_mean`); runs stack (`stack_key`; the
  learning rate and lambda are tensors fed per run, `RunStack`).
- `clustered`: IFCA and its preconditioned methods (`ifca.ClusteredAlgorithm`s:
  cluster scores of all silos in one `vectorized_map`, the Gumbel noise of
  report-noisy-min from `batched_random.uniform64`) with the weighted mean; runs
  stack, each with its own G cluster models.
- `mocha`: Mocha (`MochaAlgorithm`: each run's Omega from a batched eigh, padded
  to the largest run); runs stack.
- `dprivate`: d-private clustered FL (`DPrivateClusteringAlgorithm`: the sampled
  users trained as stacked silos by `train_silos`, their updates sanitized at once,
  k-means stacked).
Other aggregators run on the TFF backend; each runner's `unsupported_reason` says so
in one line. The hypernetwork's round (`hypernet.vectorized`) uses `train_silos`.
"""
