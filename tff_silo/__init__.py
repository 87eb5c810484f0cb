"""tff_silo: private, personalized cross-silo federated learning on TFF 0.87.

Architecture. Layers, highest first; a module imports only from layers below it
(declared in pyproject.toml's [tool.importlinter], checked by `lint-imports` in CI):

  pandemic/            the pandemic forecasting pipeline (thesis ch. 2)
  runs                 saved runs (weights, recipe, privacy) for attacks
  dprivate_simulation  the driver of d-private clustered FL (user sampling, leakage)
  sharding             one run's silos split across shards (processes, machines)
  simulation           the silo-trained families' driver: calibrates, runs a
                       runner for T rounds, charges ledgers, evaluates every silo
  driver, evaluation   the one round loop every driver runs (participation
                       policies, `RunResult`); per-silo evaluation
  backends/            the runtimes: tff/ (TFF processes, the reference) and
                       vectorized/ (every silo's round as one TF program)
  algorithms/          the definitions, TF only: local, FedAvg, finetune, MR-MTL,
                       Ditto (`SiloAlgorithm`), Mocha (`MochaAlgorithm`), IFCA
                       (`ClusteredAlgorithm`), d-private clustering; local
                       training, one round's logic
  aggregators          `tff.aggregators` factories by name, for the server step
  runner               the runner protocol and the registry: definition -> runner
  runtime, theory,     TFF worker clean-up; the mean-estimation closed forms (thesis
  trimmed_mean         sec. 1.6); a trimmed-mean factory
  models/, data/       functional models (weights as tuples of tensors); per-silo
                       arrays, loaders, generators, DP preprocessing
  privacy/             mechanisms and accounting: DP-SGD, ledgers, calibration,
                       protocols, node- and user-level DP, tuning; the batching
                       arithmetic accounting and training share
  keys, bundles        every random key of a run, in one tree; rounds recorded into
                       a portable bundle, or its replayed results fed back
  batched_random, xla, TF's stateless draws for many keys at once; XLA's kernel
  pjrt, xla_bundle     coverage; rounds run by a PJRT client of jaxlib; the bundle
                       format and its standalone runner (numpy and jaxlib only)

The add-ons `hypernet` (HyperNetFL, UDP-Alg) and `attacks` build on the library;
`benchmarks` (the binaries) on all of them; the library imports none of them.

The runner protocol (`runner.Runner`): `prepare(silo inputs)`, `initialize()`,
`initial_client_states(state, K)`, `next(state, client states, data)`,
`evaluation_weights` (a `runner.SiloModels`: slices of the rounds' stacked results),
`server_models`, `cluster_assignments`, `num_selections`,
and the attributes name, model, config, epochs_per_round, num_clusters,
selection_budget_share. Each definition type registers one runner per backend
(`runner.register`); the drivers ask `runner.runner_for(definition, backend)`.

Adding an algorithm, as Mocha was:
1. its definition in `algorithms/` (a frozen dataclass, TF only, with what a round
   computes as functions of tensors, citing the paper's equation), and its
   `<name>_algorithm(...)` builder (`algorithms/mocha.py`);
2. its round on each backend, both calling the definition's functions: a TFF
   process in `backends/tff/` (`backends/tff/mocha.py`), a stacked round and runner
   in `backends/vectorized/` (`backends/vectorized/mocha.py`; `RunStackingRunner`
   lets a sweep's runs share its program);
3. `runner.register(Definition, tff="...", vectorized="...")` beside the
   definition; tests against an independent computation and of the two backends'
   parity (`tests/algorithms/test_mocha.py`);
4. its entry in `algorithms.methods.REGISTRY` (a member of the MR-MTL family needs
   nothing else: `algorithms.by_name` builds it for the binaries; a new kind, a
   branch there).
"""

__version__ = "0.1.0"
