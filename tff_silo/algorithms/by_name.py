"""Any definition of the MR-MTL family, Mocha or IFCA by its name (its entry in
`methods.REGISTRY`): the one place the benchmark binaries (`benchmarks.run`,
`benchmarks.compare`) turn settings into a `SiloAlgorithm`, `MochaAlgorithm` or
`ClusteredAlgorithm`."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Optional

from tff_silo.algorithms import ifca, mocha
from tff_silo.algorithms.methods import REGISTRY, SILO_KINDS


def silo_definition(name: str, model, feature_shape, *, client_learning_rate: float,
                    batch_size: int, rounds: int, lam: float = 0.0,
                    l2_norm_clip: Optional[float] = None, local_epochs: int = 1,
                    sampling: str = "poisson", aggregator=None,
                    finetune_fraction: Optional[float] = None,
                    num_clusters: Optional[int] = None,
                    selection_fraction: Optional[float] = None,
                    selection_budget_share: Optional[float] = None,
                    cluster_init_seed: int = 0, num_silos: Optional[int] = None,
                    noise: str = "integer"):
  """The TF-only definition of method `name` (one of `methods.SILO_NAMES`) for
  `rounds` rounds.

  `lam` is used by the methods with a lambda (`methods.LAMBDA_NAMES`) only,
  `finetune_fraction` by the finetuning methods, the cluster settings and
  `cluster_init_seed` (of the G initial cluster models) by IFCA's, `num_silos` (the
  run's K) by Mocha, which needs it; None keeps the algorithm's default. The MR-MTL
  family and Mocha start from the model's initial weights of seed 0 whatever the
  run's seed, so a sweep's seeds stack into one program. `noise`: DP-SGD's
  mechanism, `integer` or `idealized` (`local_training.NOISE_MECHANISMS`)."""
  definition = _definition(name, model, feature_shape, client_learning_rate,
                           batch_size, rounds, lam, l2_norm_clip, local_epochs, sampling,
                           aggregator, finetune_fraction, num_clusters,
                           selection_fraction, selection_budget_share,
                           cluster_init_seed, num_silos)
  return dataclasses.replace(definition,
                             config=dataclasses.replace(definition.config, noise=noise))


def _definition(name, model, feature_shape, client_learning_rate, batch_size, rounds,
                lam, l2_norm_clip, local_epochs, sampling, aggregator, finetune_fraction,
                num_clusters, selection_fraction, selection_budget_share,
                cluster_init_seed, num_silos):
  method = REGISTRY.get(name)
  if method is None or method.kind not in SILO_KINDS:
    known = ", ".join(n for n, m in REGISTRY.items() if m.kind in SILO_KINDS)
    raise ValueError(f"unknown method {name!r}; one of {known}")
  if not method.aggregated and aggregator not in (None, "mean"):
    raise ValueError(f"aggregator: {name} has no server mean to aggregate with "
                     f"(None or 'mean', the default), got {aggregator!r}")
  if method.kind == "mocha":
    if num_silos is None:
      raise ValueError(f"num_silos: {name} needs the number of silos it relates")
    return mocha.mocha_algorithm(
        model, feature_shape, num_silos=num_silos,
        client_learning_rate=client_learning_rate, batch_size=batch_size, lam=lam,
        local_epochs=local_epochs, l2_norm_clip=l2_norm_clip, sampling=sampling)
  common = dict(client_learning_rate=client_learning_rate, batch_size=batch_size,
                local_epochs=local_epochs, l2_norm_clip=l2_norm_clip, sampling=sampling,
                aggregator=aggregator)
  given = lambda **options: {k: v for k, v in options.items() if v is not None}
  if method.kind == "ifca":
    return ifca.ifca_algorithm(
        model, feature_shape, total_rounds=rounds, after=method.after,
        lam=lam if method.lam else 0.0, init_seed=cluster_init_seed,
        **given(num_clusters=num_clusters, selection_fraction=selection_fraction,
                selection_budget_share=selection_budget_share,
                finetune_fraction=finetune_fraction), **common)
  if method.lam:
    common["lam"] = lam
  if name == "finetune":
    common.update(total_rounds=rounds, **given(fedavg_fraction=finetune_fraction))
  module = importlib.import_module(f"tff_silo.algorithms.{method.module}")
  return getattr(module, f"{method.module}_algorithm")(model, feature_shape, **common)
