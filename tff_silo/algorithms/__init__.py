"""Algorithms: the TF-only definitions of every method (no TFF here).

`<name>_algorithm(model, feature_shape, *, client_learning_rate, batch_size, ...,
aggregator=None)` for local, fedavg, finetune, mrmtl and ditto returns a
`SiloAlgorithm` (`rounds`); Mocha learns the silos' relationship matrix beside their
models (`mocha_algorithm`: a `MochaAlgorithm`, `mocha`); IFCA and its preconditioned
variants keep G cluster models (`ifca_algorithm`: a `ClusteredAlgorithm`, `ifca`);
d-private clustered FL (Galli et al.: `dprivate_clustering_algorithm`) samples users
and sends sanitized models (`tff_silo.dprivate_simulation`). `silo_definition(name,
...)` builds any of the MR-MTL family, Mocha and IFCA's variants by name
(`by_name`; the names: `methods.REGISTRY`). Each definition type
registers its runners (`tff_silo.runner`): `tff_silo.simulation.run_simulation` runs
a definition on TFF's runtime (`tff_silo.backends.tff.process_for` builds its
process) or on the vectorized backend.

Names load on first use (PEP 562), so importing the package costs nothing.
"""

import importlib

from tff_silo.algorithms.methods import REGISTRY   # no TensorFlow

# The modules that define the registry's methods, each with its `<module>_algorithm`.
ALGORITHMS = tuple(dict.fromkeys(m.module for m in REGISTRY.values() if m.module))
_WHERE = {
    **{f"{module}_algorithm": module for module in ALGORITHMS},
    "LocalTrainingConfig": "local_training", "train_locally": "local_training",
    "SiloAlgorithm": "rounds", "SiloInput": "rounds",
    "silo_definition": "by_name",
}
__all__ = sorted(_WHERE) + ["ALGORITHMS"]


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
