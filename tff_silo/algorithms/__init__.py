"""Algorithms as TFF iterative processes with stateful clients.

Every `build_<name>_process(model, feature_shape, *, client_learning_rate, batch_size,
..., aggregator=None)` returns a `SiloProcess` (`tff_silo.simulation` runs it); they
differ only in what the shared local-training routine is given and what is kept (see
`process`; IFCA and its preconditioned variants keep G cluster models, see `ifca`).
`build_dprivate_clustering_process` (Galli et al.) samples users and sends sanitized
models instead; `tff_silo.dprivate_simulation` runs it.
"""

from tff_silo.algorithms.ditto import build_ditto_process
from tff_silo.algorithms.dprivate_clustering import build_dprivate_clustering_process
from tff_silo.algorithms.fedavg import build_fedavg_process
from tff_silo.algorithms.finetune import build_finetune_process
from tff_silo.algorithms.ifca import build_ifca_process
from tff_silo.algorithms.local import build_local_process
from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
from tff_silo.algorithms.mrmtl import build_mrmtl_process
from tff_silo.algorithms.process import ServerState, SiloInput, SiloProcess

ALGORITHMS = ("local", "fedavg", "finetune", "mrmtl", "ditto", "ifca",
              "dprivate_clustering")
