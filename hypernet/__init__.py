"""HyperNetFL (pFedHN, Shamsian et al. ICML'21) and its user-level DP variant UDP-Alg
(Nemala, Lai, Phan, CIKM'23): the definition (`hypernet_algorithm`, which registers
its runners with `tff_silo.runner`), its TFF process (`hypernet.process.process_for`),
the vectorized round (`hypernet.vectorized`), the driver (`run_hypernet`, either
backend) and one run from its hyperparameters (`train`).

Names load on first use (PEP 562), so a vectorized run never imports TensorFlow
Federated.
"""

import importlib

_WHERE = {
    "Hypernetwork": "network", "default_embedding_dim": "network",
    "from_saved_run": "network",
    "HypernetAlgorithm": "algorithm", "hypernet_algorithm": "algorithm",
    "HypernetProcess": "process",
    "HypernetResult": "simulation", "run_hypernet": "simulation",
    "sample_users": "simulation",
    "train": "training",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
