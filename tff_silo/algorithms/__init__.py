"""Algorithms: definitions of the MR-MTL family and TFF iterative processes.

`<name>_algorithm(model, feature_shape, *, client_learning_rate, batch_size, ...,
aggregator=None)` for local, fedavg, finetune, mrmtl and ditto returns a TF-only
`SiloAlgorithm` (`rounds`); `build_<name>_process(...)` the TFF `SiloProcess` running
it (`process`); `tff_silo.simulation.run_simulation` runs either, on TFF's runtime or
the vectorized backend. IFCA and its preconditioned variants keep G cluster models
(`ifca_algorithm`, `build_ifca_process`: `ifca`); d-private clustered FL (Galli et
al.: `dprivate_clustering_algorithm`, `build_dprivate_clustering_process`) samples
users and sends sanitized models (`tff_silo.dprivate_simulation`); both run on
either backend too. `silo_definition(name, ...)` builds any of the MR-MTL family and
IFCA's variants by name (`by_name`).

Names load on first use (PEP 562), so a run that needs no TFF process never
imports TensorFlow Federated.
"""

import importlib

_WHERE = {
    "local_algorithm": "local", "build_local_process": "local",
    "fedavg_algorithm": "fedavg", "build_fedavg_process": "fedavg",
    "finetune_algorithm": "finetune", "build_finetune_process": "finetune",
    "mrmtl_algorithm": "mrmtl", "build_mrmtl_process": "mrmtl",
    "ditto_algorithm": "ditto", "build_ditto_process": "ditto",
    "ifca_algorithm": "ifca", "build_ifca_process": "ifca",
    "dprivate_clustering_algorithm": "dprivate_clustering",
    "build_dprivate_clustering_process": "dprivate_clustering",
    "LocalTrainingConfig": "local_training", "train_locally": "local_training",
    "SiloAlgorithm": "rounds", "SiloInput": "rounds",
    "ServerState": "process", "SiloProcess": "process",
    "silo_definition": "by_name",
}

ALGORITHMS = ("local", "fedavg", "finetune", "mrmtl", "ditto", "ifca",
              "dprivate_clustering")
__all__ = sorted(_WHERE) + ["ALGORITHMS"]


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
