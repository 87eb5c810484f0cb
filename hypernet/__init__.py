"""HyperNetFL (pFedHN, Shamsian et al. ICML'21) and its user-level DP variant UDP-Alg
(Nemala, Lai, Phan, CIKM'23) on TensorFlow Federated."""

from hypernet.network import Hypernetwork, default_embedding_dim
from hypernet.process import HypernetProcess, build_hypernet_process
from hypernet.simulation import HypernetResult, run_hypernet, sample_users
